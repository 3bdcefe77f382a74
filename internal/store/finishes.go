package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"agentbox/internal/wire"
)

// Finish is a child's accepted done report waiting for its orchestrator
// (stopped, its inbox full, or older reports ahead of it): the report is
// imported and delivered when the orchestrator can take it, in the order
// reports were accepted.
type Finish struct {
	Seq        int64
	Child      string // the reporting child
	Parent     string // its orchestrator
	ManifestID string // the child's manifest id
	Head       string // HEAD the report recorded
	Branch     string
	Kind, Body string
	InReplyTo  *string
}

// QueueFinish records f and gives the manifest BeginManifest journaled its
// first status, queued with detail (stored read: the send's reply carries
// it), and records f.Head as the child's done_head (no cleanup yet), in
// one transaction: the report is accepted exactly when this commits.
func (s *Store) QueueFinish(ctx context.Context, f Finish, detail string) (Sent, error) {
	var out Sent
	err := s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		if _, _, err := journalLookup(ctx, w.journalGet, f.Child, f.ManifestID); !errors.Is(err, ErrDuplicate) {
			if err == nil {
				err = errors.New("the id is not journaled without a status")
			}
			return fmt.Errorf("queue finish: %w", err)
		}
		if _, err := w.conn.ExecContext(ctx, `INSERT INTO finishes (child, parent, manifest_id, head, branch, kind, body, in_reply_to, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, f.Child, f.Parent, f.ManifestID, f.Head, f.Branch, f.Kind, f.Body, f.InReplyTo, now()); err != nil {
			return fmt.Errorf("queue finish: %w", err)
		}
		if _, err := w.conn.ExecContext(ctx, `UPDATE sandboxes SET done_head = ?, cleanup = 0 WHERE name = ?`, f.Head, f.Child); err != nil {
			return fmt.Errorf("queue finish: record done head: %w", err)
		}
		cu.sandboxesChanged = true
		st, err := insertItem(ctx, w, cu, f.Child, wire.ItemStatus, f.ManifestID, true, statusDoc(f.ManifestID, wire.StateQueued, detail), nil)
		if err != nil {
			return fmt.Errorf("queue finish: status: %w", err)
		}
		if _, err := w.journalSetSt.ExecContext(ctx, st.Seq, f.Child, f.ManifestID); err != nil {
			return fmt.Errorf("queue finish: journal: %w", err)
		}
		out = Sent{Status: st, Fresh: true}
		return nil
	})
	return out, err
}

// Finishes lists the pending finishes for parent, oldest first.
func (s *Store) Finishes(ctx context.Context, parent string) (_ []Finish, err error) {
	defer s.settle(&err)
	rows, err := s.db.QueryContext(ctx, `SELECT seq, child, parent, manifest_id, head, branch, kind, body, in_reply_to
		FROM finishes WHERE parent = ? ORDER BY seq`, parent)
	if err != nil {
		return nil, fmt.Errorf("list finishes: %w", err)
	}
	defer rows.Close()
	var out []Finish
	for rows.Next() {
		var f Finish
		var inReplyTo sql.NullString
		if err := rows.Scan(&f.Seq, &f.Child, &f.Parent, &f.ManifestID, &f.Head, &f.Branch, &f.Kind, &f.Body, &inReplyTo); err != nil {
			return nil, fmt.Errorf("list finishes: %w", err)
		}
		if inReplyTo.Valid {
			f.InReplyTo = &inReplyTo.String
		}
		out = append(out, f)
	}
	return out, rows.Err()
}

// PendingFinish returns the manifest id of child's pending finish, if it
// has one.
func (s *Store) PendingFinish(ctx context.Context, child string) (_ string, found bool, err error) {
	defer s.settle(&err)
	var id string
	err = s.db.QueryRowContext(detach(ctx), `SELECT manifest_id FROM finishes WHERE child = ? ORDER BY seq LIMIT 1`, child).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("pending finish: %w", err)
	}
	return id, true, nil
}

// FinishParents lists the orchestrators that have pending finishes.
func (s *Store) FinishParents(ctx context.Context) (_ []string, err error) {
	defer s.settle(&err)
	rows, err := s.db.QueryContext(ctx, `SELECT DISTINCT parent FROM finishes ORDER BY parent`)
	if err != nil {
		return nil, fmt.Errorf("list finish parents: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("list finish parents: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// RefuseFinish ends a pending finish that can never be delivered (its
// orchestrator vanished): the row goes and the child's manifest gets a
// refused status, unread, in one transaction. The child keeps done_head
// cleared: its report was not taken.
func (s *Store) RefuseFinish(ctx context.Context, f Finish, detail string) error {
	return s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		res, err := w.conn.ExecContext(ctx, `DELETE FROM finishes WHERE seq = ?`, f.Seq)
		if err != nil {
			return fmt.Errorf("refuse finish: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err // finished or refused already
		}
		if _, err := w.conn.ExecContext(ctx, `UPDATE sandboxes SET done_head = '', cleanup = 0 WHERE name = ?`, f.Child); err != nil {
			return fmt.Errorf("refuse finish: %w", err)
		}
		cu.sandboxesChanged = true
		st, err := insertItem(ctx, w, cu, f.Child, wire.ItemStatus, f.ManifestID, false, statusDoc(f.ManifestID, wire.StateRefused, detail), nil)
		if err != nil {
			return fmt.Errorf("refuse finish: status: %w", err)
		}
		_, err = w.journalSetSt.ExecContext(ctx, st.Seq, f.Child, f.ManifestID)
		return err
	})
}
