package broker_test

// The broker as a daemon: accepting through descriptor exhaustion,
// draining on Close, surviving a handler's panic.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/broker"
	"agentbox/internal/inbox"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// countFDs counts the open descriptors of process pid.
func countFDs(t testing.TB, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// callWithin runs one op on a fresh connection, giving up after d (a hang
// guard: an accept loop that ended would never answer).
func callWithin(sock, op string, args any, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c, err := inbox.Dial(ctx, sock)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(ctx, op, args, nil)
}

// TestAcceptSurvivesDescriptorExhaustion: a broker process that runs out
// of descriptors keeps its accept loops; once descriptors free up, the
// admin socket and a sandbox's socket accept again.
func TestAcceptSurvivesDescriptorExhaustion(t *testing.T) {
	bin, state, repo := jailbeeBin(t), shortTempDir(t), makeRepo(t)
	p := startProcBroker(t, bin, state)
	p.newSandbox(wire.NewArgs{Name: "orch", Repo: repo, Role: "orchestrator"})
	sock := p.socket("orch")
	if err := callWithin(sock, "list", nil, wait.Guard); err != nil {
		t.Fatal(err)
	}

	// The broker may open a few more descriptors than it has now.
	var old unix.Rlimit
	if err := unix.Prlimit(p.pid(), unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatal(err)
	}
	low := unix.Rlimit{Cur: uint64(countFDs(t, p.pid()) + 8), Max: old.Max}
	if err := unix.Prlimit(p.pid(), unix.RLIMIT_NOFILE, &low, nil); err != nil {
		t.Fatal(err)
	}
	// Idle connections until accept fails for want of descriptors: the
	// kernel queues what the broker cannot accept.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for _, path := range []string{p.adminPath(), sock} {
		for range 32 {
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
	}
	wait.For(t, "the broker to run out of descriptors", func() bool {
		return strings.Contains(p.stderr.String(), "accept failed; retrying") &&
			strings.Contains(p.stderr.String(), "too many open files")
	})

	// Descriptors free up as our connections go.
	for _, c := range held {
		c.Close()
	}
	held = nil
	wait.For(t, "the admin socket to answer again", func() bool {
		return callWithin(p.adminPath(), "ping", nil, time.Second) == nil
	})
	wait.For(t, "the sandbox socket to answer again", func() bool {
		return callWithin(sock, "list", nil, time.Second) == nil
	})
	// Still under the low limit, and again with descriptors to spare: the
	// broker does everything.
	if err := unix.Prlimit(p.pid(), unix.RLIMIT_NOFILE, &old, nil); err != nil {
		t.Fatal(err)
	}
	p.newSandbox(wire.NewArgs{Name: "kid", Repo: repo, Role: "child", Parent: "orch", Branch: "work/kid"})
	sendMessage(t, p.client("orch"), map[string]any{"id": "m-1", "to": "kid", "body": "hello"})
	if got := originIDs(unread(t, p.client("kid"))); strings.Join(got, ",") != "m-1" {
		t.Fatalf("kid's inbox: %v", got)
	}
	if res, err := adminExec(t, p.adminPath(), "kid", "", "jailbee", "inbox", "ls", "--json"); err != nil || res.exit != 0 || !strings.Contains(res.stdout, `"origin_id": "m-1"`) {
		t.Fatalf("inbox inside kid: %+v, %v", res, err)
	}
}

// TestCloseDrains: Close stops accepting, closes idle connections and
// parked nexts at once, lets a request in flight finish and deliver its
// reply, then returns.
func TestCloseDrains(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orchSock := e.sock("orch")

	idle := e.raw("orch")
	fmt.Fprintln(idle, `{"v":1,"op":"list"}`)
	if r := idle.reply(t); !r.OK {
		t.Fatal(r.Error)
	}
	adminIdle := dialRaw(t, e.adminPath())
	fmt.Fprintln(adminIdle, `{"v":1,"op":"ping"}`)
	if r := adminIdle.reply(t); !r.OK {
		t.Fatal(r.Error)
	}
	parked := e.raw("kid")
	fmt.Fprintln(parked, `{"v":1,"op":"next"}`)
	waitParked(t, e, "kid")

	entered, release := make(chan struct{}), make(chan struct{})
	e.b.SetExecHookForTest(func() {
		close(entered)
		<-release
	})
	inflight := e.raw("orch")
	fmt.Fprintln(inflight, `{"v":1,"op":"send","args":{"manifest":{"version":1,"id":"drain-1","type":"message","to":"kid","body":"x"}}}`)
	<-entered

	b := e.b
	e.b = nil
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()

	// At once: idle connections and the parked next end, without a reply.
	for what, c := range map[string]*rawConn{"idle sandbox connection": idle, "idle admin connection": adminIdle, "parked next": parked} {
		if !c.closed() {
			t.Fatalf("the %s stayed open during Close", what)
		}
	}
	// Nothing new is accepted.
	for _, path := range []string{orchSock, filepath.Join(e.state, broker.AdminSock)} {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			t.Fatalf("%s accepted a connection during Close", path)
		}
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a request in flight", err)
	default:
	}

	// The request in flight finishes and its reply is delivered.
	close(release)
	r := inflight.reply(t)
	var st wire.StatusItem
	if !r.OK || json.Unmarshal(r.Result, &st) != nil || st.State != wire.StateDone || st.Detail != "delivered to kid" {
		t.Fatalf("the send in flight during Close: %+v %s", r.Error, r.Result)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(broker.DrainTimeout + 30*time.Second):
		t.Fatal("Close did not return")
	}
	if !inflight.closed() {
		t.Fatal("the connection stayed open after Close")
	}

	e.start()
	if got := originIDs(unread(t, e.client("kid"))); strings.Join(got, ",") != "drain-1" {
		t.Fatalf("kid's inbox after the drained send: %v", got)
	}
}

// TestHandlerPanicLoggedAndServing: a panic in a request's handler is
// logged with its stack, ends only that connection, and gives back what
// the request held (its connection slot, its query slots, the executor).
func TestHandlerPanicLoggedAndServing(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")

	// More panics than the sandbox has connection and query slots.
	const panics = broker.MaxConnsPerSandbox + broker.MaxQueriesPerSandbox + 1
	var left atomic.Int32
	left.Store(panics)
	e.b.SetQueryHookForTest(func(op string) {
		if op == "list" && left.Add(-1) >= 0 {
			panic("test panic in a list handler")
		}
	})
	for i := range panics {
		c := e.raw("orch")
		fmt.Fprintln(c, `{"v":1,"op":"list"}`)
		if !c.closed() {
			t.Fatalf("panic %d: the connection was answered or kept", i+1)
		}
		c.Close()
	}
	logs := e.logs.String()
	if n := strings.Count(logs, `msg="connection handler panic" panic="test panic in a list handler"`); n != panics {
		t.Fatalf("%d panics logged, want %d:\n%s", n, panics, logs)
	}
	i := strings.Index(logs, `msg="connection handler panic"`)
	line := logs[i : i+strings.Index(logs[i:], "\n")]
	for _, frame := range []string{"stack=\"goroutine ", "broker.(*Broker).runQuery", "broker.(*Broker).serveConn"} {
		if !strings.Contains(line, frame) {
			t.Fatalf("the panic's log line has no %q:\n%s", frame, line)
		}
	}

	// Every slot comes back, and before the connection is closed: having
	// seen each panicking connection closed, a full set of connections is
	// served at once, each with a query. The set is kept open for the send
	// below.
	e.b.SetQueryHookForTest(nil)
	var full []*rawConn
	defer func() {
		for _, c := range full {
			c.Close()
		}
	}()
	for range broker.MaxConnsPerSandbox {
		c := e.raw("orch")
		fmt.Fprintln(c, `{"v":1,"op":"list"}`)
		full = append(full, c)
	}
	for i, c := range full {
		if r := c.reply(t); !r.OK {
			t.Fatalf("connection %d after the panics: %+v", i+1, r.Error)
		}
	}

	// A panic while a request holds the executor (an admin mutation).
	var once atomic.Bool
	e.b.SetExecHookForTest(func() {
		if once.CompareAndSwap(false, true) {
			panic("test panic on the executor")
		}
	})
	a := dialRaw(t, e.adminPath())
	fmt.Fprintln(a, `{"v":1,"op":"stop","args":{"name":"kid"}}`)
	if !a.closed() {
		t.Fatal("the admin connection was answered or kept after the panic")
	}
	if !strings.Contains(e.logs.String(), `panic="test panic on the executor"`) {
		t.Fatalf("the executor panic was not logged:\n%s", e.logs)
	}
	// The executor is free: sends and admin mutations run.
	fmt.Fprintln(full[0], `{"v":1,"op":"send","args":{"manifest":{"version":1,"type":"message","id":"m-1","to":"kid","body":"after"}}}`)
	if r := full[0].reply(t); !r.OK {
		t.Fatalf("send m-1 after the panic: %+v", r.Error)
	}
	if err := e.admin("stop", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatalf("stop after the panic: %v", err)
	}
	if got := e.info("kid"); got.State != "stopped" {
		t.Fatalf("kid: %+v", got)
	}
}
