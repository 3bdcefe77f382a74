// Package dispatch is the trusted side of a tool-request spool: it lays
// a spool out (Init) and dispatches one request (Spool.Dispatch): staged
// into the root-only .processing/ directory before it is read, checked,
// claimed durably in the runtime's ledger, relayed capability-free to the
// trusted endpoint, its correlated response recorded durably, and only
// then written for the consumer; the staged copy is removed last. Replay of an interrupted relay needs the
// lease's signed exact-digest policy; without it a claim is terminal.
//
// The runtime reaches the spool through the volume's host directory (the
// engine's local driver), as root, with no-follow opens relative to open
// directories: nothing runs in the container for it, and nothing the
// consumer plants there (links, FIFOs, hard links, other owners) is
// followed or trusted.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/crashpoint"
	"agentbox/internal/managed/endpoint"
	"agentbox/internal/managed/spool"
	"agentbox/internal/secfs"
)

// PollInterval is how often Dispatch looks again while it waits.
const PollInterval = 250 * time.Millisecond

// now and pause are the clock Dispatch waits on; a test replaces them
// (SetClockForTest) to decide where a request appears relative to the
// deadline.
var (
	now   = time.Now
	pause = func(ctx context.Context, d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
)

// ErrNotPending reports a request id with no request in the spool: the
// consumer has not finished writing it. Retryable.
var ErrNotPending = errors.New("the request is not pending")

// RetryableError is a relay that failed in transport under the signed
// replay policy: the claim stays, and a later attempt relays the same
// exact request.
type RetryableError struct{ Err error }

func (e *RetryableError) Error() string {
	return "relay: " + e.Err.Error() + " (retryable under the replay policy)"
}
func (e *RetryableError) Unwrap() error { return e.Err }

// Spool is one tool-request lease's spool and everything its dispatch
// binds.
type Spool struct {
	Dir    string // the spool volume's host directory
	Layout Layout
	IDs    spool.IDs // run, lease and consumer (RequestID is set per dispatch)
	// Endpoint is the linked tool endpoint's socket.
	Endpoint string
	// Ledger is the runtime's owner-only directory for this lease's
	// locks and records.
	Ledger string
	// Replay is the lease's signed exact-digest-replay-v1 policy.
	Replay bool
}

// Outcome is a dispatched request's response; Cached when it came from
// the ledger without contacting the endpoint.
type Outcome struct {
	Response *spool.Response
	Cached   bool
}

// Dispatch dispatches request id, looking again every PollInterval, and
// once more at the deadline, until wait has passed while the request is not pending (and, under the replay
// policy, while the relay fails in transport). Any other failure is
// terminal and returned at once.
func (s *Spool) Dispatch(ctx context.Context, id string, wait time.Duration) (*Outcome, error) {
	if err := spool.ValidRequestID(id); err != nil {
		return nil, fmt.Errorf("request id: %w", err)
	}
	deadline := now().Add(wait)
	for {
		out, err := s.attempt(ctx, id, deadline)
		var re *RetryableError
		left := deadline.Sub(now())
		if err == nil || !(errors.Is(err, ErrNotPending) || errors.As(err, &re)) || left <= 0 {
			return out, err
		}
		// The last pause ends at the deadline, for one last look.
		if err := pause(ctx, min(PollInterval, left)); err != nil {
			return nil, err
		}
	}
}

// attempt is one pass: lock, then the ledger's records, then the spool.
func (s *Spool) attempt(ctx context.Context, id string, deadline time.Time) (*Outcome, error) {
	unlock, err := s.lock(id, deadline)
	if err != nil {
		return nil, err
	}
	defer unlock()
	d, _, err := openDir(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("spool: open: %w", err)
	}
	defer d.Close()
	if err := Verify(d, s.Layout); err != nil {
		return nil, err
	}
	ids := s.IDs
	ids.RequestID = id
	st := &step{s: s, id: id, ids: ids, root: d}
	if err := st.open(); err != nil {
		return nil, err
	}
	defer st.close()

	if done, err := s.readDone(id, ids); err != nil || done != nil {
		if err != nil {
			return nil, err
		}
		return st.replayDone(done)
	}
	claim, err := s.readClaim(id, ids)
	if err != nil {
		return nil, err
	}
	if claim != nil {
		if !s.Replay {
			return nil, errors.New("the request was claimed by an earlier dispatch whose relay may have run; without the signed replay policy the claim stays blocked")
		}
		// The exact persisted request, and nothing the consumer may have
		// spooled again under the same id but a request of the same bytes.
		if err := st.dropRespooled(claim.RequestSHA256, true); err != nil {
			return nil, err
		}
		return st.relay(ctx, claim.Request)
	}
	frame, err := st.stage()
	if err != nil {
		return nil, err
	}
	if err := secfs.WriteFileAtomic(s.ledgerFile(id, "claim"), spool.NewClaim(frame).Marshal(), 0o600); err != nil {
		return nil, fmt.Errorf("ledger: write the claim: %w", err)
	}
	crashpoint.Hit(crashpoint.DispatchClaimed)
	return st.relay(ctx, frame)
}

// lock takes the request id's exclusive lock in the ledger, waiting until
// deadline for another dispatch of it. A crashed holder's lock goes with
// its process.
func (s *Spool) lock(id string, deadline time.Time) (func(), error) {
	if err := secfs.EnsurePrivateDir(s.Ledger); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	f, err := os.OpenFile(s.ledgerFile(id, "attempt"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, errors.New("another dispatch of this request id is running")
			}
			return nil, fmt.Errorf("ledger: lock: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Spool) ledgerFile(id, kind string) string {
	return filepath.Join(s.Ledger, id+"."+kind+".json")
}

// readDone reads the request's done record, nil when there is none.
func (s *Spool) readDone(id string, ids spool.IDs) (*spool.Done, error) {
	data, err := secfs.ReadFileNoFollow(s.ledgerFile(id, "done"), spool.MaxRequestBytes+spool.MaxResponseBytes+4096)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: read the done record: %w", err)
	}
	d, err := spool.DecodeDone(data, ids)
	if err != nil {
		return nil, fmt.Errorf("ledger: the done record is damaged: %w", err)
	}
	return &d, nil
}

// readClaim reads the request's claim, nil when there is none.
func (s *Spool) readClaim(id string, ids spool.IDs) (*spool.Claim, error) {
	data, err := secfs.ReadFileNoFollow(s.ledgerFile(id, "claim"), spool.MaxRequestBytes+4096)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: read the claim: %w", err)
	}
	c, err := spool.DecodeClaim(data, ids)
	if err != nil {
		return nil, fmt.Errorf("ledger: the claim is damaged: %w", err)
	}
	return &c, nil
}

// step is one attempt's open spool directories.
type step struct {
	s               *Spool
	id              string
	ids             spool.IDs
	root            *os.File
	req, resp, proc *os.File
}

func (st *step) open() error {
	var err error
	fd := int(st.root.Fd())
	if st.req, err = openSubdir(fd, RequestsDir); err != nil {
		return err
	}
	if st.resp, err = openSubdir(fd, ResponsesDir); err != nil {
		return err
	}
	st.proc, err = openSubdir(fd, ProcessingDir)
	return err
}

func (st *step) close() {
	for _, f := range []*os.File{st.req, st.resp, st.proc} {
		if f != nil {
			f.Close()
		}
	}
}

// stage finds the request: one already staged in .processing/ by an
// interrupted attempt, or the consumer's, moved there atomically before
// it is read. Either way the staged file is checked again on its open
// handle, decoded, and its ids and capability compared. It returns the
// capability-free frame.
func (st *step) stage() ([]byte, error) {
	name := requestFile(st.id)
	var tmp unix.Stat_t
	staged := unix.Fstatat(int(st.proc.Fd()), name, &tmp, unix.AT_SYMLINK_NOFOLLOW) == nil
	found, err := pending(st.req, st.s.Layout.UID, st.id)
	if err != nil {
		return nil, err
	}
	switch {
	case staged && found:
		// Spooled again after an interrupted run staged it: the same
		// request goes, the staged one is used; any other is terminal.
		env, err := st.readRequest(st.proc, name)
		if err != nil {
			return nil, err
		}
		frame := env.Frame()
		if err := st.dropRespooled(spool.Fingerprint(frame), true); err != nil {
			return nil, err
		}
		return frame, nil
	case !staged && !found:
		return nil, ErrNotPending
	case !staged:
		err := unix.Renameat2(int(st.req.Fd()), name, int(st.proc.Fd()), name, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.ENOENT) {
			return nil, ErrNotPending // renamed away by the consumer meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("spool: stage the request: %w", err)
		}
		// No fsync: a move lost with the machine puts the request back in
		// requests/, where the next attempt finds it (the claim, which is
		// durable, makes a repeat of the same bytes harmless).
		crashpoint.Hit(crashpoint.DispatchStaged)
	}
	env, err := st.readRequest(st.proc, name)
	if err != nil {
		return nil, err
	}
	return env.Frame(), nil
}

// readRequest reads and checks a request file in dir: the file rules on
// its open handle, the envelope, the ids and the capability.
func (st *step) readRequest(dir *os.File, name string) (*spool.Envelope, error) {
	f, fst, err := openFileAt(int(dir.Fd()), name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := entryRules(&fst, st.s.Layout.UID); err != nil {
		return nil, fmt.Errorf("spool: the request is %w", err)
	}
	if err := requestRules(&fst); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, spool.MaxRequestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("spool: read the request: %w", err)
	}
	env, err := spool.DecodeEnvelope(data)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if err := env.Check(st.ids, st.s.Layout.Capability); err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	return env, nil
}

// dropRespooled handles a request spooled again (or still staged) under
// an id the ledger already knows: it must be the exact same request
// (fingerprint), and is then removed (the staged one only unless
// keepStaged); any other is terminal.
func (st *step) dropRespooled(fingerprint string, keepStaged bool) error {
	name := requestFile(st.id)
	for _, dir := range []*os.File{st.proc, st.req} {
		var tmp unix.Stat_t
		if unix.Fstatat(int(dir.Fd()), name, &tmp, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		env, err := st.readRequest(dir, name)
		if err != nil {
			return err
		}
		if spool.Fingerprint(env.Frame()) != fingerprint {
			return errors.New("request: a different request under an id already claimed or answered")
		}
		if dir == st.proc && keepStaged {
			continue
		}
		if err := unix.Unlinkat(int(dir.Fd()), name, 0); err != nil {
			return fmt.Errorf("spool: remove the repeated request: %w", err)
		}
	}
	return nil
}

// replayDone answers from the done record: no endpoint is contacted.
func (st *step) replayDone(done *spool.Done) (*Outcome, error) {
	if err := st.dropRespooled(done.RequestSHA256, false); err != nil {
		return nil, err
	}
	resp, err := spool.DecodeResponse(done.Response, st.ids)
	if err != nil {
		return nil, fmt.Errorf("ledger: the recorded response: %w", err)
	}
	if err := st.respond(resp); err != nil {
		return nil, err
	}
	return &Outcome{Response: resp, Cached: true}, nil
}

// relay sends the frame to the endpoint and records its correlated
// response durably before the consumer's file is written.
func (st *step) relay(ctx context.Context, frame []byte) (*Outcome, error) {
	raw, err := endpoint.Relay(ctx, st.s.Endpoint, frame)
	var te *endpoint.TransportError
	switch {
	case errors.As(err, &te) && st.s.Replay:
		return nil, &RetryableError{Err: err}
	case errors.As(err, &te):
		return nil, fmt.Errorf("relay: %w; without the signed replay policy the claim stays blocked", err)
	case err != nil:
		return nil, fmt.Errorf("relay: %w", err)
	}
	crashpoint.Hit(crashpoint.DispatchRelayed)
	resp, err := spool.DecodeResponse(raw, st.ids)
	if err != nil {
		return nil, fmt.Errorf("the endpoint's response: %w", err)
	}
	if err := secfs.WriteFileAtomic(st.s.ledgerFile(st.id, "done"), spool.NewDone(frame, resp).Marshal(), 0o600); err != nil {
		return nil, fmt.Errorf("ledger: record the response: %w", err)
	}
	if err := os.Remove(st.s.ledgerFile(st.id, "claim")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	crashpoint.Hit(crashpoint.DispatchRecorded)
	if err := st.respond(resp); err != nil {
		return nil, err
	}
	// The staged copy goes last: until the consumer has its response, a
	// rerun finds the exact request in .processing/ as well as in the
	// ledger.
	if err := unix.Unlinkat(int(st.proc.Fd()), requestFile(st.id), 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("spool: remove the staged request: %w", err)
	}
	return &Outcome{Response: resp}, nil
}

// respond writes responses/<id>.json for the consumer (its uid and gid,
// mode 0400, a temporary file renamed into place). An existing one must
// hold exactly the same bytes.
func (st *step) respond(resp *spool.Response) error {
	data := resp.Bytes()
	name := requestFile(st.id)
	l := st.s.Layout
	err := writeFileAt(int(st.resp.Fd()), name, data, responseMode, l.UID, l.GID, true, false)
	if errors.Is(err, os.ErrExist) {
		got, rerr := readFileAt(int(st.resp.Fd()), name, spool.MaxResponseBytes+1)
		if rerr != nil {
			return rerr
		}
		if string(got) != string(data) {
			return errors.New("spool: responses/ already holds a different response for this id")
		}
		err = nil
	}
	if err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.DispatchResponded)
	return nil
}
