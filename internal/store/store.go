// Package store is broker.db: sandboxes, inbox items (unread and read),
// statuses, the manifest-id journal and model usage. It is the only
// package that writes SQL. Every method that changes state returns only
// once its commit is on disk, and every method that reads returns only once
// every commit it can have seen is on disk, so a reply written after it
// promises only what is on disk. Concurrent writers share the fsync that
// makes their commits durable (group commit, see durable.go).
package store

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // pure-Go SQLite driver, registered as "sqlite"

	"agentbox/internal/secfs"
	"agentbox/internal/serial"
)

// Tunables.
const (
	// busyTimeoutMillis lets a writer wait for another connection's write
	// lock instead of failing at once.
	busyTimeoutMillis = 10000
	// maxOpenConns bounds the SQLite connections: the dedicated writer and,
	// in WAL mode, readers beside it.
	maxOpenConns = 9
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
	q  statements
	w  writer
	// dur makes commits durable (synchronous=NORMAL leaves that to it).
	dur *durability

	// wmu serializes write transactions with the cache updates that follow
	// their commits, so the unread cache always matches the database.
	wmu sync.Mutex
	// cmu guards inboxes, the unread items of each sandbox loaded so far.
	cmu     sync.Mutex
	inboxes map[string][]Item
	// sandboxes caches rows by name; sandboxGen counts the writes that
	// cleared it, so a query that raced a write does not install a stale row.
	sandboxes  map[string]Sandbox
	sandboxGen uint64
	// sandboxesAt is the index of the last commit that wrote the sandboxes
	// table, set before that COMMIT: a row lookup need wait only for it.
	sandboxesAt uint64

	// quota bounds unread inboxes (see Quota); totals caches the size of
	// each unread inbox counted so far, as the writers see it: kept in
	// step with every transaction that succeeded, committed or still in
	// the open batch. Both are guarded by wmu.
	quota  Quota
	totals map[string]unreadTotals

	// open is the write transaction shared writers are in and not yet
	// committed (batch.go); guarded by wmu.
	open *batch
}

// Open opens (creating if needed) the database at path with WAL and
// synchronous=NORMAL on every pooled connection (durability is dur's), and
// applies the schema.
func Open(path string) (*Store, error) {
	if err := ownerOnly(path); err != nil {
		return nil, fmt.Errorf("open broker.db: %w", err)
	}
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	// Free pages can be given back (Shrink); a new database takes it at
	// once, an older one at its next open (incrementalVacuum).
	q.Add("_pragma", "auto_vacuum(INCREMENTAL)")
	q.Add("_pragma", fmt.Sprintf("journal_size_limit(%d)", walLimitBytes))
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeoutMillis))
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
	s := &Store{db: db, dur: newDurability(path), inboxes: map[string][]Item{}, sandboxes: map[string]Sandbox{}, totals: map[string]unreadTotals{}}
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, err
	}
	// The schema's commits ran outside withTx: make them durable now.
	s.dur.commitStarted()
	s.dur.commitDone()
	if err := s.dur.wait(s.dur.seen()); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// ownerOnly creates the database file mode 0600 if it is missing and
// takes group and other access from it and its WAL files; SQLite gives the
// -wal and -shm files it creates the database file's mode.
func ownerOnly(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", filepath.Base(p))
		}
		if fi.Mode().Perm()&0o077 != 0 {
			if err := secfs.Chmod(p, fi.Mode().Perm()&0o700); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close makes every commit durable and closes the database.
func (s *Store) Close() error {
	s.wmu.Lock()
	if s.open != nil {
		s.commitBatch(context.Background()) // its writers learn the outcome
	}
	s.wmu.Unlock()
	err := s.dur.close()
	s.closeStatements()
	return errors.Join(err, s.db.Close())
}

// schemaVersion is PRAGMA user_version of a database with this schema.
const schemaVersion = 6

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
	created_at INTEGER NOT NULL,
	host_uid   INTEGER NOT NULL DEFAULT 0,
	imported   TEXT NOT NULL DEFAULT '',
	stop_head  TEXT NOT NULL DEFAULT '',
	stop_dirty INTEGER NOT NULL DEFAULT 0,
	spawn_doc  TEXT NOT NULL DEFAULT '',
	phase      TEXT NOT NULL DEFAULT '',
	agent      TEXT NOT NULL DEFAULT '',
	queued_seq INTEGER NOT NULL DEFAULT 0,
	done_head  TEXT NOT NULL DEFAULT '',
	cleanup    INTEGER NOT NULL DEFAULT 0,
	startup    TEXT NOT NULL DEFAULT ''
);
-- Inbox items. seq orders them (rowid: new rows always get max+1, so the
-- order of an inbox never goes backwards). Host ids are unique per inbox.
-- Each index below costs a send page writes: only what a lookup in one
-- inbox needs has one.
CREATE TABLE IF NOT EXISTS items (
	seq        INTEGER PRIMARY KEY,
	id         TEXT NOT NULL,
	sandbox    TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
	type       TEXT NOT NULL,
	ref        TEXT NOT NULL DEFAULT '',
	doc        TEXT NOT NULL,
	read       INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS items_by_sandbox ON items(sandbox, id);
-- What a send, a quota check or a watch looks for in one inbox, without
-- walking its read history (kept for days, and as large as its senders
-- make it): the unread items; the messages each child sent; the done
-- reports that imported a commit. A query names the index's condition
-- as written here (a literal 'message', not a parameter), or SQLite
-- does not use it.
CREATE INDEX IF NOT EXISTS items_unread ON items(sandbox, seq) WHERE read = 0;
CREATE INDEX IF NOT EXISTS items_child_messages ON items(sandbox, json_extract(doc, '$.from'), seq)
	WHERE type = 'message' AND json_extract(doc, '$.origin_id') IS NOT NULL;
CREATE INDEX IF NOT EXISTS items_imports ON items(sandbox, json_extract(doc, '$.imported_sha'))
	WHERE type = 'message' AND json_extract(doc, '$.imported_sha') IS NOT NULL;
-- The manifest-id journal: one row per (requester, manifest id), pointing
-- at the latest status recorded for it (NULL: journaled, no status yet).
CREATE TABLE IF NOT EXISTS journal (
	sandbox     TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
	manifest_id TEXT NOT NULL,
	type        TEXT NOT NULL,
	status_seq  INTEGER,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (sandbox, manifest_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS socket_dirs (
	dir TEXT PRIMARY KEY
) WITHOUT ROWID;
-- Every host uid ever given to a sandbox: a uid is never handed out twice.
CREATE TABLE IF NOT EXISTS host_uids (
	uid INTEGER PRIMARY KEY
);
` + finishesTable + usageTables + treeInputTable + rightsTable + sandboxesByParent + preparedTable + `
PRAGMA user_version = 6;
`

// migrations[v] brings a database of schema version v to v+1.
var migrations = map[int]string{
	1: `
ALTER TABLE sandboxes ADD COLUMN host_uid INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN imported TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN stop_head TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN stop_dirty INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN spawn_doc TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN phase TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN agent TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN queued_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN done_head TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN cleanup INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS host_uids (uid INTEGER PRIMARY KEY);
PRAGMA user_version = 2;
`,
	2: finishesTable + `
PRAGMA user_version = 3;
`,
	3: usageTables + `
PRAGMA user_version = 4;
`,
	4: rightsTable + `
PRAGMA user_version = 5;
`,
	5: `
ALTER TABLE sandboxes ADD COLUMN startup TEXT NOT NULL DEFAULT '';
` + preparedTable + `
PRAGMA user_version = 6;
`,
}

// finishesTable holds children's accepted done reports waiting for their
// orchestrator (Finish). No foreign key on parent: a finish whose
// orchestrator vanished must still be answered.
const finishesTable = `
CREATE TABLE IF NOT EXISTS finishes (
	seq         INTEGER PRIMARY KEY,
	child       TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
	parent      TEXT NOT NULL,
	manifest_id TEXT NOT NULL,
	head        TEXT NOT NULL,
	branch      TEXT NOT NULL,
	kind        TEXT NOT NULL,
	body        TEXT NOT NULL,
	in_reply_to TEXT,
	created_at  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS finishes_by_parent ON finishes(parent, seq);`

func (s *Store) migrate() error {
	var version int
	if err := s.db.QueryRow("PRAGMA user_version").Scan(&version); err != nil {
		return err
	}
	if version > schemaVersion {
		return fmt.Errorf("broker.db has schema version %d; this jailbee knows %d", version, schemaVersion)
	}
	if err := s.incrementalVacuum(); err != nil {
		return fmt.Errorf("broker.db: auto_vacuum: %w", err)
	}
	for ; version > 0 && version < schemaVersion; version++ {
		if err := s.migrateFrom(version); err != nil {
			return fmt.Errorf("migrate broker.db from schema version %d: %w", version, err)
		}
	}
	if _, err := s.db.Exec(schema); err != nil {
		return fmt.Errorf("apply schema: %w", err)
	}
	return s.prepare(context.Background())
}

// autoVacuumIncremental is PRAGMA auto_vacuum's value for INCREMENTAL.
const autoVacuumIncremental = 2

// incrementalVacuum makes a database created before auto_vacuum was set
// (every connection asks for INCREMENTAL) take it: only a VACUUM, run
// once, changes the mode of a database that has tables.
func (s *Store) incrementalVacuum() error {
	var mode int
	if err := s.db.QueryRow("PRAGMA auto_vacuum").Scan(&mode); err != nil {
		return err
	}
	if mode == autoVacuumIncremental {
		return nil
	}
	_, err := s.db.Exec("VACUUM")
	return err
}

// migrateFrom applies migrations[version] in one transaction: a crash
// halfway leaves the database at version, to be migrated again.
func (s *Store) migrateFrom(version int) error {
	tx, err := s.db.Begin()
	if err != nil {
		return err
	}
	if _, err := tx.Exec(migrations[version]); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// hostID makes item ids; tests replace it to force collisions.
var hostID = newHostID

// newHostID returns a random h-<8 hex> id.
func newHostID() string {
	var b [hostIDBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return "h-" + hex.EncodeToString(b[:])
}

func now() int64 { return time.Now().UnixMilli() }

// withTx runs fn in one write transaction and returns once the commit
// (or, when fn fails, every commit fn can have read) is on disk. The wait
// is outside the write lock: the next writers commit meanwhile and share
// the sync. It is outside the broker's serial turn too (serial.Outside),
// so the next sandbox's send commits while this one waits for the disk.
func (s *Store) withTx(ctx context.Context, fn func(*writer, *cacheUpdate) error) error {
	return s.write(ctx, false, fn)
}

// withSharedTx is withTx for a transaction that may share its COMMIT
// with others (see batch.go): while a sync runs, it stays in the open
// transaction and is committed with the next ones when the sync ends.
func (s *Store) withSharedTx(ctx context.Context, fn func(*writer, *cacheUpdate) error) error {
	return s.write(ctx, true, fn)
}

func (s *Store) write(ctx context.Context, share bool, fn func(*writer, *cacheUpdate) error) error {
	index, pending, err := s.commitTx(detach(ctx), share, fn)
	var werr error
	wait := func() {
		if pending != nil {
			if index, werr = s.awaitCommit(pending); werr != nil {
				return
			}
		}
		werr = s.dur.wait(index)
	}
	if pending != nil || !s.dur.durableAt(index) {
		serial.Outside(ctx, wait)
	} else {
		wait() // a sticky failure still fails it
	}
	if werr != nil {
		return werr
	}
	return err
}

// commitTx runs fn in the open write transaction (beginning one if none
// is), inside a savepoint, so a failing fn undoes only its own writes.
// Then, still holding the write lock, it commits (applying the cache
// changes of every transaction the commit covers, so no later write or
// cache read can see the cache behind the database) and returns the
// commit index to wait for; or, when share is set and a sync is running,
// it leaves the transaction open and returns the batch that will commit
// it (with fn's error, if any: the caller waits for that commit either
// way).
func (s *Store) commitTx(ctx context.Context, share bool, fn func(*writer, *cacheUpdate) error) (uint64, *batch, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	b, err := s.openBatch(ctx)
	if err != nil {
		return s.dur.seen(), nil, err
	}
	var cu cacheUpdate
	ferr, err := s.runSavepoint(ctx, fn, &cu)
	if err != nil {
		s.abortBatch(ctx, err)
		return s.dur.seen(), nil, err
	}
	b.writers++
	if ferr == nil {
		s.join(b, &cu)
	}
	if share && !cu.sandboxesChanged && len(cu.dropped) == 0 && s.dur.busy() {
		// A writer that failed waits too: its error may rest on what the
		// writers before it wrote.
		return 0, b, ferr
	}
	index, err := s.commitBatch(ctx)
	return index, nil, cmp.Or(ferr, err)
}

// settle makes a read wait until every commit it can have seen is on
// disk; defer it with the read's named error.
func (s *Store) settle(err *error) { s.settleAt(s.dur.seen(), err) }

// settleSandboxes is settle for a read of the sandboxes table alone: every
// send looks rows up, and need not wait for other sends' commits.
func (s *Store) settleSandboxes(err *error) {
	s.cmu.Lock()
	index := s.sandboxesAt
	s.cmu.Unlock()
	s.settleAt(index, err)
}

func (s *Store) settleAt(index uint64, err *error) {
	if werr := s.dur.wait(index); werr != nil && *err == nil {
		*err = werr
	}
}

// detach drops ctx's cancellation. With a cancellable context,
// database/sql and modernc.org/sqlite start a watcher goroutine for every
// transaction and statement; store operations are short and local, so they
// run to completion instead.
func detach(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }
