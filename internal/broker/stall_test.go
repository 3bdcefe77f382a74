package broker_test

// A sandbox that stalls the work the broker does in it stalls nobody else.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"agentbox/internal/cli"
	"agentbox/internal/inbox"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// stallUploadPack starts, in sandbox name, a process that stops (SIGSTOP)
// every git upload-pack the broker runs there: the next transfer out of
// the sandbox hangs for as long as the sandbox likes. The marker file
// appears once one was stopped.
func (e *testEnv) stallUploadPack(name string) {
	e.t.Helper()
	// /proc by hand: not every image has pkill. [k]: the loop's own
	// command line must not match its pattern.
	loop := `while :; do for p in /proc/[0-9]*; do if grep -qa 'upload-pac[k]' $p/cmdline 2>/dev/null && kill -STOP ${p#/proc/}; then touch /tmp/stalled; fi; done; sleep 0.01; done`
	e.mustExec(name, "sh", "-c", `setsid sh -c "$0" </dev/null >/dev/null 2>&1 &`, loop)
}

// TestStalledDoneStallsNobodyElse is the stall attack: a child stops its
// own upload-pack and reports done. While that done hangs in the child's
// transfer, another orchestrator's send and the host's stop of another
// sandbox answer, and the host's stop of the child ends the stalled work:
// the done answers too, with the import error.
func TestStalledDoneStallsNobodyElse(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("lead")
	e.child("kid", "lead")
	e.orchestrator("other")
	e.child("quiet", "other")
	e.child("bystander", "other")

	// 32 MiB that does not compress: the transfer lasts long enough for
	// the loop to catch its upload-pack on either backend.
	e.mustExec("kid", "sh", "-c", "head -c 33554432 /dev/urandom > work.bin && git add work.bin && "+commitCmd+" -m work")
	e.stallUploadPack("kid")
	type result struct {
		st  wire.StatusItem
		err error
	}
	doneC := make(chan result, 1)
	go func() {
		var st wire.StatusItem
		err := e.client("kid").Call(context.Background(), "send", map[string]any{"manifest": map[string]any{
			"version": 1, "id": "d-1", "type": "message", "kind": "done", "body": "done, stalled"}}, &st)
		doneC <- result{st, err}
	}()
	wait.For(t, "the kid's upload-pack stopped", func() bool {
		res, err := e.execIn("kid", "", "test", "-e", "/tmp/stalled")
		return err == nil && res.exit == 0
	})
	stillStalled := func(what string) {
		t.Helper()
		select {
		case r := <-doneC:
			t.Fatalf("the stalled done answered before %s: %+v %v", what, r.st, r.err)
		default:
		}
	}

	// Another orchestrator's message goes through meanwhile.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st wire.StatusItem
	t0 := time.Now()
	err := e.client("other").Call(ctx, "send", map[string]any{"manifest": map[string]any{
		"version": 1, "id": "m-1", "type": "message", "to": "quiet", "body": "hello"}}, &st)
	if err != nil || st.State != wire.StateDone {
		t.Fatalf("another orchestrator's send while a done stalls: %+v %v", st, err)
	}
	stillStalled("another orchestrator's send")
	t.Logf("another orchestrator's send answered in %v", time.Since(t0))
	// So does the host's stop of an unrelated sandbox.
	t0 = time.Now()
	if err := stopWithin(e, "bystander", 30*time.Second); err != nil {
		t.Fatalf("host stop of an unrelated sandbox while a done stalls: %v", err)
	}
	stillStalled("the host's stop of another sandbox")
	t.Logf("the host's stop of another sandbox answered in %v", time.Since(t0))

	// The host's stop of the stalling child ends its work in flight.
	t0 = time.Now()
	if err := stopWithin(e, "kid", 30*time.Second); err != nil {
		t.Fatalf("host stop of the stalling child: %v", err)
	}
	t.Logf("the host's stop of the stalling child answered in %v", time.Since(t0))
	var r result
	select {
	case r = <-doneC:
	case <-time.After(30 * time.Second):
		t.Fatal("the stalled done did not answer after the host stopped its sandbox")
	}
	if r.err != nil || r.st.State != wire.StateDone || r.st.Detail != "delivered to lead with an import error (could not fetch your branch into lead); this child is kept" {
		t.Fatalf("the stalled done after the stop: %+v %v", r.st, r.err)
	}
	if info := e.info("kid"); info.State != "stopped" || info.Running {
		t.Fatalf("the stopped kid: %+v", info)
	}
}

// stopWithin runs the host's stop of name with a deadline.
func stopWithin(e *testEnv, name string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c, err := inbox.Dial(ctx, e.adminPath())
	if err != nil {
		return err
	}
	defer c.Close()
	err = c.Call(ctx, "stop", wire.NameArgs{Name: name}, nil)
	if errors.Is(err, context.DeadlineExceeded) {
		return errors.New("no answer within the deadline")
	}
	return err
}

// TestStoppedTmuxHoldsNotItsOrchestrator is the stall attack on the
// agent's tmux: a child whose agent reported done stops (SIGSTOP) its
// tmux server, so every tmux command the broker runs in it hangs. Its
// orchestrator's agent_only restart of it still answers (the old agent's
// window is looked at for a bounded time), so the orchestrator's line of
// sends is not the child's to hold, and the restart's worker ends with a
// failed status instead of waiting for the child forever.
func TestStoppedTmuxHoldsNotItsOrchestrator(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "kid", "prompt": "a task", "on_done": "keep"})
	messageFrom(t, lead, "kid", "done")
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `kid` is ready; it already reported done")

	e.mustExec("kid", "sh", "-c", `kill -STOP "$(tmux display-message -p '#{pid}')"`)
	// The host's look at the panes is bounded too (30 s).
	logsC := make(chan string, 1)
	go func() {
		var out, errb bytes.Buffer
		code := cli.Run(context.Background(), "jailbee", []string{"logs", "kid", "--agent", "--state", e.state},
			cli.Deps{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
		logsC <- fmt.Sprintf("exit %d: %s", code, errb.String())
	}()
	type result struct {
		st  wire.StatusItem
		err error
	}
	restartC := make(chan result, 1)
	t0 := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var st wire.StatusItem
		err := e.client("lead").Call(ctx, "send", map[string]any{"manifest": map[string]any{
			"version": 1, "id": "r-1", "type": "restart", "child": "kid", "prompt": "again", "agent_only": true}}, &st)
		restartC <- result{st, err}
	}()
	select {
	case r := <-restartC:
		if r.err != nil || r.st.State != wire.StateStarted {
			t.Fatalf("the restart: %+v %v", r.st, r.err)
		}
		t.Logf("the restart answered in %v", time.Since(t0))
	case <-time.After(2 * time.Minute): // the agent check's 30 s, and room for a loaded machine
		// Let the stalled work end before the env's cleanup.
		stopWithin(e, "kid", 30*time.Second)
		t.Fatalf("the orchestrator's restart of a child whose tmux is stopped did not answer in 2 min")
	}
	if st := statusOf(t, lead, "r-1", "done", "failed"); st.State != wire.StateFailed {
		t.Fatalf("the restart's final status: %+v", st)
	}
	t.Logf("the restart failed after %v", time.Since(t0))
	select {
	case got := <-logsC:
		if want := "exit 1: jailbee: the agent session in kid did not answer in 30s (its tmux may be stopped)\n"; got != want {
			t.Fatalf("jb logs kid --agent: %q, want %q", got, want)
		}
	case <-time.After(time.Minute):
		t.Fatal("jb logs kid --agent did not end")
	}
	// The orchestrator's next send answers.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st wire.StatusItem
	if err := lead.Call(ctx, "send", map[string]any{"manifest": map[string]any{
		"version": 1, "id": "m-1", "type": "message", "to": "kid", "body": "hello"}}, &st); err != nil || st.State != wire.StateDone {
		t.Fatalf("the orchestrator's next send: %+v %v", st, err)
	}
}
