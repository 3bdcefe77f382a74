package store

import "context"

// preparedTable records the one-shot setup steps a sandbox has run to
// success (the spec's "prepare is tracked per service/container"): a
// restart runs only the missing ones. Its rows go with the sandbox.
const preparedTable = `
CREATE TABLE IF NOT EXISTS prepared (
	sandbox TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
	step    TEXT NOT NULL,
	PRIMARY KEY (sandbox, step)
) WITHOUT ROWID;`

// SetStartup records a child's selection of services and autostart
// profile (JSON, orchestrate's).
func (s *Store) SetStartup(ctx context.Context, name, startup string) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET startup = ? WHERE name = ?`, startup, name)
}

// Prepared lists the setup steps sandbox name has run to success.
func (s *Store) Prepared(ctx context.Context, name string) (_ map[string]bool, err error) {
	rows, err := s.db.QueryContext(detach(ctx), `SELECT step FROM prepared WHERE sandbox = ?`, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	done := map[string]bool{}
	for rows.Next() {
		var step string
		if err := rows.Scan(&step); err != nil {
			return nil, err
		}
		done[step] = true
	}
	return done, rows.Err()
}

// SetPrepared records that sandbox name ran setup step to success.
func (s *Store) SetPrepared(ctx context.Context, name, step string) error {
	return s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		_, err := w.conn.ExecContext(ctx, `INSERT OR IGNORE INTO prepared (sandbox, step) VALUES (?, ?)`, name, step)
		return err
	})
}
