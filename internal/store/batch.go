package store

import (
	"context"
)

// Shared commits. A COMMIT writes every page its transaction changed to
// the -wal file; deliveries to one inbox change mostly the same pages. So
// while a sync runs (durable.go), a delivery does not commit: it stays in
// the open write transaction, in a savepoint of its own, and the first of
// those waiting to commit it once the sync ends commits them all. A writer
// that fails undoes only its savepoint; a failed COMMIT fails every writer
// in it. Only withSharedTx writers wait this way; any other write commits
// the open transaction with its own.
//
// The unread totals the quota checks read are the writers' view: a
// writer's changes apply to them when its savepoint succeeds, so the next
// writer in the same transaction counts them. The unread inboxes, which
// readers see, change only at COMMIT.

// batch is the open write transaction and the writers in it.
type batch struct {
	writers int            // that ran in it
	updates []*cacheUpdate // of each writer that succeeded, in order
	done    chan struct{}  // closed once committed or rolled back
	index   uint64         // the COMMIT's index; set before done closes
	err     error
}

// openBatch returns the open transaction, beginning one if none is.
// Call with s.wmu held.
func (s *Store) openBatch(ctx context.Context) (*batch, error) {
	if s.open != nil {
		return s.open, nil
	}
	if _, err := s.w.conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return nil, err
	}
	s.open = &batch{done: make(chan struct{})}
	return s.open, nil
}

// runSavepoint runs fn in a savepoint of the open transaction. ferr is
// fn's error (its writes undone); err a failure of the savepoint itself,
// after which the transaction cannot be trusted.
func (s *Store) runSavepoint(ctx context.Context, fn func(*writer, *cacheUpdate) error, cu *cacheUpdate) (ferr, err error) {
	if _, err := s.w.conn.ExecContext(ctx, "SAVEPOINT w"); err != nil {
		return nil, err
	}
	if ferr = fn(&s.w, cu); ferr != nil {
		if _, err := s.w.conn.ExecContext(ctx, "ROLLBACK TO w"); err != nil {
			return ferr, err
		}
	}
	_, err = s.w.conn.ExecContext(ctx, "RELEASE w")
	return ferr, err
}

// join adds a writer that succeeded to the open transaction.
func (s *Store) join(b *batch, cu *cacheUpdate) {
	s.applyTotals(cu)
	b.updates = append(b.updates, cu)
}

// commitBatch commits the open transaction (rolls it back when no writer
// in it succeeded) and tells its writers. Call with s.wmu held.
func (s *Store) commitBatch(ctx context.Context) (uint64, error) {
	b := s.open
	s.open = nil
	if len(b.updates) == 0 {
		_, err := s.w.conn.ExecContext(ctx, "ROLLBACK")
		s.finish(b, s.dur.seen(), err)
		return b.index, err
	}
	index := s.dur.commitStarted()
	for _, cu := range b.updates {
		if cu.sandboxesChanged {
			s.cmu.Lock()
			s.sandboxesAt = index
			s.cmu.Unlock()
			break
		}
	}
	_, err := s.w.conn.ExecContext(ctx, "COMMIT")
	s.dur.commitDone()
	if err != nil {
		s.w.conn.ExecContext(ctx, "ROLLBACK")
		s.forgetTotals()
		s.finish(b, index, err)
		return index, err
	}
	for _, cu := range b.updates {
		s.applyInboxes(cu)
	}
	s.finish(b, index, nil)
	return index, nil
}

// abortBatch rolls the open transaction back after a savepoint failed,
// failing every writer in it. Call with s.wmu held.
func (s *Store) abortBatch(ctx context.Context, err error) {
	b := s.open
	s.open = nil
	s.w.conn.ExecContext(ctx, "ROLLBACK")
	s.forgetTotals()
	s.finish(b, s.dur.seen(), err)
}

func (s *Store) finish(b *batch, index uint64, err error) {
	s.dur.signal(func() {
		b.index, b.err = index, err
		close(b.done)
	})
}

// awaitCommit returns once b is committed: when no sync runs, the first
// writer to see it commits it.
func (s *Store) awaitCommit(b *batch) (uint64, error) {
	for {
		if err := s.dur.waitIdle(b.done); err != nil {
			return 0, err
		}
		select {
		case <-b.done:
			return b.index, b.err
		default:
		}
		s.wmu.Lock()
		if s.open == b {
			s.commitBatch(context.Background())
		}
		s.wmu.Unlock()
	}
}
