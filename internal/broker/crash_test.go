package broker_test

// Crash tests: the real jailbee binary runs `jailbee broker` as a child
// process and is killed with SIGKILL right after a reply; a new broker on
// the same state dir must hold everything the reply promised.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/inbox"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// jailbeeBin is the jailbee binary built for this test process: the
// broker processes run it, and so do the units of every broker.
func jailbeeBin(t testing.TB) string { return testbin.Jailbee(t) }

// procBroker is `jailbee broker --state DIR` running as a child process.
type procBroker struct {
	t      testing.TB
	bin    string
	state  string
	cmd    *exec.Cmd
	stderr *wait.Buffer
	exited chan struct{}
}

// startProcBroker starts the broker and waits until its admin socket
// answers ping. It is killed at the end of the test.
func startProcBroker(t testing.TB, bin, state string) *procBroker {
	t.Helper()
	return startProcBrokerVia(t, bin, state, nil)
}

// startProcBrokerVia is startProcBroker with the broker run by a wrapper:
// wrapper's arguments, then the broker's (a shell that execs it keeps its
// pid).
func startProcBrokerVia(t testing.TB, bin, state string, wrapper []string) *procBroker {
	t.Helper()
	p := &procBroker{t: t, bin: bin, state: state, stderr: &wait.Buffer{}, exited: make(chan struct{})}
	// It runs its units from its own executable, the testbin jailbee, and
	// its sandboxes under <state>/sandboxes, which shortTempDir's cleanup
	// destroys; the default broker.yaml (none in the state dir) applies.
	args := append(append([]string{}, wrapper...), bin, "broker", "--state", state)
	if noLimits() {
		args = append(args, "--no-limits")
	}
	p.cmd = exec.Command(args[0], args[1:]...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.kill9)
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.exited:
			t.Fatalf("broker exited at start (%v):\n%s", p.cmd.ProcessState, p.stderr)
		default:
		}
		if err := p.adminCall("ping", nil, nil); err == nil {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker did not answer ping within 30 s:\n%s", p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill9 sends SIGKILL and waits for the process to be gone.
func (p *procBroker) kill9() {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// pid returns the broker's process id.
func (p *procBroker) pid() int { return p.cmd.Process.Pid }

// adminPath is the broker's admin socket.
func (p *procBroker) adminPath() string { return filepath.Join(p.state, broker.AdminSock) }

// adminCall runs one admin op on a fresh admin connection.
func (p *procBroker) adminCall(op string, args, result any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := inbox.Dial(ctx, p.adminPath())
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(ctx, op, args, result)
}

// newSandbox creates a sandbox through the admin new op.
func (p *procBroker) newSandbox(a wire.NewArgs) {
	p.t.Helper()
	if err := p.adminCall("new", a, nil); err != nil {
		p.t.Fatalf("new %s: %v\n%s", a.Name, err, p.stderr)
	}
}

// socket returns a sandbox's socket path, as `ls` reports it. A starting
// broker answers on its admin socket before it serves the sandboxes'
// sockets: wait for it.
func (p *procBroker) socket(name string) string {
	p.t.Helper()
	var list []wire.SandboxInfo
	deadline := time.Now().Add(wait.Guard)
	for {
		if err := p.adminCall("ls", nil, &list); err != nil {
			p.t.Fatal(err)
		}
		for _, sb := range list {
			if sb.Name == name && sb.Socket != nil {
				return *sb.Socket
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("sandbox %s has no socket in ls: %+v\n%s", name, list, p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// client dials a sandbox's socket.
func (p *procBroker) client(name string) *inbox.Client {
	p.t.Helper()
	c, err := inbox.Dial(context.Background(), p.socket(name))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { c.Close() })
	return c
}

// raw dials a sandbox's socket for hand-written lines.
func (p *procBroker) raw(name string) *rawConn {
	p.t.Helper()
	conn, err := net.Dial("unix", p.socket(name))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { conn.Close() })
	return &rawConn{Conn: conn, r: bufio.NewReader(conn)}
}

// crashFamily starts a process broker with orchestrator "orch" and its
// child "kid".
func crashFamily(t *testing.T) (bin, state, repo string, p *procBroker) {
	t.Helper()
	bin, state, repo = jailbeeBin(t), shortTempDir(t), makeRepo(t)
	p = startProcBroker(t, bin, state)
	p.newSandbox(wire.NewArgs{Name: "orch", Repo: repo, Role: "orchestrator"})
	p.newSandbox(wire.NewArgs{Name: "kid", Repo: repo, Branch: "work/kid", Role: "child", Parent: "orch"})
	return bin, state, repo, p
}

// listAll returns a sandbox's whole inbox (unread and read history).
func listAll(t *testing.T, c *inbox.Client) wire.ListResult {
	t.Helper()
	var res wire.ListResult
	if err := c.Call(context.Background(), "list", wire.ListArgs{All: true}, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// originIDs returns the origin ids of messages, in order.
func originIDs(items []wire.MessageItem) []string {
	out := []string{}
	for _, it := range items {
		out = append(out, it.OriginID)
	}
	return out
}

// idOfOrigin finds the host id of the message whose origin_id is origin.
func idOfOrigin(t *testing.T, items []wire.MessageItem, origin string) string {
	t.Helper()
	for _, it := range items {
		if it.OriginID == origin {
			return it.ID
		}
	}
	t.Fatalf("no message with origin_id %s in %v", origin, originIDs(items))
	return ""
}

func TestCrashRightAfterSendReplyKeepsEverything(t *testing.T) {
	bin, state, _, p := crashFamily(t)
	orch, kid := p.client("orch"), p.client("kid")

	// History before the crash: kid read m-0, m-1 is still unread.
	sendMessage(t, orch, map[string]any{"id": "m-0", "to": "kid", "body": "zero"})
	sendMessage(t, orch, map[string]any{"id": "m-1", "to": "kid", "body": "one"})
	read0 := idOfOrigin(t, unread(t, kid), "m-0")
	if err := kid.Call(context.Background(), "read", wire.ReadArgs{ID: read0}, nil); err != nil {
		t.Fatal(err)
	}

	// The send whose reply is the last thing before SIGKILL.
	st := sendMessage(t, orch, map[string]any{"id": "m-2", "to": "kid", "body": "two"})
	p.kill9()
	if st.State != wire.StateDone || st.Ref != "m-2" {
		t.Fatalf("send reply before the crash: %+v", st)
	}

	p = startProcBroker(t, bin, state)
	orch, kid = p.client("orch"), p.client("kid")

	// The child has m-1 and m-2 unread, once each, and m-0 in its history.
	if got := originIDs(unread(t, kid)); strings.Join(got, ",") != "m-1,m-2" {
		t.Fatalf("kid's unread after the crash: %v, want [m-1 m-2]", got)
	}
	all := listAll(t, kid)
	if len(all.Items) != 3 || len(all.ReadIDs) != 1 || all.ReadIDs[0] != read0 {
		t.Fatalf("kid's history after the crash: %d items, read %v; want 3 items, read [%s]", len(all.Items), all.ReadIDs, read0)
	}

	// The orchestrator's status for m-2 is recorded: status answers it, and
	// a resend returns the same status and delivers nothing new.
	var byRef wire.StatusItem
	if err := orch.Call(context.Background(), "status", wire.StatusArgs{Ref: "m-2"}, &byRef); err != nil {
		t.Fatalf("status m-2 after the crash: %v", err)
	}
	if byRef.ID != st.ID || byRef.State != wire.StateDone {
		t.Fatalf("status m-2 after the crash: %+v, want %+v", byRef, st)
	}
	again := sendMessage(t, orch, map[string]any{"id": "m-2", "to": "kid", "body": "two"})
	if again != st {
		t.Fatalf("resend of m-2 after the crash: %+v, want the same status %+v", again, st)
	}
	if n := len(unread(t, kid)); n != 2 {
		t.Fatalf("the resend delivered again: kid has %d unread, want 2", n)
	}
	// The send replies' statuses are the orchestrator's read history.
	if hist := listAll(t, orch); len(hist.Items) != 3 || len(hist.ReadIDs) != 3 {
		t.Fatalf("orch's history after the crash: %d items, %d read; want 3 statuses, all read", len(hist.Items), len(hist.ReadIDs))
	}
}

func TestCrashRightAfterReadReplyKeepsItRead(t *testing.T) {
	bin, state, _, p := crashFamily(t)
	sendMessage(t, p.client("orch"), map[string]any{"id": "r-1", "to": "kid", "body": "read me"})
	sendMessage(t, p.client("orch"), map[string]any{"id": "r-2", "to": "kid", "body": "later"})
	kid := p.client("kid")
	id := idOfOrigin(t, unread(t, kid), "r-1")

	var got wire.MessageItem
	if err := kid.Call(context.Background(), "read", wire.ReadArgs{ID: id}, &got); err != nil {
		t.Fatal(err)
	}
	p.kill9()
	if got.ID != id || got.Body != "read me" {
		t.Fatalf("read reply before the crash: %+v", got)
	}

	p = startProcBroker(t, bin, state)
	kid = p.client("kid")
	if left := originIDs(unread(t, kid)); strings.Join(left, ",") != "r-2" {
		t.Fatalf("kid's unread after the crash: %v, want [r-2]", left)
	}
	if all := listAll(t, kid); len(all.ReadIDs) != 1 || all.ReadIDs[0] != id {
		t.Fatalf("read history after the crash: %v, want [%s]", all.ReadIDs, id)
	}
	var we *wire.Error
	if err := kid.Call(context.Background(), "read", wire.ReadArgs{ID: id}, nil); !errors.As(err, &we) || we.Code != wire.CodeNotFound {
		t.Fatalf("reading %s again after the crash: %v, want not_found", id, err)
	}
}

// waitProcParked waits until the next written on parked holds the
// sandbox's park slot: a probe next with quiet_after_ms=1 is then refused
// busy. A probe that wins the slot instead answers quiet, and if the
// parked request lost the race and was answered busy, it is written again.
func waitProcParked(t *testing.T, p *procBroker, name string, parked *rawConn, line string) {
	t.Helper()
	probe := p.raw(name)
	for range 500 {
		fmt.Fprintln(probe, `{"v":1,"op":"next","args":{"quiet_after_ms":1}}`)
		r := probe.reply(t)
		if !r.OK && r.Error.Code == wire.CodeBusy {
			return
		}
		parked.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		if reply, err := wire.ReadLine(parked.r, wire.MaxLineBytes); err == nil {
			if !bytes.Contains(reply, []byte(`"busy"`)) {
				t.Fatalf("the parked next was answered: %s", reply)
			}
			fmt.Fprintln(parked, line)
		}
		parked.SetReadDeadline(time.Time{})
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("next never parked")
}

func TestCrashWhileNextParked(t *testing.T) {
	bin, state, _, p := crashFamily(t)
	parked := p.raw("kid")
	const nextLine = `{"v":1,"op":"next"}`
	fmt.Fprintln(parked, nextLine)
	waitProcParked(t, p, "kid", parked, nextLine)
	p.kill9()
	// The client of the parked next sees the connection end, no reply.
	if !parked.closed() {
		t.Fatal("the parked next's connection survived SIGKILL of the broker")
	}

	p = startProcBroker(t, bin, state)
	// No park slot is left over: a next parks again (quiet, not busy)...
	kid := p.client("kid")
	var res wire.NextResult
	if err := kid.Call(context.Background(), "next", wire.NextArgs{QuietAfterMS: 50}, &res); err != nil || !res.Quiet {
		t.Fatalf("next after the crash: %+v, %v; want quiet", res, err)
	}
	// ...and a parked next is woken by a delivery.
	again := p.raw("kid")
	fmt.Fprintln(again, nextLine)
	waitProcParked(t, p, "kid", again, nextLine)
	sendMessage(t, p.client("orch"), map[string]any{"id": "wake", "to": "kid", "body": "up"})
	r := again.reply(t)
	var woke wire.NextResult
	var m wire.MessageItem
	json.Unmarshal(r.Result, &woke)
	json.Unmarshal(woke.Item, &m)
	if !r.OK || m.OriginID != "wake" {
		t.Fatalf("parked next after the crash woke with %+v %s", r.Error, r.Result)
	}
}

func TestSecondBrokerProcessRefusedUntilFirstKilled(t *testing.T) {
	bin, state := jailbeeBin(t), shortTempDir(t)
	first := startProcBroker(t, bin, state)
	// The start line names the state dir and the broker's pid.
	wait.For(t, "the start line", func() bool { return strings.Contains(first.stderr.String(), "broker serving") })
	if line := first.stderr.String(); !strings.Contains(line, "state_dir="+state) || !strings.Contains(line, fmt.Sprintf("pid=%d", first.pid())) {
		t.Fatalf("the start line names no state dir or pid:\n%s", line)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	second := exec.CommandContext(ctx, bin, "broker", "--state", state)
	second.Stderr = &stderr
	err := second.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("second broker on a held state dir: %v, want exit 1\n%s", err, stderr.String())
	}
	if want := fmt.Sprintf("another broker holds the state dir %s (pid %d)", state, first.pid()); !strings.Contains(stderr.String(), want) {
		t.Fatalf("second broker's message: %q", stderr.String())
	}
	// The refused broker did not disturb the first.
	if err := first.adminCall("ping", nil, nil); err != nil {
		t.Fatalf("first broker after the refused second: %v", err)
	}

	first.kill9()
	startProcBroker(t, bin, state) // serves: it answers ping
}
