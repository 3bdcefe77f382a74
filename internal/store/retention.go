package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"agentbox/internal/wire"
)

// Bounds of the storage sweep.
const (
	// SweepBatch bounds the items one RemoveReadBefore transaction looks
	// at, so a sweep never holds the write lock for long.
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

// Items are written in seq order with the time they were written, so
// the items created before a cutoff are (clock steps aside) a prefix of
// seq order: a sweep walks that prefix from its start and stops at the
// first younger item, never reading the rest of the table.
const (
	oldItemsSQL = `SELECT seq, created_at FROM items WHERE seq > ? ORDER BY seq LIMIT ?`
	// removeReadSQL deletes the read items of a seq range except the
	// latest status of a journaled manifest: a resend of its id must still
	// get that status back.
	removeReadSQL = `DELETE FROM items WHERE seq > ? AND seq <= ? AND read = 1
	AND seq NOT IN (SELECT status_seq FROM journal WHERE status_seq > ? AND status_seq <= ?)`
)

// RemoveReadBefore deletes read items created before cutoff, looking at
// most SweepBatch items per transaction, and reports how many it removed.
// Unread items are never removed (the inbox quota bounds them), nor a
// journaled manifest's latest status.
func (s *Store) RemoveReadBefore(ctx context.Context, cutoff time.Time) (int64, error) {
	var total int64
	var after int64
	for {
		var n int64
		var done bool
		err := s.withTx(ctx, func(w *writer, _ *cacheUpdate) error {
			hi, young, err := oldPrefix(ctx, w, after, cutoff.UnixMilli())
			if err != nil || hi == after {
				done = true
				return err
			}
			res, err := w.conn.ExecContext(ctx, removeReadSQL, after, hi, after, hi)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			after, done = hi, young
			return err
		})
		total += n
		if err != nil || done {
			return total, err
		}
	}
}

// oldPrefix looks at up to SweepBatch items after seq after and returns
// the last seq before the first one created at or after cutoff (after
// itself when there is none), and whether it met such an item or the
// table's end: the sweep is then done.
func oldPrefix(ctx context.Context, w *writer, after, cutoff int64) (hi int64, done bool, err error) {
	rows, err := w.conn.QueryContext(ctx, oldItemsSQL, after, SweepBatch)
	if err != nil {
		return after, true, err
	}
	defer rows.Close()
	hi, seen := after, 0
	for rows.Next() {
		var seq, created int64
		if err := rows.Scan(&seq, &created); err != nil {
			return after, true, err
		}
		if created >= cutoff {
			return hi, true, nil
		}
		hi, seen = seq, seen+1
	}
	return hi, seen < SweepBatch, rows.Err()
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
	if s.open != nil {
		// Not inside deliveries' shared transaction: commit it first.
		if _, err := s.commitBatch(ctx); err != nil {
			return err
		}
	}
	_, err := s.w.conn.ExecContext(ctx, fmt.Sprintf("PRAGMA incremental_vacuum(%d)", shrinkStep))
	return err
}

// MaxJournaled bounds the finished manifests each sandbox's journal keeps
// (each with its latest status). Every fresh manifest id, even a refused
// one, journals a status, and the retention keeps a journaled manifest's
// latest status: without a bound a sandbox sending manifest after manifest
// (or spawning and destroying queued children) would grow broker.db, and
// the snapshot its status op reads, for ever. The spawn or last restart
// of each child that still exists is neither counted nor forgotten (`ls`
// shows its status; the children cap bounds them), nor is a manifest
// still under way (queued or started).
const MaxJournaled = 1024

// prunableSQL lists a sandbox's finished manifests past the newest
// MaxJournaled, newest first.
const prunableSQL = `SELECT j.manifest_id, j.status_seq FROM journal j JOIN items i ON i.seq = j.status_seq
	WHERE j.sandbox = ? AND json_valid(i.doc) AND json_extract(i.doc, '$.state') IN ('done', 'failed', 'refused')
	AND j.manifest_id NOT IN (SELECT json_extract(c.spawn_doc, '$.ref') FROM sandboxes c
		WHERE c.parent = j.sandbox AND json_valid(c.spawn_doc))
	ORDER BY j.status_seq DESC LIMIT -1 OFFSET ?`

// PruneJournals forgets, in each sandbox's journal, the finished
// manifests past the newest MaxJournaled, with their latest status (read
// or not), in transactions of at most SweepBatch manifests, and reports
// how many it forgot. A resend of a forgotten id is a new manifest.
func (s *Store) PruneJournals(ctx context.Context) (int64, error) {
	ctx = detach(ctx)
	var over []string
	rows, err := s.db.QueryContext(ctx, `SELECT sandbox FROM journal GROUP BY sandbox HAVING count(*) > ?`, MaxJournaled)
	if err != nil {
		return 0, err
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return 0, err
		}
		over = append(over, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	var total int64
	for _, name := range over {
		n, err := s.pruneJournal(ctx, name)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

type journaled struct {
	id  string
	seq int64
}

func (s *Store) pruneJournal(ctx context.Context, sandbox string) (int64, error) {
	rows, err := s.db.QueryContext(ctx, prunableSQL, sandbox, MaxJournaled)
	if err != nil {
		return 0, err
	}
	var old []journaled
	for rows.Next() {
		var j journaled
		if err := rows.Scan(&j.id, &j.seq); err != nil {
			rows.Close()
			return 0, err
		}
		old = append(old, j)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	var total int64
	for len(old) > 0 {
		batch := old[:min(len(old), SweepBatch)]
		old = old[len(batch):]
		// Every status of each manifest goes (its earlier ones, a spawn's
		// queued, would otherwise stay for the retention). They are found
		// before the write lock, by one walk over the sandbox's items: an
		// index over statuses by manifest would cost every send a page
		// write. While a manifest's journal row stands, a resend of its id
		// adds no status, so what is found here is all there is.
		statuses, err := statusSeqs(ctx, s.db, sandbox, batch)
		if err != nil {
			return total, err
		}
		err = s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
			for _, j := range batch {
				// Only while the journal still points at the status read.
				res, err := w.conn.ExecContext(ctx, `DELETE FROM journal WHERE sandbox = ? AND manifest_id = ? AND status_seq = ?`, sandbox, j.id, j.seq)
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil || n == 0 {
					if err != nil {
						return err
					}
					continue
				}
				for _, seq := range statuses[j.id] {
					if err := deleteItem(ctx, w, cu, sandbox, seq); err != nil {
						return err
					}
				}
				total++
			}
			return nil
		})
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// statusSeqs finds the seqs of the statuses of the batch's manifests in
// sandbox's inbox, by manifest id.
func statusSeqs(ctx context.Context, db *sql.DB, sandbox string, batch []journaled) (map[string][]int64, error) {
	ids := make([]string, len(batch))
	for i, j := range batch {
		ids[i] = j.id
	}
	list, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT seq, ref FROM items WHERE sandbox = ? AND type = 'status'
		AND ref IN (SELECT value FROM json_each(?))`, sandbox, string(list))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]int64{}
	for rows.Next() {
		var seq int64
		var ref string
		if err := rows.Scan(&seq, &ref); err != nil {
			return nil, err
		}
		out[ref] = append(out[ref], seq)
	}
	return out, rows.Err()
}

// deleteItem deletes the status seq of sandbox's inbox, keeping the
// unread cache in step.
func deleteItem(ctx context.Context, w *writer, cu *cacheUpdate, sandbox string, seq int64) error {
	var id string
	var read bool
	var size int64
	err := w.conn.QueryRowContext(ctx, `DELETE FROM items WHERE seq = ? AND sandbox = ? AND type = 'status'
		RETURNING id, read, length(CAST(doc AS BLOB))`, seq, sandbox).Scan(&id, &read, &size)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // removed meanwhile (the retention)
	}
	if err != nil {
		return err
	}
	if !read {
		cu.remove(sandbox, id, wire.ItemStatus, size)
	}
	return nil
}
