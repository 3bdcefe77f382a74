package store

import (
	"agentbox/internal/wire"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// States of a sandbox row.
const (
	// StateQueued: a spawned child waiting for a free slot; no sandbox yet.
	StateQueued = "queued"
	// StateCreating: the create has not finished. A broker that finds one
	// at start removes it (its create was interrupted).
	StateCreating = "creating"
	StateRunning  = "running"
	// StateReady: a spawned child whose agent was seen alive twice.
	StateReady   = "ready"
	StateStopped = "stopped"
	// StateFailed: a spawned child whose create failed (kept, stopped).
	StateFailed = "failed"
	// StateDestroying: its destroy has begun. A broker that finds one at
	// start finishes it (the destroy was interrupted).
	StateDestroying = "destroying"
)

// Sandbox is one row of the sandboxes table.
type Sandbox struct {
	Name      string
	UUID      string
	Role      wire.Role
	Parent    string // orchestrator's name for a child; "" otherwise
	Branch    string
	Repo      string // host path of the source repository
	State     string
	SocketDir string // host dir of the current listener; "" if none yet
	Grant     string // grant document (JSON) of an orchestrator
	HostUID   int    // host uid (and gid) the sandbox runs as; 0: the broker's own
	// Imported is the commit whose work is safe outside the sandbox: the
	// commit it started from, then its last import. Destroy without force
	// refuses a HEAD elsewhere (commits never imported).
	Imported string
	// StopHead and StopDirty are what the broker saw when it stopped the
	// sandbox (state stopped): its HEAD ("" when it could not be read) and
	// whether its work tree had changes. Destroy checks them instead of
	// the (then unreachable) checkout.
	StopHead  string
	StopDirty bool
	// SpawnDoc is a spawned child's spawn (JSON, orchestrate's), "" for a
	// sandbox made on the host.
	SpawnDoc string
	// Phase is the step a spawn's worker records before taking it.
	Phase string
	// Agent is the child's agent as last seen (JSON, orchestrate's).
	Agent string
	// QueuedSeq orders queued spawns (0: not queued).
	QueuedSeq int64
	// DoneHead is the HEAD of a child's accepted done report ("" before),
	// recorded with the report's delivery; Cleanup: the report said the
	// child will be destroyed, and that has not happened yet.
	DoneHead string
	Cleanup  bool
	// Startup is a child's selection of services and autostart profile
	// (JSON, orchestrate's): what its starts run.
	Startup string
}

const sandboxCols = `name, uuid, role, parent, branch, repo, state, socket_dir, grant_doc, host_uid, imported, stop_head, stop_dirty,
	spawn_doc, phase, agent, queued_seq, done_head, cleanup, startup`

func scanSandbox(row interface{ Scan(...any) error }) (Sandbox, error) {
	var sb Sandbox
	err := row.Scan(&sb.Name, &sb.UUID, &sb.Role, &sb.Parent, &sb.Branch, &sb.Repo, &sb.State, &sb.SocketDir, &sb.Grant,
		&sb.HostUID, &sb.Imported, &sb.StopHead, &sb.StopDirty, &sb.SpawnDoc, &sb.Phase, &sb.Agent, &sb.QueuedSeq, &sb.DoneHead, &sb.Cleanup, &sb.Startup)
	return sb, err
}

// CreateSandbox inserts a new sandbox; ErrExists if the name is taken.
func (s *Store) CreateSandbox(ctx context.Context, sb Sandbox) error {
	return s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		_, err := w.conn.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxCols+`, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			sb.Name, sb.UUID, sb.Role, sb.Parent, sb.Branch, sb.Repo, sb.State, sb.SocketDir, sb.Grant, sb.HostUID, sb.Imported,
			sb.StopHead, sb.StopDirty, sb.SpawnDoc, sb.Phase, sb.Agent, sb.QueuedSeq, sb.DoneHead, sb.Cleanup, sb.Startup, now())
		if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed") {
			return fmt.Errorf("sandbox %q: %w", sb.Name, ErrExists)
		}
		cu.sandboxesChanged = true
		return err
	})
}

// Sandbox returns one sandbox by name. Rows are cached: every send looks
// its requester (and recipient) up, and sandboxes change rarely; each write
// to the sandboxes table clears the cache after it commits.
func (s *Store) Sandbox(ctx context.Context, name string) (_ Sandbox, err error) {
	defer s.settleSandboxes(&err)
	ctx = detach(ctx)
	s.cmu.Lock()
	sb, ok := s.sandboxes[name]
	gen := s.sandboxGen
	s.cmu.Unlock()
	if ok {
		return sb, nil
	}
	sb, err = scanSandbox(s.q.sandboxByNm.QueryRowContext(ctx, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("sandbox %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Sandbox{}, err
	}
	s.cmu.Lock()
	if s.sandboxGen == gen { // no write committed since the query began
		s.sandboxes[name] = sb
	}
	s.cmu.Unlock()
	return sb, nil
}

// Sandboxes lists every sandbox by name.
func (s *Store) Sandboxes(ctx context.Context) ([]Sandbox, error) {
	return s.querySandboxes(ctx, `SELECT `+sandboxCols+` FROM sandboxes ORDER BY name`)
}

// querySandboxes runs a query of sandbox rows; it returns once every
// commit to the sandboxes table it can have seen is on disk.
func (s *Store) querySandboxes(ctx context.Context, query string, args ...any) (_ []Sandbox, err error) {
	defer s.settleSandboxes(&err)
	rows, err := s.db.QueryContext(detach(ctx), query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// sandboxesByParent finds an orchestrator's children without reading
// every sandbox.
const sandboxesByParent = `
CREATE INDEX IF NOT EXISTS sandboxes_by_parent ON sandboxes(parent) WHERE parent != '';`

// Children lists an orchestrator's children by name: through an index, so
// what a host command or a spawn does to one tree costs the same however
// many sandboxes the broker holds.
func (s *Store) Children(ctx context.Context, parent string) ([]Sandbox, error) {
	if parent == "" {
		return nil, nil
	}
	return s.querySandboxes(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE parent = ? AND parent != '' ORDER BY name`, parent)
}

// SetState records a sandbox's state.
func (s *Store) SetState(ctx context.Context, name, state string) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET state = ? WHERE name = ?`, state, name)
}

// SetStopped records a sandbox stopped by the broker, with the HEAD and
// dirtiness it had then.
func (s *Store) SetStopped(ctx context.Context, name, head string, dirty bool) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET state = ?, stop_head = ?, stop_dirty = ? WHERE name = ?`, StateStopped, head, dirty, name)
}

// SetPhase records the step a spawn's worker takes next.
func (s *Store) SetPhase(ctx context.Context, name, phase string) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET phase = ? WHERE name = ?`, phase, name)
}

// SetAgent records a child's agent as last seen.
func (s *Store) SetAgent(ctx context.Context, name, agent string) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET agent = ? WHERE name = ?`, agent, name)
}

// SetCreated records the backend instance a queued or creating child got.
func (s *Store) SetCreated(ctx context.Context, name, uuid string, hostUID int) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET uuid = ?, host_uid = ?, state = ?, queued_seq = 0 WHERE name = ?`,
		uuid, hostUID, StateCreating, name)
}

// SetRestart records a child's accepted restart: its new spawn document
// (what its worker runs), the state and phase it waits in, and its place
// in the queue (0: not queued). The done report and agent of its last run
// are forgotten, so a cleanup waiting on that report no longer applies.
func (s *Store) SetRestart(ctx context.Context, name, spawnDoc, state, phase string, queuedSeq int64) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET spawn_doc = ?, state = ?, phase = ?, queued_seq = ?, done_head = '', cleanup = 0, agent = '' WHERE name = ?`,
		spawnDoc, state, phase, queuedSeq, name)
}

// ClaimQueued takes a queued spawn or restart out of the queue, for its
// worker (state creating at its first phase) or its destroy (state
// destroying): only the row that still waits at place seq (state queued,
// or stopped for a restart) changes. False when none did (a worker took
// it, or it was destroyed): the caller must not act on it then.
func (s *Store) ClaimQueued(ctx context.Context, name string, seq int64, state, phase string) (bool, error) {
	claimed := false
	err := s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		res, err := w.conn.ExecContext(ctx, `UPDATE sandboxes SET state = ?, phase = ?, queued_seq = 0
			WHERE name = ? AND queued_seq = ? AND (state = ? OR (state = ? AND queued_seq > 0))`,
			state, phase, name, seq, StateQueued, StateStopped)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		claimed = n == 1
		cu.sandboxesChanged = claimed
		return err
	})
	return claimed && err == nil, err
}

// SetRunning records a started sandbox running, the marks of its last
// stop cleared.
func (s *Store) SetRunning(ctx context.Context, name string) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET state = ?, stop_head = '', stop_dirty = 0 WHERE name = ?`, StateRunning, name)
}

// SetRestarted records a restarted child's sandbox running again: out of
// the queue, the marks of its last stop cleared.
func (s *Store) SetRestarted(ctx context.Context, name string) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET state = ?, queued_seq = 0, stop_head = '', stop_dirty = 0 WHERE name = ?`, StateRunning, name)
}

// SetCleanup records whether a done child still waits for its destroy.
func (s *Store) SetCleanup(ctx context.Context, name string, pending bool) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET cleanup = ? WHERE name = ?`, pending, name)
}

// SetImported records the commit a sandbox's work was last imported at.
func (s *Store) SetImported(ctx context.Context, name, commit string) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET imported = ? WHERE name = ?`, commit, name)
}

// ClaimHostUID records uid as given to a sandbox. A uid is claimed once,
// ever: a uid used before fails with ErrExists.
func (s *Store) ClaimHostUID(ctx context.Context, uid int) error {
	return s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		if _, err := w.conn.ExecContext(ctx, `INSERT INTO host_uids (uid) VALUES (?)`, uid); err != nil {
			if strings.Contains(err.Error(), "UNIQUE constraint failed") {
				return fmt.Errorf("host uid %d: %w", uid, ErrExists)
			}
			return fmt.Errorf("claim host uid: %w", err)
		}
		return nil
	})
}

// SetGrant records an orchestrator's grant document.
func (s *Store) SetGrant(ctx context.Context, name, grantDoc string) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET grant_doc = ? WHERE name = ?`, grantDoc, name)
}

// ClaimSocketDir records dir as the sandbox's socket directory. A directory
// name is claimed once, ever: claiming a name used before fails with
// ErrExists, so no device path is ever reused.
func (s *Store) ClaimSocketDir(ctx context.Context, name, dir string) error {
	return s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		if _, err := w.conn.ExecContext(ctx, `INSERT INTO socket_dirs (dir) VALUES (?)`, dir); err != nil {
			if strings.Contains(err.Error(), "UNIQUE constraint failed") {
				return fmt.Errorf("socket dir: %w", ErrExists)
			}
			return err
		}
		res, err := w.conn.ExecContext(ctx, `UPDATE sandboxes SET socket_dir = ? WHERE name = ?`, dir, name)
		if err != nil {
			return err
		}
		cu.sandboxesChanged = true
		return oneRow(res, name)
	})
}

// DeleteSandbox removes a sandbox with its items and journal.
func (s *Store) DeleteSandbox(ctx context.Context, name string) error {
	return s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		res, err := w.conn.ExecContext(ctx, `DELETE FROM sandboxes WHERE name = ?`, name)
		if err != nil {
			return err
		}
		cu.dropped = append(cu.dropped, name)
		cu.sandboxesChanged = true
		return oneRow(res, name)
	})
}

// updateOne runs a one-row update of a sandbox; the last argument is the
// sandbox's name.
func (s *Store) updateOne(ctx context.Context, query string, args ...any) error {
	return s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		res, err := w.conn.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		cu.sandboxesChanged = true
		return oneRow(res, fmt.Sprint(args[len(args)-1]))
	})
}

func oneRow(res sql.Result, name string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("sandbox %q: %w", name, ErrNotFound)
	}
	return nil
}

// SetSocketDirForTest records dir without claiming it (tests simulate old
// layouts with it).
func (s *Store) SetSocketDirForTest(ctx context.Context, name, dir string) error {
	return s.updateOne(ctx, `UPDATE sandboxes SET socket_dir = ? WHERE name = ?`, dir, name)
}
