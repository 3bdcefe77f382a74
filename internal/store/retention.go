package store

import (
	"context"
	"fmt"
	"time"
)

// Bounds of the storage sweep.
const (
	// SweepBatch bounds the read items one RemoveReadBefore transaction
	// deletes, so a sweep never holds the write lock for long.
	SweepBatch = 500
	// shrinkMinFreePages: Shrink returns free pages to the file system only
	// once this many are free (4 MiB of 4 KiB pages): small removals leave
	// pages for the next writes to reuse.
	shrinkMinFreePages = 1024
	// shrinkStep bounds the pages one incremental_vacuum step frees, so
	// other writers get the lock between steps.
	shrinkStep = 2048
	// walLimitBytes is the size a checkpoint truncates the WAL file to
	// (journal_size_limit): a burst of writes does not leave it large.
	walLimitBytes = 4 << 20
)

// removeReadSQL deletes up to ? read items created before ?, except the
// latest status of a journaled manifest: a resend of its id must still
// get that status back.
const removeReadSQL = `DELETE FROM items WHERE seq IN (
	SELECT i.seq FROM items i WHERE i.read = 1 AND i.created_at < ?
	AND NOT EXISTS (SELECT 1 FROM journal j WHERE j.sandbox = i.sandbox AND j.status_seq = i.seq)
	ORDER BY i.seq LIMIT ?)`

// RemoveReadBefore deletes read items created before cutoff, at most
// SweepBatch per transaction, and reports how many it removed. Unread
// items are never removed (the inbox quota bounds them), nor a journaled
// manifest's latest status.
func (s *Store) RemoveReadBefore(ctx context.Context, cutoff time.Time) (int64, error) {
	var total int64
	for {
		var n int64
		err := s.withTx(ctx, func(w *writer, _ *cacheUpdate) error {
			res, err := w.conn.ExecContext(ctx, removeReadSQL, cutoff.UnixMilli(), SweepBatch)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		total += n
		if err != nil || n < SweepBatch {
			return total, err
		}
	}
}

// Shrink gives the file system back broker.db's free pages once there
// are many (after large removals: a destroyed sandbox's inbox, a sweep),
// in bounded steps, then checkpoints the WAL so the file shrinks.
func (s *Store) Shrink(ctx context.Context) error {
	ctx = detach(ctx)
	var free int64
	if err := s.db.QueryRowContext(ctx, "PRAGMA freelist_count").Scan(&free); err != nil {
		return err
	}
	if free < shrinkMinFreePages {
		return nil
	}
	for free > 0 {
		if err := s.vacuumStep(ctx); err != nil {
			return err
		}
		left := free
		if err := s.db.QueryRowContext(ctx, "PRAGMA freelist_count").Scan(&left); err != nil {
			return err
		}
		if left >= free {
			break // no progress: never spin
		}
		free = left
	}
	_, err := s.db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
	return err
}

// vacuumStep frees up to shrinkStep pages on the writer connection.
func (s *Store) vacuumStep(ctx context.Context) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.w.conn.ExecContext(ctx, fmt.Sprintf("PRAGMA incremental_vacuum(%d)", shrinkStep))
	return err
}
