package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/inbox"
	"agentbox/internal/orchestrate"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// agentConfig runs the scripted agent (testdata/agent/agent.sh) as the
// repository's default agent.
const agentConfig = `agents:
  scripted:
    command: "sh .jailbee/agent.sh"
    prompt_args: ["{prompt}"]
default_agent: scripted
`

// withAgent commits the scripted agent and its config to the env's host
// repository (before sandboxes are made from it).
func (e *testEnv) withAgent() {
	e.t.Helper()
	e.withAgentConfig(agentConfig)
}

// withAgentConfig is withAgent with config as the repository config.
func (e *testEnv) withAgentConfig(config string) {
	e.t.Helper()
	script, err := os.ReadFile(filepath.Join("..", "..", "testdata", "agent", "agent.sh"))
	if err != nil {
		e.t.Fatal(err)
	}
	dir := filepath.Join(e.repo, ".jailbee")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agent.sh"), script, 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(config), 0o644); err != nil {
		e.t.Fatal(err)
	}
	hostGit(e.t, e.repo, "add", ".jailbee")
	hostGit(e.t, e.repo, "commit", "-q", "-m", "the scripted agent")
}

// spawn sends a spawn manifest and returns its first status.
func spawn(t testing.TB, c *inbox.Client, id string, fields map[string]any) wire.StatusItem {
	t.Helper()
	m := map[string]any{"id": id, "type": "spawn", "kind": "fork", "rights": map[string]any{"mounts": []string{}, "loose": false, "egress": []string{}}}
	for k, v := range fields {
		m[k] = v
	}
	return sendManifest(t, c, m)
}

// backlog keeps, per client, the items a wait read (and acknowledged)
// without wanting them, oldest first: a later wait for one of them finds
// it there, whatever order two waited-for items arrived in.
var backlog = struct {
	sync.Mutex
	items map[*inbox.Client][]json.RawMessage
}{items: map[*inbox.Client][]json.RawMessage{}}

// fromBacklog takes the oldest item of c's backlog that match accepts.
func fromBacklog(c *inbox.Client, match func(raw json.RawMessage) bool) (json.RawMessage, bool) {
	backlog.Lock()
	defer backlog.Unlock()
	for i, raw := range backlog.items[c] {
		if match(raw) {
			backlog.items[c] = slices.Delete(backlog.items[c], i, i+1)
			return raw, true
		}
	}
	return nil, false
}

func toBacklog(c *inbox.Client, raw json.RawMessage) {
	backlog.Lock()
	defer backlog.Unlock()
	backlog.items[c] = append(backlog.items[c], raw)
}

// nextItem waits for the next item of c's inbox that match accepts,
// acknowledging what it reads: from the backlog of earlier waits, else
// unread.
func nextItem(t testing.TB, c *inbox.Client, match func(raw json.RawMessage) bool) json.RawMessage {
	t.Helper()
	if raw, ok := fromBacklog(c, match); ok {
		return raw
	}
	deadline := time.Now().Add(wait.Guard + 150*time.Second) // a spawn's agent has 120 s
	for time.Now().Before(deadline) {
		var res wire.ListResult
		if err := c.Call(context.Background(), "list", nil, &res); err != nil {
			t.Fatal(err)
		}
		for _, raw := range res.Items {
			var it struct {
				ID string `json:"id"`
			}
			json.Unmarshal(raw, &it)
			c.Call(context.Background(), "ack", map[string]any{"id": it.ID}, nil)
			if match(raw) {
				return raw
			}
			toBacklog(c, raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("timed out waiting for an inbox item")
	return nil
}

// statusOf waits for a status of manifest ref in a final state (or one of
// states).
func statusOf(t testing.TB, c *inbox.Client, ref string, states ...string) wire.StatusItem {
	t.Helper()
	var st wire.StatusItem
	nextItem(t, c, func(raw json.RawMessage) bool {
		st = wire.StatusItem{}
		json.Unmarshal(raw, &st)
		if st.Type != wire.ItemStatus || st.Ref != ref {
			return false
		}
		for _, s := range states {
			if st.State == s {
				return true
			}
		}
		return false
	})
	return st
}

// messageFrom waits for a message of kind from sandbox from.
func messageFrom(t testing.TB, c *inbox.Client, from, kind string) wire.MessageItem {
	t.Helper()
	var m wire.MessageItem
	nextItem(t, c, func(raw json.RawMessage) bool {
		m = wire.MessageItem{} // absent fields must not keep an earlier item's values
		json.Unmarshal(raw, &m)
		return m.Type == wire.ItemMessage && m.From == from && m.Kind == kind
	})
	return m
}

var fullSHA = regexp.MustCompile(`^[0-9a-f]{40}$`)

// TestSpawnForkToDoneAndImport: the job, end to end. A fork spawn starts
// the child from the orchestrator's HEAD, its agent (the scripted one)
// commits and reports done; the report arrives imported at the child's
// exact commit in the orchestrator's repository, and the child is
// destroyed (on_done defaults to destroy with the default grant). The
// prompt ends in ';', which tmux's command line would take for the end of
// its command: the agent must get it whole.
func TestSpawnForkToDoneAndImport(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	leadHead := e.mustExec("lead", "git", "rev-parse", "HEAD")

	wantStatus(t, spawn(t, lead, "spawn-a", map[string]any{"branch": "fix/a", "prompt": "fix A; run the tests;", "note": "task A"}),
		"started", "creation of child `fix-a` started")
	done := messageFrom(t, lead, "fix-a", "done")
	if done.ImportedRef != "refs/jailbee/from/fix-a/fix/a" || !fullSHA.MatchString(done.ImportedSHA) || done.OnDone != "destroy" || done.ImportError != "" {
		t.Fatalf("done report: %+v", done)
	}
	if done.Body != "done: fix A; run the tests;" || done.OriginID == "" {
		t.Fatalf("done report body %q origin %q", done.Body, done.OriginID)
	}
	// The import is the agent's commit, on top of the orchestrator's HEAD.
	if got := e.mustExec("lead", "git", "rev-parse", done.ImportedRef); got != done.ImportedSHA {
		t.Fatalf("%s in lead = %s, want %s", done.ImportedRef, got, done.ImportedSHA)
	}
	if got := e.mustExec("lead", "git", "rev-parse", done.ImportedSHA+"~1"); got != leadHead {
		t.Fatalf("the child's commit's parent is %s, want the orchestrator's HEAD %s", got, leadHead)
	}
	if got := e.mustExec("lead", "git", "show", "-s", "--format=%s", done.ImportedSHA); got != "agent: fix A; run the tests;" {
		t.Fatalf("imported commit %q", got)
	}
	st := statusOf(t, lead, "spawn-a", "done", "failed")
	if st.State != "done" || !strings.HasPrefix(st.Detail, "child `fix-a` is ready") {
		t.Fatalf("spawn's final status %s %q", st.State, st.Detail)
	}
	wait.For(t, "the done child to be destroyed", func() bool {
		for _, s := range e.list() {
			if s.Name == "fix-a" {
				return false
			}
		}
		return true
	})
	logs, _ := filepath.Glob(filepath.Join(e.state, broker.LogDir, "fix-a.spawn-a.log"))
	if len(logs) != 1 {
		t.Fatalf("worker log: %v", logs)
	}
	data, _ := os.ReadFile(logs[0])
	if !strings.Contains(string(data), "agent scripted ready") {
		t.Fatalf("worker log:\n%s", data)
	}
}

// TestSpawnQueuedUntilASlotFrees: with max_running_children 1 a second
// spawn is queued at position 1, its status naming the child that holds
// the slot, and starts when the first child stops.
func TestSpawnQueuedUntilASlotFrees(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestratorOneSlot("lead")
	lead := e.client("lead")
	wantStatus(t, spawn(t, lead, "spawn-1", map[string]any{"branch": "one", "prompt": "one", "on_done": "keep"}),
		"started", "creation of child `one` started")
	wantStatus(t, spawn(t, lead, "spawn-2", map[string]any{"branch": "two", "prompt": "two", "on_done": "keep"}),
		"queued", "queued at position 1: 1 of 1 slots are used by `one`")
	wantStatus(t, spawn(t, lead, "spawn-3", map[string]any{"branch": "three", "prompt": "three", "on_done": "keep"}),
		"queued", "queued at position 2: 1 of 1 slots are used by `one`")
	if st := statusOf(t, lead, "spawn-1", "done", "failed"); st.State != "done" {
		t.Fatalf("spawn-1: %+v", st)
	}
	if info := e.info("two"); info.State != "queued" {
		t.Fatalf("two while one runs: %+v", info)
	}
	wantStatus(t, sendManifest(t, lead, map[string]any{"id": "stop-1", "type": "stop", "child": "one"}), "done", "child `one` stopped")
	wantStatus(t, statusOf(t, lead, "spawn-2", "started"), "started", "creation of child `two` started")
	if st := statusOf(t, lead, "spawn-2", "done", "failed"); st.State != "done" {
		t.Fatalf("spawn-2: %+v", st)
	}
	if info := e.info("three"); info.State != "queued" {
		t.Fatalf("three while two runs: %+v", info)
	}
}

// TestSpawnRefusals: what a spawn cannot run is refused at once.
func TestSpawnRefusals(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	e.mustExec("lead", "touch", "prompt.md")
	wantStatus(t, spawn(t, lead, "s-dirty", map[string]any{"branch": "x", "prompt": "p"}),
		"refused", "uncommitted changes: a fork starts from your committed HEAD; commit or remove them (prompt files too) before spawning")
	e.mustExec("lead", "rm", "prompt.md")
	wantStatus(t, spawn(t, lead, "s-ok", map[string]any{"branch": "x", "prompt": "p", "on_done": "keep"}),
		"started", "creation of child `x` started")
	wantStatus(t, spawn(t, lead, "s-taken", map[string]any{"branch": "X", "prompt": "p"}),
		"refused", "`x` already exists")
	wantStatus(t, spawn(t, lead, "s-ref", map[string]any{"version": 2, "branch": "y", "ref": "refs/heads/nope", "prompt": "p"}),
		"refused", "`ref` refs/heads/nope names no commit in your repository")
	statusOf(t, lead, "s-ok", "done", "failed")
}

// TestSpawnNewAndRef: kind new starts from the host repository's base;
// a version 2 fork with ref starts from that commit of the orchestrator.
func TestSpawnNewAndRef(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	hostHead := hostGit(t, e.repo, "rev-parse", "HEAD")
	e.orchestrator("lead")
	lead := e.client("lead")
	e.mustExec("lead", "sh", "-c", "git -c user.name=L -c user.email=l@example.com commit -q --allow-empty -m lead-work")
	leadWork := e.mustExec("lead", "git", "rev-parse", "HEAD")

	wantStatus(t, spawn(t, lead, "s-new", map[string]any{"kind": "new", "base": "main", "branch": "fresh", "prompt": "new work"}),
		"started", "creation of child `fresh` started")
	done := messageFrom(t, lead, "fresh", "done")
	if got := e.mustExec("lead", "git", "rev-parse", done.ImportedSHA+"~1"); got != hostHead {
		t.Fatalf("kind new started from %s, want the host base %s", got, hostHead)
	}
	wantStatus(t, spawn(t, lead, "s-ref", map[string]any{"version": 2, "branch": "from-ref", "ref": leadWork, "prompt": "ref work"}),
		"started", "creation of child `from-ref` started")
	done = messageFrom(t, lead, "from-ref", "done")
	if got := e.mustExec("lead", "git", "rev-parse", done.ImportedSHA+"~1"); got != leadWork {
		t.Fatalf("fork with ref started from %s, want %s", got, leadWork)
	}
}

// TestSpawnPR: kind pr starts the child (branch pr/N unless named) from
// refs/pull/N/head of the host repository's origin, a local bare
// repository here; a pull request the remote does not have fails the
// spawn in its cloning phase.
func TestSpawnPR(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	origin := filepath.Join(t.TempDir(), "origin.git")
	hostGit(t, "", "init", "-q", "--bare", origin)
	hostGit(t, e.repo, "remote", "add", "origin", origin)
	hostGit(t, e.repo, "checkout", "-q", "-b", "contributor")
	hostGit(t, e.repo, "commit", "-q", "--allow-empty", "-m", "the pull request")
	prHead := hostGit(t, e.repo, "rev-parse", "HEAD")
	hostGit(t, e.repo, "push", "-q", "origin", "HEAD:refs/pull/7/head")
	hostGit(t, e.repo, "checkout", "-q", "main")
	hostGit(t, e.repo, "branch", "-q", "-D", "contributor")
	e.orchestrator("lead")
	lead := e.client("lead")

	wantStatus(t, spawn(t, lead, "s-pr", map[string]any{"version": 2, "kind": "pr", "pr": 7, "prompt": "review it"}),
		"started", "creation of child `pr-7` started")
	done := messageFrom(t, lead, "pr-7", "done")
	if done.ImportedRef != "refs/jailbee/from/pr-7/pr/7" {
		t.Fatalf("done report of the PR child: %+v", done)
	}
	if got := e.mustExec("lead", "git", "rev-parse", done.ImportedSHA+"~1"); got != prHead {
		t.Fatalf("the PR child started from %s, want the PR head %s", got, prHead)
	}
	if got := hostGit(t, e.repo, "rev-parse", "refs/jailbee/pr/7"); got != prHead {
		t.Fatalf("refs/jailbee/pr/7 in the host repository = %s", got)
	}

	wantStatus(t, spawn(t, lead, "s-pr-8", map[string]any{"version": 2, "kind": "pr", "pr": 8, "branch": "review/8", "prompt": "p"}),
		"started", "creation of child `review-8` started")
	wantStatus(t, statusOf(t, lead, "s-pr-8", "done", "failed"), "failed",
		"creation of child `review-8` failed: see the worker log during cloning — the child was removed")
	if log := readFile(t, filepath.Join(e.state, broker.LogDir, "review-8.s-pr-8.log")); !strings.Contains(log, "refs/pull/8/head") {
		t.Fatalf("the worker log does not say what failed:\n%s", log)
	}
}

// TestDoneRefusedDirtyThenAccepted: a done report with uncommitted
// changes is refused with the spec's text; the agent commits and reports
// again, and that report is accepted and imported.
func TestDoneRefusedDirtyThenAccepted(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-dirty", map[string]any{"branch": "d", "prompt": "dirty work", "on_done": "keep"})
	done := messageFrom(t, lead, "d", "done")
	if done.Body != "done: dirty work" || done.ImportedSHA == "" {
		t.Fatalf("accepted report: %+v", done)
	}
	// The child's own history holds the refusal of its first report.
	var res wire.ListResult
	if err := e.client("d").Call(context.Background(), "list", map[string]any{"all": true}, &res); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, raw := range res.Items {
		var st wire.StatusItem
		json.Unmarshal(raw, &st)
		if st.State == "refused" && st.Detail == "uncommitted changes: commit everything before reporting done" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no refused first report in the child's history: %s", res.Items)
	}
	statusOf(t, lead, "s-dirty", "done", "failed")
	if info := e.info("d"); info.State != "done" || !info.Running {
		t.Fatalf("a kept done child: %+v", info)
	}
}

// TestAgentEndsEarlyOrWithoutDone: an agent that ends before it is ready
// fails its spawn (the child kept, stopped); one that ends after, without
// a done report, sends the orchestrator a message of kind blocked.
func TestAgentEndsEarlyOrWithoutDone(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-early", map[string]any{"branch": "early", "prompt": "exit-early"})
	spawn(t, lead, "s-later", map[string]any{"branch": "later", "prompt": "exit-later"})
	wantStatus(t, statusOf(t, lead, "s-early", "done", "failed"), "failed",
		"creation of child `early` failed: the agent ended before it was ready during agent start — the child was kept, stopped")
	if info := e.info("early"); info.State != "failed" || info.Running {
		t.Fatalf("a failed spawn's child: %+v", info)
	}
	wantStatus(t, statusOf(t, lead, "s-later", "done", "failed"), "done", "child `later` is ready")
	blocked := messageFrom(t, lead, "later", "blocked")
	if blocked.OriginID != "" || !strings.Contains(blocked.Body, "ended without reporting done") {
		t.Fatalf("blocked message: %+v", blocked)
	}
	// An agent that ended may be replaced in the running child.
	wantStatus(t, sendManifest(t, lead, restart("r-1", "later", "after blocked", map[string]any{"agent_only": true})),
		"started", "restart of child `later` started")
	if done := messageFrom(t, lead, "later", "done"); done.Body != "done: after blocked" {
		t.Fatalf("done after agent_only: %+v", done)
	}
	// A failed spawn's kept child survives a broker restart as it was.
	e.restart()
	if info := e.info("early"); info.State != "failed" || info.Running {
		t.Fatalf("the failed spawn's child after a broker restart: %+v", info)
	}
}

// TestAgentEndsAfterDone: an agent that reports done (accepted) and then
// exits, before the broker has seen it ready, is a finished child, not a
// failed one: the spawn's final status says it already reported done, no
// blocked message follows, and the child is what its done status said
// (kept running, or destroyed).
func TestAgentEndsAfterDone(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	for _, c := range []struct{ ref, child, onDone string }{{"s-keep", "kept", "keep"}, {"s-gone", "gone", "destroy"}} {
		spawn(t, lead, c.ref, map[string]any{"branch": c.child, "prompt": "end-after-done", "on_done": c.onDone})
		if done := messageFrom(t, lead, c.child, "done"); done.Body != "done: end-after-done" || done.OnDone != c.onDone {
			t.Fatalf("%s's report: %+v", c.child, done)
		}
		// Its report (with nothing to commit first) is accepted well
		// before its readiness (two looks two seconds apart) can be.
		wantStatus(t, statusOf(t, lead, c.ref, "done", "failed"), "done", "child `"+c.child+"` is ready; it already reported done")
	}
	if info := e.info("kept"); info.State != "done" || !info.Running {
		t.Fatalf("the kept child: %+v", info)
	}
	wait.For(t, "the other child to be destroyed", func() bool {
		return !slices.ContainsFunc(e.list(), func(sb wire.SandboxInfo) bool { return sb.Name == "gone" })
	})
}

// TestSpawnWorkerStoppedByBrokerKill: a broker killed while a spawn's
// worker waits for its agent leaves the spawn creating; the next broker
// reports it failed, names the phase, and removes the child.
func TestSpawnWorkerStoppedByBrokerKill(t *testing.T) {
	state := shortTempDir(t)
	e := &testEnv{t: t, repo: makeRepo(t)}
	e.withAgent()
	bin := testbin.Jailbee(t)
	p := startProcBroker(t, bin, state)
	p.newSandbox(wire.NewArgs{Name: "lead", Repo: e.repo, Role: "orchestrator"})
	lead := p.client("lead")
	wantStatus(t, spawn(t, lead, "s-1", map[string]any{"branch": "slow", "prompt": "exit-later"}), "started", "creation of child `slow` started")
	// The worker is at its agent's readiness for at least two seconds.
	wait.For(t, "the worker to reach the agent", func() bool {
		return strings.Contains(readFile(t, filepath.Join(state, broker.LogDir, "slow.s-1.log")), "agent seen")
	})
	p.kill9()
	p = startProcBroker(t, bin, state)
	lead = p.client("lead")
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "failed",
		"creation of child `slow` failed: the worker stopped during agent start — the child was removed")
	var list []wire.SandboxInfo
	if err := p.adminCall("ls", nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.Name == "slow" {
			t.Fatalf("the child of an interrupted spawn is still listed: %+v", s)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "sandboxes", "slow")); !os.IsNotExist(err) {
		t.Fatalf("the child's sandbox directory: %v", err)
	}
}

func readFile(t testing.TB, path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// TestStartOfARunningChild: starting a child that runs changes nothing: no
// note that its agent was not started, and it stays ready (its agent
// watched).
func TestStartOfARunningChild(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "busy", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `busy` is ready")
	var res wire.StartResult
	if err := e.admin("start", wire.NameArgs{Name: "busy"}, &res); err != nil || res.Note != "" {
		t.Fatalf("start of a running child: %v %+v", err, res)
	}
	if info := e.info("busy"); info.State != "ready" || !info.Running {
		t.Fatalf("the child after its start: %+v", info)
	}
}

// TestSpawnQueueDrainsUnderConcurrentSlotFrees: ten queued spawns through
// two slots, each child's agent ending at once, so two workers fail and
// start the queue together in every round. Each child gets one worker:
// one started status and one final status per spawn, one host uid per
// sandbox made, and no socket directory left once all are destroyed.
func TestSpawnQueueDrainsUnderConcurrentSlotFrees(t *testing.T) {
	localOnly(t, "host uids")
	const children = 10
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead") // the default grant: two slots
	lead := e.client("lead")
	for i := range children {
		spawn(t, lead, fmt.Sprintf("q-%d", i), map[string]any{"branch": fmt.Sprintf("q%d", i), "prompt": "exit-early", "on_done": "keep"})
	}
	for i := range children {
		ref, name := fmt.Sprintf("q-%d", i), fmt.Sprintf("q%d", i)
		wantStatus(t, statusOf(t, lead, ref, "done", "failed"), "failed",
			"creation of child `"+name+"` failed: the agent ended before it was ready during agent start — the child was kept, stopped")
	}
	var res wire.ListResult
	if err := lead.Call(context.Background(), "list", wire.ListArgs{All: true}, &res); err != nil {
		t.Fatal(err)
	}
	started := map[string]int{}
	for _, raw := range res.Items {
		var st wire.StatusItem
		json.Unmarshal(raw, &st)
		if st.Type == wire.ItemStatus && st.State == "started" {
			started[st.Ref]++
		}
	}
	for i := range children {
		if ref := fmt.Sprintf("q-%d", i); started[ref] != 1 {
			t.Errorf("%s: %d started statuses, want 1 (all: %v)", ref, started[ref], started)
		}
	}
	if uids := claimedHostUIDs(t, e.state); len(uids) != children+1 {
		t.Errorf("%d host uids claimed for %d sandboxes", len(uids), children+1)
	}
	if err := e.admin("destroy", wire.DestroyArgs{Name: "lead", Force: true}, nil); err != nil {
		t.Fatal(err)
	}
	if list := e.list(); len(list) != 0 {
		t.Errorf("sandboxes left: %+v", list)
	}
	left, err := os.ReadDir(filepath.Join(e.state, broker.SockDir))
	if err != nil || len(left) != 0 {
		t.Errorf("socket directories left after every sandbox was destroyed: %v %v", left, err)
	}
}

// TestSpawnRefusedAtBrokerChildCap: broker.Config.Caps reaches spawns:
// with a cap of 2 children, a running and a queued child fill it and a
// third spawn is refused naming the cap and the children's states.
func TestSpawnRefusedAtBrokerChildCap(t *testing.T) {
	e := newTestEnvStopped(t)
	e.caps = orchestrate.Caps{MaxChildren: 2}
	e.start()
	e.withAgent()
	e.orchestratorOneSlot("lead")
	lead := e.client("lead")
	t.Cleanup(func() { e.admin("destroy", wire.DestroyArgs{Name: "lead", Force: true}, nil) })
	wantStatus(t, spawn(t, lead, "s-1", map[string]any{"kind": "new", "base": "main", "branch": "one", "prompt": "work"}),
		"started", "creation of child `one` started")
	if st := spawn(t, lead, "s-2", map[string]any{"kind": "new", "base": "main", "branch": "two", "prompt": "work"}); st.State != "queued" {
		t.Fatalf("second spawn: %s %q, want queued", st.State, st.Detail)
	}
	st := spawn(t, lead, "s-3", map[string]any{"kind": "new", "base": "main", "branch": "three", "prompt": "work"})
	if st.State != "refused" || !strings.HasPrefix(st.Detail, "you have 2 children (at most 2, in any state): ") {
		t.Fatalf("third spawn: %s %q, want refused at the cap of 2 children", st.State, st.Detail)
	}
	if _, err := e.b.Store().Sandbox(context.Background(), "three"); err == nil {
		t.Error("the refused spawn recorded its child")
	}
}
