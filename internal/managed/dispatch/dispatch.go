// Package dispatch is the trusted side of a tool-request spool: it lays
// a spool out (Init) and dispatches one request (Spool.Dispatch): staged
// into the root-only .processing/ directory before it is read, checked,
// claimed durably in the runtime's ledger, relayed capability-free to the
// trusted endpoint, its correlated response recorded durably, and only
// then written for the consumer; the staged copy is removed last. Replay of an interrupted relay needs the
// lease's signed exact-digest policy; without it a claim is terminal.
//
// Each request has one append-only ledger file, which is also its lock:
// the claim and the done record are each one append and one sync round,
// the two the replay contract needs (the ledger file's directory entry is
// synced at the same time as its first record, and the consumer's file as
// the done record).
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

// ErrBusy reports a request id another dispatch held until the deadline:
// not a fault of the request, so retryable. Run again, and the answer
// comes from the ledger once that dispatch has it.
var ErrBusy = errors.New("another dispatch of this request id is running")

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
	ledger, err := s.lock(id, deadline)
	if err != nil {
		return nil, err
	}
	defer ledger.Close()
	d, _, err := openDir(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("spool: open: %w", secfs.OpWithoutPath(err))
	}
	defer d.Close()
	if err := Verify(d, s.Layout); err != nil {
		return nil, err
	}
	ids := s.IDs
	ids.RequestID = id
	st := &step{s: s, id: id, ids: ids, root: d, ledger: ledger}
	if err := st.open(); err != nil {
		return nil, err
	}
	defer st.close()
	if err := st.readLedger(); err != nil {
		return nil, err
	}
	if done := st.rec.Done; done != nil {
		return st.replayDone(done)
	}
	if claim := st.rec.Claim; claim != nil {
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
	if err := st.record(spool.KindClaim, spool.NewClaim(frame).Marshal(), crashpoint.DispatchClaimAppended); err != nil {
		return nil, err
	}
	crashpoint.Hit(crashpoint.DispatchClaimed)
	return st.relay(ctx, frame)
}

// lock opens the request id's ledger file in the ledger directory and
// takes its exclusive lock, waiting until deadline for another dispatch of
// it. A crashed holder's lock goes with its process.
func (s *Spool) lock(id string, deadline time.Time) (*os.File, error) {
	if err := secfs.EnsurePrivateDir(s.Ledger); err != nil {
		return nil, fmt.Errorf("ledger: %w", secfs.OpWithoutPath(err))
	}
	f, err := os.OpenFile(filepath.Join(s.Ledger, id+".ledger"), os.O_RDWR|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", secfs.OpWithoutPath(err))
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, ErrBusy
			}
			return nil, fmt.Errorf("ledger: lock: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// step is one attempt's open spool directories and ledger file.
type step struct {
	s               *Spool
	id              string
	ids             spool.IDs
	root            *os.File
	req, resp, proc *os.File
	ledger          *os.File
	rec             spool.Ledger // what the ledger file holds
}

// readLedger reads the request's ledger file. An empty one must have no
// records of the earlier format beside it (one file per record), which
// this version does not read: it fails closed rather than relay again.
func (st *step) readLedger() error {
	data, err := io.ReadAll(io.NewSectionReader(st.ledger, 0, spool.MaxLedgerBytes+1))
	if err != nil {
		return fmt.Errorf("ledger: read: %w", secfs.OpWithoutPath(err))
	}
	if st.rec, err = spool.ParseLedger(data, st.ids); err != nil {
		return fmt.Errorf("ledger: the request's records are damaged: %w", err)
	}
	if len(data) > 0 {
		return nil
	}
	for _, kind := range []string{"claim", "done"} {
		if _, err := os.Lstat(filepath.Join(st.s.Ledger, st.id+"."+kind+".json")); !errors.Is(err, os.ErrNotExist) {
			return errors.New("ledger: the request has records of an earlier branchbox version; finish it with that version")
		}
	}
	return nil
}

// record appends one record of kind to the ledger file (cutting a torn
// tail first) and makes it durable before anything acts on it: the
// file's data, with its first record the ledger directory's entry for it,
// and whatever also syncs, all synced at once so that one journal commit
// can serve them. crash is the point between the append and the sync.
func (st *step) record(kind string, body []byte, crash string, also ...func() error) error {
	if st.rec.Torn {
		if err := st.ledger.Truncate(int64(st.rec.Valid)); err != nil {
			return fmt.Errorf("ledger: cut a torn record: %w", secfs.OpWithoutPath(err))
		}
		st.rec.Torn = false
	}
	rec := spool.AppendLedgerRecord(nil, kind, body)
	if _, err := st.ledger.Write(rec); err != nil {
		return fmt.Errorf("ledger: append the %s record: %w", kind, secfs.OpWithoutPath(err))
	}
	crashpoint.Hit(crash)
	syncs := append(also, func() error { return unix.Fdatasync(int(st.ledger.Fd())) })
	if st.rec.Valid == 0 {
		syncs = append(syncs, func() error { return secfs.FsyncDir(st.s.Ledger) })
	}
	st.rec.Valid += len(rec)
	if err := syncAll(syncs); err != nil {
		return fmt.Errorf("ledger: sync the %s record: %w", kind, secfs.OpWithoutPath(err))
	}
	return nil
}

// syncAll runs every sync at once and returns the first failure.
func syncAll(syncs []func() error) error {
	errs := make(chan error, len(syncs))
	for _, sync := range syncs {
		go func() { errs <- sync() }()
	}
	var first error
	for range syncs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
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
	sync := func(tmp func() error) error { return tmp() }
	if err := st.respond(resp, sync); err != nil {
		return nil, err
	}
	return &Outcome{Response: resp, Cached: true}, nil
}

// relay sends the frame to the endpoint and records its correlated
// response durably before the consumer's file is placed (the two synced
// together).
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
	done := spool.NewDone(frame, resp).Marshal()
	sync := func(tmp func() error) error {
		if err := st.record(spool.KindDone, done, crashpoint.DispatchRecordAppended, tmp); err != nil {
			return err
		}
		crashpoint.Hit(crashpoint.DispatchRecorded)
		return nil
	}
	if err := st.respond(resp, sync); err != nil {
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
// mode 0400): a temporary file in the root-only .processing/, out of the
// consumer's reach until durable(sync) has synced it (with whatever must
// be durable before the consumer may read it), then renamed into place,
// no replace. An existing one that differs (the consumer owns it) is
// replaced with the recorded bytes.
func (st *step) respond(resp *spool.Response, durable func(sync func() error) error) error {
	data := resp.Bytes()
	name := requestFile(st.id)
	tmp := "." + st.id + ".response"
	proc := int(st.proc.Fd())
	l := st.s.Layout
	f, err := createFileAt(proc, tmp, data, responseMode, l.UID, l.GID)
	if err != nil {
		// The consumer can fill its volume while the endpoint answers:
		// the answer is recorded all the same, and a later dispatch
		// writes the consumer's file from the ledger.
		if derr := durable(func() error { return nil }); derr != nil {
			return derr
		}
		return err
	}
	err = durable(func() error { return unix.Fsync(int(f.Fd())) })
	f.Close()
	if err != nil {
		_ = unix.Unlinkat(proc, tmp, 0)
		return err
	}
	err = placeFileAt(proc, tmp, int(st.resp.Fd()), name, true)
	if errors.Is(err, os.ErrExist) {
		err = nil
		got, rerr := readFileAt(int(st.resp.Fd()), name, spool.MaxResponseBytes+1)
		if rerr != nil || string(got) != string(data) {
			// Only a response recorded durably is ever placed, and the
			// consumer owns its file: it may chmod and rewrite it. The
			// ledger is the record, so the file is written again from it
			// (replacing) rather than the answered request failing.
			err = st.replaceResponse(tmp, name, data)
		}
	}
	if err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.DispatchResponded)
	return nil
}

// replaceResponse writes data as responses/name again, replacing the
// consumer's file: a temporary file in .processing/ (tmp), synced, then
// renamed over it.
func (st *step) replaceResponse(tmp, name string, data []byte) error {
	proc := int(st.proc.Fd())
	f, err := createFileAt(proc, tmp, data, responseMode, st.s.Layout.UID, st.s.Layout.GID)
	if err != nil {
		return err
	}
	err = unix.Fsync(int(f.Fd()))
	f.Close()
	if err != nil {
		_ = unix.Unlinkat(proc, tmp, 0)
		return fmt.Errorf("spool: write the response: %w", err)
	}
	return placeFileAt(proc, tmp, int(st.resp.Fd()), name, false)
}
