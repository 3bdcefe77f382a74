// Package store is broker.db: sandboxes, inbox items (unread and read),
// statuses and the manifest-id journal. It is the only package that writes
// SQL. Every method that changes state commits (fsync'd, synchronous=FULL)
// before it returns, so a reply written after it promises only what is on
// disk.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"time"

	_ "modernc.org/sqlite" // pure-Go SQLite driver, registered as "sqlite"
)

// Tunables.
const (
	// busyTimeoutMillis lets a writer wait for another connection's write
	// lock instead of failing at once.
	busyTimeoutMillis = 10000
	// maxOpenConns bounds the SQLite connection pool: WAL allows readers
	// beside the single writer.
	maxOpenConns = 8
	// hostIDBytes is the random part of a host id: h-<8 hex>.
	hostIDBytes = 4
	// hostIDAttempts bounds retries on an id collision.
	hostIDAttempts = 16
)

// Errors.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
)

// Store is an open broker.db.
type Store struct {
	db *sql.DB
}

// Open opens (creating if needed) the database at path with WAL and
// synchronous=FULL on every pooled connection, and applies the schema.
func Open(path string) (*Store, error) {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeoutMillis))
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(maxOpenConns)
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		db.Close()
		return nil, fmt.Errorf("open broker.db: %w", err)
	}
	if mode != "wal" {
		db.Close()
		return nil, fmt.Errorf("open broker.db: journal_mode is %q, want wal", mode)
	}
	s := &Store{db: db}
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	name       TEXT PRIMARY KEY,
	uuid       TEXT NOT NULL UNIQUE,
	role       TEXT NOT NULL CHECK (role IN ('orchestrator','child')),
	parent     TEXT NOT NULL DEFAULT '',
	branch     TEXT NOT NULL,
	repo       TEXT NOT NULL,
	state      TEXT NOT NULL,
	socket_dir TEXT NOT NULL DEFAULT '',
	grant_doc  TEXT NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS items (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT NOT NULL UNIQUE,
	sandbox    TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
	type       TEXT NOT NULL,
	ref        TEXT NOT NULL DEFAULT '',
	doc        TEXT NOT NULL,
	read       INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS items_by_sandbox ON items(sandbox, read, seq);
CREATE INDEX IF NOT EXISTS items_by_ref ON items(sandbox, ref, seq);
CREATE TABLE IF NOT EXISTS journal (
	sandbox     TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
	manifest_id TEXT NOT NULL,
	type        TEXT NOT NULL,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (sandbox, manifest_id)
);
CREATE TABLE IF NOT EXISTS socket_dirs (
	dir TEXT PRIMARY KEY
);
`

func (s *Store) migrate() error {
	_, err := s.db.Exec(schema)
	if err != nil {
		return fmt.Errorf("apply schema: %w", err)
	}
	return nil
}

// newHostID returns a random h-<8 hex> id.
func newHostID() string {
	var b [hostIDBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return "h-" + hex.EncodeToString(b[:])
}

func now() int64 { return time.Now().UnixMilli() }

// withTx runs fn in one write transaction (BEGIN IMMEDIATE) and commits.
func (s *Store) withTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}
