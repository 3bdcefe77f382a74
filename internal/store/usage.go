package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"agentbox/internal/wire"
)

// Usage is model usage: requests and tokens, as the upstream reported them.
type Usage = wire.Usage

// UsageRow is one sandbox's usage totals. Rows are keyed by UUID: a name
// reused after a destroy gets a row of its own, and a destroyed sandbox's
// row stays, so a tree's total stays true.
type UsageRow struct {
	Name string
	UUID string
	// Tree is the orchestrator at the root: an orchestrator's own name, a
	// child's orchestrator's name.
	Tree string
	Usage
	Updated time.Time // when usage was last added
}

// Tree is the name of sb's orchestrator tree, as usage rows record it:
// a child's orchestrator's name, otherwise its own.
func (sb Sandbox) Tree() string {
	if sb.Parent != "" {
		return sb.Parent
	}
	return sb.Name
}

// usageWindow is how long per-minute output buckets are kept: the longest
// window TreeOutputSince is asked about is an hour; a day leaves room.
const usageWindow = 24 * time.Hour

// usageTables are the usage totals per sandbox and each tree's output
// tokens per minute. No foreign keys: rows outlive their sandboxes.
const usageTables = `
CREATE TABLE IF NOT EXISTS usage (
	uuid                        TEXT PRIMARY KEY,
	name                        TEXT NOT NULL,
	tree                        TEXT NOT NULL,
	requests                    INTEGER NOT NULL DEFAULT 0,
	input_tokens                INTEGER NOT NULL DEFAULT 0,
	output_tokens               INTEGER NOT NULL DEFAULT 0,
	cache_read_input_tokens     INTEGER NOT NULL DEFAULT 0,
	cache_creation_input_tokens INTEGER NOT NULL DEFAULT 0,
	updated_at                  INTEGER NOT NULL
) WITHOUT ROWID;
-- minute is Unix seconds / 60.
CREATE TABLE IF NOT EXISTS tree_output (
	tree          TEXT NOT NULL,
	minute        INTEGER NOT NULL,
	output_tokens INTEGER NOT NULL,
	PRIMARY KEY (tree, minute)
) WITHOUT ROWID;`

// treeInputTable is each tree's input tokens per minute (uncached, cache
// writes and cache reads together), for model.max_input_tokens_per_hour.
// A table of its own, made when any database opens: no migration.
const treeInputTable = `
CREATE TABLE IF NOT EXISTS tree_input (
	tree         TEXT NOT NULL,
	minute       INTEGER NOT NULL,
	input_tokens INTEGER NOT NULL,
	PRIMARY KEY (tree, minute)
) WITHOUT ROWID;`

const (
	usageAddSQL = `INSERT INTO usage (uuid, name, tree, requests, input_tokens, output_tokens,
		cache_read_input_tokens, cache_creation_input_tokens, updated_at) VALUES (?,?,?,?,?,?,?,?,?)
	ON CONFLICT (uuid) DO UPDATE SET name = excluded.name, tree = excluded.tree,
		requests = requests + excluded.requests,
		input_tokens = input_tokens + excluded.input_tokens,
		output_tokens = output_tokens + excluded.output_tokens,
		cache_read_input_tokens = cache_read_input_tokens + excluded.cache_read_input_tokens,
		cache_creation_input_tokens = cache_creation_input_tokens + excluded.cache_creation_input_tokens,
		updated_at = excluded.updated_at`
	bucketAddSQL        = `UPDATE tree_output SET output_tokens = output_tokens + ? WHERE tree = ? AND minute = ?`
	bucketNewSQL        = `INSERT INTO tree_output (tree, minute, output_tokens) VALUES (?,?,?)`
	bucketPruneSQL      = `DELETE FROM tree_output WHERE minute < ?`
	inputBucketAddSQL   = `UPDATE tree_input SET input_tokens = input_tokens + ? WHERE tree = ? AND minute = ?`
	inputBucketNewSQL   = `INSERT INTO tree_input (tree, minute, input_tokens) VALUES (?,?,?)`
	inputBucketPruneSQL = `DELETE FROM tree_input WHERE minute < ?`
)

// inputTokens is what u counts against the input budget: every input
// token, cached or not.
func inputTokens(u Usage) int64 {
	return u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens
}

// minuteOf is the per-minute bucket t falls in.
func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// AddUsage adds u to sandbox (name, uuid)'s totals and its output and
// input tokens to tree's buckets of now's minute, in one transaction.
// Buckets older than a day are deleted when a new one is written (once a
// minute per active tree, so the common case is three updates).
func (s *Store) AddUsage(ctx context.Context, name, uuid, tree string, u Usage, now time.Time) error {
	return s.withTx(ctx, func(w *writer, _ *cacheUpdate) error {
		if _, err := w.usageAdd.ExecContext(ctx, uuid, name, tree, u.Requests, u.InputTokens, u.OutputTokens,
			u.CacheReadInputTokens, u.CacheCreationInputTokens, now.UnixMilli()); err != nil {
			return fmt.Errorf("add usage: %w", err)
		}
		if err := addToBucket(ctx, w.bucketAdd, w.bucketNew, w.bucketPrune, tree, u.OutputTokens, now); err != nil {
			return fmt.Errorf("add usage: %w", err)
		}
		if err := addToBucket(ctx, w.inputBucketAdd, w.inputBucketNew, w.inputBucketPrune, tree, inputTokens(u), now); err != nil {
			return fmt.Errorf("add usage: input: %w", err)
		}
		return nil
	})
}

// addToBucket adds n tokens to tree's bucket of now's minute (add, else
// insert a new one), pruning the buckets past usageWindow when it makes
// one.
func addToBucket(ctx context.Context, add, insert, prune *sql.Stmt, tree string, n int64, now time.Time) error {
	if n == 0 {
		return nil
	}
	minute := minuteOf(now)
	res, err := add.ExecContext(ctx, n, tree, minute)
	if err != nil {
		return err
	}
	if k, err := res.RowsAffected(); err != nil || k > 0 {
		return err
	}
	if _, err := insert.ExecContext(ctx, tree, minute, n); err != nil {
		return err
	}
	if _, err := prune.ExecContext(ctx, minuteOf(now.Add(-usageWindow))); err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	return nil
}

// UsageRows returns every sandbox's usage totals, those of sandboxes since
// destroyed included, sorted by tree, then name, then when last updated.
func (s *Store) UsageRows(ctx context.Context) (_ []UsageRow, err error) {
	defer s.settle(&err)
	ctx = detach(ctx)
	rows, err := s.db.QueryContext(ctx, `SELECT name, uuid, tree, requests, input_tokens, output_tokens,
		cache_read_input_tokens, cache_creation_input_tokens, updated_at
		FROM usage ORDER BY tree, name, updated_at, uuid`)
	if err != nil {
		return nil, fmt.Errorf("usage rows: %w", err)
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		var r UsageRow
		var updated int64
		if err := rows.Scan(&r.Name, &r.UUID, &r.Tree, &r.Requests, &r.InputTokens, &r.OutputTokens,
			&r.CacheReadInputTokens, &r.CacheCreationInputTokens, &updated); err != nil {
			return nil, fmt.Errorf("usage rows: %w", err)
		}
		r.Updated = time.UnixMilli(updated)
		out = append(out, r)
	}
	return out, rows.Err()
}

// TreeInputSince returns the input tokens (cached or not) tree reported
// since since, counted as TreeOutputSince counts output tokens.
func (s *Store) TreeInputSince(ctx context.Context, tree string, since time.Time) (int64, error) {
	return s.treeTokensSince(ctx, s.q.treeInput, "tree input", tree, since)
}

// TreeOutputSince returns the output tokens tree reported since since.
// Buckets are whole minutes and the one since falls in counts whole, so
// the figure errs up by at most a minute's tokens, never down.
func (s *Store) TreeOutputSince(ctx context.Context, tree string, since time.Time) (int64, error) {
	return s.treeTokensSince(ctx, s.q.treeOutput, "tree output", tree, since)
}

// treeTokensSince sums tree's buckets since since through sum.
func (s *Store) treeTokensSince(ctx context.Context, sum *sql.Stmt, what, tree string, since time.Time) (_ int64, err error) {
	defer s.settle(&err)
	var n int64
	if err := sum.QueryRowContext(detach(ctx), tree, minuteOf(since)).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return n, nil
}
