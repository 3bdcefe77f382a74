package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/dispatch"
	"agentbox/internal/managed/endpoint"
	"agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/spool"
)

const (
	consumer   = 1000
	secret     = "SECRET-MARKER"
	capability = "cap-" + secret + "-0123456789abcdefghijklmnop"
)

// world is one spool with its endpoint, on real files and a real socket.
type world struct {
	t     testing.TB
	s     *dispatch.Spool
	mu    sync.Mutex
	seen  map[string]int // request id -> frames the endpoint answered
	reply func(id string) string
}

func newWorld(t testing.TB, replay bool) *world {
	t.Helper()
	managedtest.RequireRoot(t)
	base := t.TempDir()
	dir := filepath.Join(base, "spool")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	policy := ""
	if replay {
		policy = "exact-digest-replay-v1"
	}
	w := &world{t: t, seen: map[string]int{}, reply: func(id string) string { return `{"ok":true,"id":"` + id + `"}` }}
	w.s = &dispatch.Spool{
		Dir: dir,
		Layout: dispatch.Layout{
			Binding:    spool.NewBinding("run-1", "requests", "endpoint", "agent", "/run/branchbox/leases/tool-requests/r", policy).Marshal(),
			Capability: []byte(capability),
			UID:        consumer, GID: consumer,
		},
		IDs:      spool.IDs{RunID: "run-1", LeaseID: "requests", Consumer: "agent"},
		Endpoint: filepath.Join(base, "ep.sock"),
		Ledger:   filepath.Join(base, "ledger", "requests"),
		Replay:   replay,
	}
	if err := os.Mkdir(filepath.Dir(w.s.Ledger), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := dispatch.Init(dir, w.s.Layout); err != nil {
		t.Fatal(err)
	}
	return w
}

// ledger reads request id's ledger file.
func (w *world) ledger(id string) spool.Ledger {
	w.t.Helper()
	data, err := os.ReadFile(filepath.Join(w.s.Ledger, id+".ledger"))
	if err != nil {
		w.t.Fatal(err)
	}
	ids := w.s.IDs
	ids.RequestID = id
	l, err := spool.ParseLedger(data, ids)
	if err != nil {
		w.t.Fatal(err)
	}
	return l
}

// serve starts the endpoint; it counts what it answers.
func (w *world) serve() {
	w.t.Helper()
	managedtest.ServeEndpoint(w.t, w.s.Endpoint, func(_ context.Context, frame []byte) ([]byte, error) {
		ids, err := endpoint.FrameIDs(frame)
		if err != nil {
			return nil, err
		}
		if strings.Contains(string(frame), capability) {
			w.t.Error("the endpoint received the capability")
		}
		w.mu.Lock()
		w.seen[ids.RequestID]++
		w.mu.Unlock()
		return []byte(w.reply(ids.RequestID)), nil
	})
}

func (w *world) count(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen[id]
}

// envelope is a valid request for id with payload.
func envelope(id, payload string) string {
	return fmt.Sprintf(`{"version":"1","run_id":"run-1","lease_id":"requests","consumer":"agent","request_id":%q,"capability":%q,"payload":%s}`,
		id, capability, payload)
}

// put spools data as requests/<name> the way a consumer does: a hidden
// temporary file of the consumer's, mode 0600, renamed into place.
func (w *world) put(name, data string) {
	w.t.Helper()
	dir := filepath.Join(w.s.Dir, dispatch.RequestsDir)
	tmp := filepath.Join(dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Chown(tmp, consumer, consumer); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) dispatch(id string, wait time.Duration) (*dispatch.Outcome, error) {
	return w.s.Dispatch(context.Background(), id, wait)
}

func terminal(t *testing.T, err error) {
	t.Helper()
	var re *dispatch.RetryableError
	if err == nil || errors.Is(err, dispatch.ErrNotPending) || errors.As(err, &re) {
		t.Fatalf("want a terminal error, got %v", err)
	}
	if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "payload-marker") {
		t.Fatalf("the error echoes the capability or the payload: %v", err)
	}
}

func TestDispatchHappyPathAndExactReplay(t *testing.T) {
	w := newWorld(t, false)
	w.serve()
	w.put("r1.json", envelope("r1", `{"payload-marker":1}`))
	out, err := w.dispatch("r1", 0)
	if err != nil || out.Cached {
		t.Fatalf("dispatch: %+v %v", out, err)
	}
	resp := filepath.Join(w.s.Dir, dispatch.ResponsesDir, "r1.json")
	var st unix.Stat_t
	if err := unix.Lstat(resp, &st); err != nil || st.Uid != consumer || st.Gid != consumer || st.Mode&0o7777 != 0o400 {
		t.Fatalf("response file: %+v %v", st, err)
	}
	data, _ := os.ReadFile(resp)
	if string(data) != string(out.Response.Bytes()) || !strings.Contains(string(data), `"payload":{"ok":true,"id":"r1"}`) {
		t.Fatalf("response file holds %q", data)
	}
	for _, sub := range []string{dispatch.RequestsDir, dispatch.ProcessingDir} {
		if names, _ := os.ReadDir(filepath.Join(w.s.Dir, sub)); len(names) != 0 {
			t.Fatalf("%s still holds %v", sub, names)
		}
	}
	// The ledger: one file, the claim then the done record.
	if names, _ := os.ReadDir(w.s.Ledger); len(names) != 1 || names[0].Name() != "r1.ledger" {
		t.Fatalf("the ledger holds %v", names)
	}
	if l := w.ledger("r1"); l.Claim == nil || l.Done == nil || l.Torn || string(l.Done.Response)+"\n" != string(data) {
		t.Fatalf("the ledger file: %+v", l)
	}
	// Recorded: asked again, with or without the request spooled again,
	// the same response and no second relay.
	for i := 0; i < 2; i++ {
		if i == 1 {
			w.put("r1.json", envelope("r1", `{"payload-marker":1}`))
		}
		again, err := w.dispatch("r1", 0)
		if err != nil || !again.Cached || string(again.Response.Bytes()) != string(data) {
			t.Fatalf("replay %d: %+v %v", i, again, err)
		}
	}
	if n := w.count("r1"); n != 1 {
		t.Fatalf("the endpoint saw r1 %d times", n)
	}
	// A changed request under the same id is terminal.
	w.put("r1.json", envelope("r1", `{"payload-marker":2}`))
	_, err = w.dispatch("r1", 0)
	terminal(t, err)
}

func TestDispatchNotPendingAndWait(t *testing.T) {
	w := newWorld(t, false)
	w.serve()
	if _, err := w.dispatch("later", 0); !errors.Is(err, dispatch.ErrNotPending) {
		t.Fatalf("nothing spooled: %v", err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		w.put("later.json", envelope("later", `{}`))
	}()
	if out, err := w.dispatch("later", 10*time.Second); err != nil || out.Cached {
		t.Fatalf("dispatch while waiting: %+v %v", out, err)
	}
	if _, err := w.dispatch("bad id", 0); err == nil || errors.Is(err, dispatch.ErrNotPending) {
		t.Fatalf("a malformed id: %v", err)
	}
}

// TestDispatchLooksAtTheDeadline: a request finalised after the last
// regular look, in the last quarter second of the wait, is still
// dispatched: the wait looks once more at the deadline. The clock is the
// test's, so where the request appears is decided, not raced.
func TestDispatchLooksAtTheDeadline(t *testing.T) {
	w := newWorld(t, false)
	w.serve()
	clock := time.Unix(1_000_000, 0)
	const wait = 600 * time.Millisecond
	deadline := clock.Add(wait)
	put := false
	dispatch.SetClockForTest(t, func() time.Time { return clock }, func(_ context.Context, d time.Duration) error {
		if !put && !clock.Add(dispatch.PollInterval).Before(deadline) {
			w.put("last.json", envelope("last", `{}`)) // after the last regular look
			put = true
		}
		clock = clock.Add(d)
		return nil
	})
	out, err := w.dispatch("last", wait)
	if err != nil || out.Cached {
		t.Fatalf("a request finalised in the last quarter second: %+v %v", out, err)
	}
	if clock.After(deadline) {
		t.Fatalf("the wait slept %v past its deadline", clock.Sub(deadline))
	}
}

// TestDispatchRefusesHostileFiles: every rule a request file breaks is
// terminal, and the endpoint sees nothing.
func TestDispatchRefusesHostileFiles(t *testing.T) {
	pad := func(total int) string {
		base := envelope("big", `""`)
		return envelope("big", `"`+strings.Repeat("x", total-len(base))+`"`)
	}
	for _, tc := range []struct {
		name  string
		setup func(w *world)
		ok    bool // the limit itself: dispatched
	}{
		{"symlink", func(w *world) {
			os.Symlink("/etc/passwd", filepath.Join(w.s.Dir, "requests", "big.json"))
		}, false},
		{"hard link", func(w *world) {
			w.put("big.json", envelope("big", `{}`))
			os.Link(filepath.Join(w.s.Dir, "requests", "big.json"), filepath.Join(w.s.Dir, "requests", ".other"))
		}, false},
		{"root-owned", func(w *world) {
			p := filepath.Join(w.s.Dir, "requests", "big.json")
			os.WriteFile(p, []byte(envelope("big", `{}`)), 0o600)
		}, false},
		{"mode 0644", func(w *world) {
			w.put("big.json", envelope("big", `{}`))
			os.Chmod(filepath.Join(w.s.Dir, "requests", "big.json"), 0o644)
		}, false},
		{"empty", func(w *world) { w.put("big.json", "") }, false},
		{"fifo", func(w *world) {
			p := filepath.Join(w.s.Dir, "requests", "big.json")
			unix.Mkfifo(p, 0o600)
			os.Chown(p, consumer, consumer)
		}, false},
		{"directory", func(w *world) {
			p := filepath.Join(w.s.Dir, "requests", "big.json")
			os.Mkdir(p, 0o700)
			os.Chown(p, consumer, consumer)
		}, false},
		{"not .json beside it", func(w *world) {
			w.put("big.json", envelope("big", `{}`))
			w.put("notes.txt", "x")
		}, false},
		{"at the size limit", func(w *world) { w.put("big.json", pad(spool.MaxRequestBytes)) }, true},
		{"one byte past it", func(w *world) { w.put("big.json", pad(spool.MaxRequestBytes+1)) }, false},
		{"16 pending", func(w *world) {
			w.put("big.json", envelope("big", `{}`))
			for i := 1; i < spool.MaxPendingRequests; i++ {
				w.put(fmt.Sprintf("o%d.json", i), envelope(fmt.Sprintf("o%d", i), `{}`))
			}
		}, true},
		{"17 pending", func(w *world) {
			w.put("big.json", envelope("big", `{}`))
			for i := 1; i <= spool.MaxPendingRequests; i++ {
				w.put(fmt.Sprintf("o%d.json", i), envelope(fmt.Sprintf("o%d", i), `{}`))
			}
		}, false},
		{"1 MiB in all", func(w *world) {
			w.put("big.json", pad(spool.MaxRequestBytes))
			w.put("a.json", pad(spool.MaxRequestBytes))
			w.put("b.json", pad(spool.MaxRequestBytes))
			w.put("c.json", pad(spool.MaxRequestBytes))
		}, true},
		{"1 MiB and a byte", func(w *world) {
			w.put("big.json", pad(spool.MaxRequestBytes))
			w.put("a.json", pad(spool.MaxRequestBytes))
			w.put("b.json", pad(spool.MaxRequestBytes))
			w.put("c.json", pad(spool.MaxRequestBytes))
			w.put(".d", "x")
		}, false},
		{"wrong capability", func(w *world) {
			w.put("big.json", strings.Replace(envelope("big", `{}`), capability, strings.Repeat("z", len(capability)), 1))
		}, false},
		{"wrong run", func(w *world) {
			w.put("big.json", strings.Replace(envelope("big", `{}`), "run-1", "run-2", 1))
		}, false},
		{"other request id inside", func(w *world) { w.put("big.json", envelope("other", `{}`)) }, false},
		{"extra field", func(w *world) {
			w.put("big.json", strings.Replace(envelope("big", `{"payload-marker":1}`), `{"version"`, `{"extra":1,"version"`, 1))
		}, false},
		{"not JSON", func(w *world) { w.put("big.json", "payload-marker "+capability) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, true)
			w.serve()
			tc.setup(w)
			_, err := w.dispatch("big", 0)
			if tc.ok {
				if err != nil {
					t.Fatalf("at the limit: %v", err)
				}
				return
			}
			terminal(t, err)
			if n := w.count("big"); n != 0 {
				t.Fatalf("the endpoint saw the request %d times", n)
			}
			if outside, err := os.Stat("/etc/passwd"); err != nil || outside.Mode()&0o777 != 0o644 {
				t.Fatalf("a file outside the spool changed: %v", err)
			}
		})
	}
}

// TestDispatchDeclineIsDispatched: a tool-level decline inside the
// payload is a successful transport.
func TestDispatchDeclineIsDispatched(t *testing.T) {
	w := newWorld(t, false)
	w.reply = func(string) string { return `{"status":"declined","reason":"use the artifact link"}` }
	w.serve()
	w.put("d.json", envelope("d", `{}`))
	if out, err := w.dispatch("d", 0); err != nil || !strings.Contains(string(out.Response.Payload), "declined") {
		t.Fatalf("%+v %v", out, err)
	}
}

// TestDispatchReplayPolicy: a relay that fails in transport is retried
// only under the signed policy, and only the persisted request.
func TestDispatchReplayPolicy(t *testing.T) {
	t.Run("signed", func(t *testing.T) {
		w := newWorld(t, true)
		w.put("x.json", envelope("x", `{}`))
		_, err := w.dispatch("x", 0) // no endpoint listening
		var re *dispatch.RetryableError
		if !errors.As(err, &re) {
			t.Fatalf("want retryable, got %v", err)
		}
		if l := w.ledger("x"); l.Claim == nil || l.Done != nil {
			t.Fatalf("after the failed relay the ledger holds %+v, want the claim alone", l)
		}
		// A changed request under the claimed id is terminal.
		w.put("x.json", envelope("x", `{"changed":true}`))
		_, err = w.dispatch("x", 0)
		terminal(t, err)
		os.Remove(filepath.Join(w.s.Dir, "requests", "x.json"))
		w.serve()
		if out, err := w.dispatch("x", 0); err != nil || out.Cached {
			t.Fatalf("retry: %+v %v", out, err)
		}
		if w.count("x") != 1 {
			t.Fatalf("the endpoint saw x %d times", w.count("x"))
		}
	})
	t.Run("unsigned", func(t *testing.T) {
		w := newWorld(t, false)
		w.put("x.json", envelope("x", `{}`))
		_, err := w.dispatch("x", 0)
		terminal(t, err)
		w.serve()
		_, err = w.dispatch("x", 0)
		terminal(t, err)
		if !strings.Contains(err.Error(), "blocked") || w.count("x") != 0 {
			t.Fatalf("the unsigned claim: %v, endpoint saw %d", err, w.count("x"))
		}
	})
}

// TestDispatchRefusesBadResponses: an uncorrelated or oversized response
// is terminal and the consumer gets no file.
func TestDispatchRefusesBadResponses(t *testing.T) {
	for _, tc := range []struct{ name, payload string }{
		{"not JSON", `not json`},
		{"oversized", `"` + strings.Repeat("y", spool.MaxResponseBytes) + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, false)
			w.reply = func(string) string { return tc.payload }
			w.serve()
			w.put("b.json", envelope("b", `{}`))
			_, err := w.dispatch("b", 0)
			if err == nil {
				t.Fatal("dispatched")
			}
			if _, err := os.Stat(filepath.Join(w.s.Dir, "responses", "b.json")); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("the consumer got a response file")
			}
		})
	}
}

// TestDispatchConcurrentSameID: two dispatchers of one id serialize on
// its lock; the endpoint sees the request once.
func TestDispatchConcurrentSameID(t *testing.T) {
	w := newWorld(t, true)
	w.serve()
	w.put("c.json", envelope("c", `{}`))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = w.dispatch("c", 5*time.Second)
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || w.count("c") != 1 {
		t.Fatalf("errors %v, endpoint saw %d", errs, w.count("c"))
	}
}

// TestDispatchBusyIsRetryable: a dispatch of an id whose ledger another
// dispatch holds past the wait is told so, retryably (not a terminal
// failure: the request is sound), and nothing is relayed twice; once the
// holder is done, the next dispatch answers from the ledger.
func TestDispatchBusyIsRetryable(t *testing.T) {
	w := newWorld(t, false)
	w.serve()
	w.put("b.json", envelope("b", `{}`))
	// Another dispatch of b, as far as the lock goes.
	if err := os.MkdirAll(w.s.Ledger, 0o700); err != nil {
		t.Fatal(err)
	}
	held, err := os.OpenFile(filepath.Join(w.s.Ledger, "b.ledger"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
		if _, err := w.dispatch("b", wait); !errors.Is(err, dispatch.ErrBusy) {
			t.Fatalf("wait %v, the id held by another dispatch: %v, want ErrBusy", wait, err)
		}
	}
	held.Close()
	if out, err := w.dispatch("b", 0); err != nil || out.Cached {
		t.Fatalf("once free: %+v %v", out, err)
	}
	if out, err := w.dispatch("b", 0); err != nil || !out.Cached || w.count("b") != 1 {
		t.Fatalf("again: %+v %v, endpoint saw %d", out, err, w.count("b"))
	}
}

func TestInitLayout(t *testing.T) {
	w := newWorld(t, true)
	for _, e := range []struct {
		name     string
		mode     uint32
		uid, gid uint32
	}{
		{".", 0o755, 0, 0}, {".binding.json", 0o444, 0, 0}, {".capability", 0o444, 0, 0},
		{"requests", 0o700, consumer, consumer}, {"responses", 0o755, 0, 0}, {".processing", 0o700, 0, 0},
	} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(w.s.Dir, e.name), &st); err != nil || st.Mode&0o7777 != e.mode || st.Uid != e.uid || st.Gid != e.gid {
			t.Errorf("%s: mode %o uid %d gid %d (%v)", e.name, st.Mode&0o7777, st.Uid, st.Gid, err)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(w.s.Dir, ".capability")); string(data) != capability {
		t.Error("the capability file")
	}
	// A second Init refuses a spool that is not empty; a changed
	// binding fails every dispatch.
	if err := dispatch.Init(w.s.Dir, w.s.Layout); err == nil {
		t.Error("Init over an initialised spool")
	}
	os.Chmod(filepath.Join(w.s.Dir, ".binding.json"), 0o644)
	_, err := w.dispatch("x", 0)
	terminal(t, err)
}

// TestDispatchStagedAndSpooledAgain: a request staged by an interrupted
// run and spooled again by the consumer is dispatched once when both are
// the same request, and refused when they differ.
func TestDispatchStagedAndSpooledAgain(t *testing.T) {
	for _, same := range []bool{true, false} {
		w := newWorld(t, false)
		w.serve()
		w.put("s.json", envelope("s", `{"n":1}`))
		// What an interrupted run leaves: the request in .processing/.
		if err := os.Rename(filepath.Join(w.s.Dir, "requests", "s.json"), filepath.Join(w.s.Dir, ".processing", "s.json")); err != nil {
			t.Fatal(err)
		}
		again := `{"n":1}`
		if !same {
			again = `{"n":2}`
		}
		w.put("s.json", envelope("s", again))
		_, err := w.dispatch("s", 0)
		if !same {
			terminal(t, err)
			continue
		}
		if err != nil || w.count("s") != 1 {
			t.Fatalf("dispatch: %v, endpoint saw %d", err, w.count("s"))
		}
		for _, sub := range []string{"requests", ".processing"} {
			if names, _ := os.ReadDir(filepath.Join(w.s.Dir, sub)); len(names) != 0 {
				t.Fatalf("%s still holds %v", sub, names)
			}
		}
	}
}

// TestDispatchTornLedgerRecord: a record cut short by a crash during its
// append was never synced, so nothing acted on it: a torn claim is no
// claim (dispatched, even without the replay policy), a torn done record
// leaves the claim (replayed under the policy); either way the torn bytes
// are cut before the next append and the consumer gets the response.
func TestDispatchTornLedgerRecord(t *testing.T) {
	t.Run("claim", func(t *testing.T) {
		w := newWorld(t, false)
		w.serve()
		w.put("t.json", envelope("t", `{}`))
		frame := mustEnvelope(t, envelope("t", `{}`)).Frame()
		rec := spool.AppendLedgerRecord(nil, spool.KindClaim, spool.NewClaim(frame).Marshal())
		w.writeLedger("t", rec[:len(rec)/2])
		if out, err := w.dispatch("t", 0); err != nil || out.Cached || w.count("t") != 1 {
			t.Fatalf("after a torn claim: %+v %v, endpoint %d", out, err, w.count("t"))
		}
		if l := w.ledger("t"); l.Torn || l.Claim == nil || l.Done == nil {
			t.Fatalf("the ledger after: %+v", l)
		}
	})
	t.Run("done", func(t *testing.T) {
		w := newWorld(t, true)
		w.put("t.json", envelope("t", `{}`))
		var re *dispatch.RetryableError
		if _, err := w.dispatch("t", 0); !errors.As(err, &re) { // no endpoint yet: the claim alone
			t.Fatalf("want retryable, got %v", err)
		}
		frame := mustEnvelope(t, envelope("t", `{}`)).Frame()
		resp, err := spool.DecodeResponse([]byte(`{"version":"1","run_id":"run-1","lease_id":"requests","consumer":"agent","request_id":"t","payload":{"torn":true}}`), spool.IDs{RunID: "run-1", LeaseID: "requests", Consumer: "agent", RequestID: "t"})
		if err != nil {
			t.Fatal(err)
		}
		done := spool.AppendLedgerRecord(nil, spool.KindDone, spool.NewDone(frame, resp).Marshal())
		w.appendLedger("t", done[:len(done)-1])
		w.serve()
		out, err := w.dispatch("t", 0)
		if err != nil || out.Cached || w.count("t") != 1 || strings.Contains(string(out.Response.Bytes()), "torn") {
			t.Fatalf("after a torn done record: %+v %v, endpoint %d", out, err, w.count("t"))
		}
		if l := w.ledger("t"); l.Torn || l.Done == nil {
			t.Fatalf("the ledger after: %+v", l)
		}
	})
}

// TestDispatchRefusesEarlierLedgerFormat: a claim of the earlier format
// (one file per record) is not read, so the request fails closed instead
// of being relayed again.
func TestDispatchRefusesEarlierLedgerFormat(t *testing.T) {
	w := newWorld(t, true)
	w.serve()
	w.put("o.json", envelope("o", `{}`))
	if err := os.MkdirAll(w.s.Ledger, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.s.Ledger, "o.claim.json"), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := w.dispatch("o", 0)
	terminal(t, err)
	if w.count("o") != 0 {
		t.Fatal("the endpoint saw the request")
	}
}

func (w *world) writeLedger(id string, data []byte) {
	w.t.Helper()
	if err := os.MkdirAll(w.s.Ledger, 0o700); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.s.Ledger, id+".ledger"), data, 0o600); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) appendLedger(id string, data []byte) {
	w.t.Helper()
	f, err := os.OpenFile(filepath.Join(w.s.Ledger, id+".ledger"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		w.t.Fatal(err)
	}
}
