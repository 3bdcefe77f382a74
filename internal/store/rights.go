package store

import (
	"context"
	"fmt"
	"time"
)

// rightsTable holds each sandbox's rights, one row per item: who gave it
// (orchestration or by hand) and when it expires (0: never).
const rightsTable = `
CREATE TABLE IF NOT EXISTS rights (
	sandbox    TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
	kind       TEXT NOT NULL CHECK (kind IN ('mount','egress','loose')),
	item       TEXT NOT NULL,
	owner      TEXT NOT NULL CHECK (owner IN ('orchestration','hand')),
	expires_at INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (sandbox, kind, item)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rights_by_expiry ON rights(expires_at) WHERE expires_at > 0;`

// Right kinds.
const (
	RightMount  = "mount"
	RightEgress = "egress"
	RightLoose  = "loose" // its Item is ""
)

// Right owners.
const (
	OwnerOrchestration = "orchestration"
	OwnerHand          = "hand"
)

// Right is one item of a sandbox's rights.
type Right struct {
	Sandbox string
	Kind    string // RightMount, RightEgress or RightLoose
	Item    string // the mount name or egress host; "" for loose
	Owner   string // OwnerOrchestration or OwnerHand
	// Expires is when the right ends; zero: never.
	Expires time.Time
}

// Key names the item the way details show it: "loose", "mount aws",
// "egress pypi.org".
func (r Right) Key() string {
	if r.Kind == RightLoose {
		return RightLoose
	}
	return r.Kind + " " + r.Item
}

// Rights lists sandbox's rights by kind and item.
func (s *Store) Rights(ctx context.Context, sandbox string) ([]Right, error) {
	return s.queryRights(ctx, `SELECT sandbox, kind, item, owner, expires_at FROM rights
		WHERE sandbox = ? ORDER BY kind, item`, sandbox)
}

// ExpiredRights lists every right, of any sandbox, whose expiry is at or
// before t.
func (s *Store) ExpiredRights(ctx context.Context, t time.Time) ([]Right, error) {
	return s.queryRights(ctx, `SELECT sandbox, kind, item, owner, expires_at FROM rights
		WHERE expires_at > 0 AND expires_at <= ? ORDER BY sandbox, kind, item`, t.UnixMilli())
}

func (s *Store) queryRights(ctx context.Context, q string, arg any) (_ []Right, err error) {
	defer s.settle(&err)
	rows, err := s.db.QueryContext(ctx, q, arg)
	if err != nil {
		return nil, fmt.Errorf("list rights: %w", err)
	}
	defer rows.Close()
	var out []Right
	for rows.Next() {
		var r Right
		var exp int64
		if err := rows.Scan(&r.Sandbox, &r.Kind, &r.Item, &r.Owner, &exp); err != nil {
			return nil, fmt.Errorf("list rights: %w", err)
		}
		if exp > 0 {
			r.Expires = time.UnixMilli(exp)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// ChangeRights deletes del and writes put (insert or replace) in one
// transaction.
func (s *Store) ChangeRights(ctx context.Context, del, put []Right) error {
	return s.withTx(ctx, func(w *writer, _ *cacheUpdate) error {
		for _, r := range del {
			if _, err := w.conn.ExecContext(ctx, `DELETE FROM rights WHERE sandbox = ? AND kind = ? AND item = ?`,
				r.Sandbox, r.Kind, r.Item); err != nil {
				return fmt.Errorf("change rights: %w", err)
			}
		}
		for _, r := range put {
			var exp int64
			if !r.Expires.IsZero() {
				exp = r.Expires.UnixMilli()
			}
			if _, err := w.conn.ExecContext(ctx, `INSERT OR REPLACE INTO rights (sandbox, kind, item, owner, expires_at)
				VALUES (?, ?, ?, ?, ?)`, r.Sandbox, r.Kind, r.Item, r.Owner, exp); err != nil {
				return fmt.Errorf("change rights: %w", err)
			}
		}
		return nil
	})
}
