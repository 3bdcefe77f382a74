package broker_test

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

func restart(id, child, prompt string, fields map[string]any) map[string]any {
	m := map[string]any{"id": id, "type": "restart", "child": child, "prompt": prompt}
	for k, v := range fields {
		m[k] = v
	}
	return m
}

// TestRestartAndAgentOnly: a running child is refused a restart ("stop it
// first") and, while its agent works, an agent_only one (busy); stopped,
// it restarts with a new prompt and its agent reports done; then an
// agent_only restart replaces that agent in its tmux window.
func TestRestartAndAgentOnly(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "busy", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `busy` is ready")

	wantStatus(t, sendManifest(t, lead, restart("r-1", "busy", "again", nil)), "refused", "`busy` is running: stop it first")
	wantStatus(t, sendManifest(t, lead, restart("r-2", "busy", "again", map[string]any{"agent_only": true})),
		"refused", "`busy` is busy: its agent is still at work and has not reported done")

	wantStatus(t, sendManifest(t, lead, map[string]any{"id": "stop-1", "type": "stop", "child": "busy"}), "done", "child `busy` stopped")
	wantStatus(t, sendManifest(t, lead, restart("r-3", "busy", "again", map[string]any{"agent_only": true})),
		"refused", "`busy` is not running: restart it without agent_only")
	if e.row("busy").StopHead == "" {
		t.Fatal("no HEAD recorded at the stop")
	}

	wantStatus(t, sendManifest(t, lead, restart("r-4", "busy", "second task", map[string]any{"runner": nil})),
		"started", "restart of child `busy` started")
	// The agent reports done at once, so before or after its readiness
	// (the report comes first: the status would consume it).
	done := messageFrom(t, lead, "busy", "done")
	if done.Body != "done: second task" || done.OnDone != "keep" {
		t.Fatalf("done after the restart: %+v", done)
	}
	st := statusOf(t, lead, "r-4", "done", "failed")
	if st.State != "done" || !strings.HasPrefix(st.Detail, "child `busy` is ready; ") {
		t.Fatalf("restart's final status %s %q", st.State, st.Detail)
	}
	if row := e.row("busy"); row.StopHead != "" || row.State != "ready" {
		t.Fatalf("after the restart: state %s, stop head %q", row.State, row.StopHead)
	}
	// ls: done (its report was accepted), and the restart's final status.
	if info := e.info("busy"); info.State != "done" || info.LastStatus == nil || info.LastStatus.Ref != "r-4" || info.LastStatus.State != "done" {
		t.Fatalf("ls after the restart's done: %+v (last status %+v)", info, info.LastStatus)
	}

	// Its agent reported done and lives on: agent_only replaces it.
	wantStatus(t, sendManifest(t, lead, restart("r-5", "busy", "third task", map[string]any{"agent_only": true})),
		"started", "restart of child `busy` started")
	if done := messageFrom(t, lead, "busy", "done"); done.Body != "done: third task" {
		t.Fatalf("done after agent_only: %+v", done)
	}
	if st := statusOf(t, lead, "r-5", "done", "failed"); st.State != "done" {
		t.Fatalf("agent_only restart: %+v", st)
	}
	if windows := e.mustExec("busy", "tmux", "list-windows", "-t", "jailbee", "-F", "#{window_name}"); windows != "scripted" {
		t.Fatalf("tmux windows after agent_only: %q", windows)
	}
	if log := readFile(t, filepath.Join(e.state, broker.LogDir, "busy.r-5.log")); !strings.Contains(log, "agent scripted ready") {
		t.Fatalf("agent_only worker log:\n%s", log)
	}
}

// TestRestartQueuedUntilASlotFrees: with max_running_children 1 a
// restart while another child runs is queued, and starts when it stops.
func TestRestartQueuedUntilASlotFrees(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestratorOneSlot("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "one", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `one` is ready")
	wantStatus(t, sendManifest(t, lead, map[string]any{"id": "stop-1", "type": "stop", "child": "one"}), "done", "child `one` stopped")
	spawn(t, lead, "s-2", map[string]any{"branch": "two", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-2", "done", "failed"), "done", "child `two` is ready")

	wantStatus(t, sendManifest(t, lead, restart("r-1", "one", "stay-busy", nil)), "queued", "queued at position 1: 1 of 1 slots are used by `two`")
	wantStatus(t, sendManifest(t, lead, restart("r-2", "one", "stay-busy", nil)), "refused", "`one` already has a restart queued")
	if info := e.info("one"); info.State != "queued" || info.Running || info.LastStatus == nil ||
		info.LastStatus.Ref != "r-1" || info.LastStatus.State != "queued" {
		t.Fatalf("one while its restart is queued: %+v (last status %+v)", info, info.LastStatus)
	}
	wantStatus(t, sendManifest(t, lead, map[string]any{"id": "stop-2", "type": "stop", "child": "two"}), "done", "child `two` stopped")
	wantStatus(t, statusOf(t, lead, "r-1", "started"), "started", "restart of child `one` started")
	wantStatus(t, statusOf(t, lead, "r-1", "done", "failed"), "done", "child `one` is ready; agent is alive")
}

// TestRestartWorkerStoppedByBrokerKill: a broker killed while a restart's
// worker waits for the agent; the next broker reports the restart failed
// and keeps the child, stopped, with its work.
func TestRestartWorkerStoppedByBrokerKill(t *testing.T) {
	state := shortTempDir(t)
	e := &testEnv{t: t, repo: makeRepo(t)}
	e.withAgent()
	bin := testbin.Jailbee(t)
	p := startProcBroker(t, bin, state)
	p.newSandbox(wire.NewArgs{Name: "lead", Repo: e.repo, Role: "orchestrator"})
	lead := p.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "kid", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `kid` is ready")
	wantStatus(t, sendManifest(t, lead, map[string]any{"id": "stop-1", "type": "stop", "child": "kid"}), "done", "child `kid` stopped")
	wantStatus(t, sendManifest(t, lead, restart("r-1", "kid", "stay-busy", nil)), "started", "restart of child `kid` started")
	wait.For(t, "the worker to reach the agent", func() bool {
		return strings.Contains(readFile(t, filepath.Join(state, broker.LogDir, "kid.r-1.log")), "agent seen")
	})
	p.kill9()
	p = startProcBroker(t, bin, state)
	lead = p.client("lead")
	wantStatus(t, statusOf(t, lead, "r-1", "done", "failed"), "failed",
		"restart of child `kid` failed: the worker stopped during agent start — the child was kept, stopped")
	var list []wire.SandboxInfo
	if err := p.adminCall("ls", nil, &list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range list {
		if s.Name == "kid" {
			found = true
			if s.State != "stopped" || s.Running {
				t.Fatalf("the child of an interrupted restart: %+v", s)
			}
		}
	}
	if !found {
		t.Fatal("the child of an interrupted restart was removed")
	}
	// It can be restarted again.
	wantStatus(t, sendManifest(t, lead, restart("r-2", "kid", "stay-busy", nil)), "started", "restart of child `kid` started")
	wantStatus(t, statusOf(t, lead, "r-2", "done", "failed"), "done", "child `kid` is ready; agent is alive")
}

// TestAgentOnlyRestartLeavesOneWatch: a watch watches one agent. The
// child (hostile, with its orchestrator) hides its agent's window right
// after a look of the watch, so that the orchestrator's agent_only
// restart finds no agent and the new agent is ready before the watch's
// next look: that watch must end rather than watch the new agent beside
// the new agent's own watch (repeated, every restart would add a watch,
// and each watch runs a command in the sandbox every 5 s). The child
// counts the looks with a tmux hook on list-panes.
func TestAgentOnlyRestartLeavesOneWatch(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "kid", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `kid` is ready")
	e.mustExec("kid", "tmux", "set-hook", "-g", "after-list-panes", "run-shell 'echo x >> /tmp/looks'")
	looks := func() int {
		n, _ := strconv.Atoi(e.mustExec("kid", "sh", "-c", "cat /tmp/looks 2>/dev/null | wc -l"))
		return n
	}
	for i := 1; i <= 3; i++ {
		// Right after a look of the watch.
		n := looks()
		wait.For(t, "a look of the watch", func() bool { return looks() > n })
		e.mustExec("kid", "tmux", "rename-window", "-t", "jailbee:=scripted", fmt.Sprintf("hidden-%d", i))
		id := fmt.Sprintf("r-%d", i)
		wantStatus(t, sendManifest(t, lead, restart(id, "kid", "stay-busy", map[string]any{"agent_only": true})),
			"started", "restart of child `kid` started")
		if st := statusOf(t, lead, id, "done", "failed"); st.State != "done" {
			t.Fatalf("restart %d: %+v", i, st)
		}
		// One watch looks every 5 s: at most 6 looks in 25 s.
		n = looks()
		time.Sleep(25 * time.Second)
		got := looks() - n
		t.Logf("restart %d: %d looks in 25 s", i, got)
		if got > 7 {
			t.Fatalf("restart %d: %d looks at the agent in 25 s: more than one watch", i, got)
		}
	}
}
