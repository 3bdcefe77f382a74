package broker_test

// Crash tests at chosen steps: the broker process is started with
// JAILBEE_CRASHPOINT naming a step, kills itself with SIGKILL there, and a
// new broker on the same state dir must leave everything consistent.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/crashpoint"
	"agentbox/internal/inbox"
	"agentbox/internal/orchestrate"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// crashEnv is a broker process that dies at point, then its successor.
type crashEnv struct {
	t     *testing.T
	bin   string
	state string
	repo  string
	p     *procBroker
}

func newCrashEnv(t *testing.T, point string, withAgent bool) *crashEnv {
	e := &testEnv{t: t, repo: makeRepo(t)}
	if withAgent {
		e.withAgent()
	}
	c := &crashEnv{t: t, bin: testbin.Jailbee(t), state: shortTempDir(t), repo: e.repo}
	c.p = startProcBrokerVia(t, c.bin, c.state, []string{"env", crashpoint.EnvVar + "=" + point})
	return c
}

// orchAndKid makes an orchestrator "orch" and its child "kid" on branch
// work/kid through the admin socket.
func (c *crashEnv) orchAndKid() {
	c.p.newSandbox(wire.NewArgs{Name: "orch", Repo: c.repo, Role: "orchestrator"})
	c.p.newSandbox(wire.NewArgs{Name: "kid", Repo: c.repo, Branch: "work/kid", Role: "child", Parent: "orch"})
}

// died waits for the broker to kill itself and starts its successor.
func (c *crashEnv) died() {
	c.t.Helper()
	select {
	case <-c.p.exited:
	case <-time.After(wait.Guard + 2*time.Minute):
		c.t.Fatalf("the broker did not die at its crash point:\n%s", c.p.stderr)
	}
	if !strings.Contains(c.p.cmd.ProcessState.String(), "killed") {
		c.t.Fatalf("the broker ended %v, not by its SIGKILL:\n%s", c.p.cmd.ProcessState, c.p.stderr)
	}
	c.p = startProcBroker(c.t, c.bin, c.state)
}

func (c *crashEnv) exec(name string, argv ...string) string {
	c.t.Helper()
	res, err := adminExec(c.t, c.p.adminPath(), name, "", argv...)
	if err != nil || res.exit != 0 {
		c.t.Fatalf("exec %v in %s: %v, exit %d\n%s%s", argv, name, err, res.exit, res.stdout, res.stderr)
	}
	return strings.TrimSpace(res.stdout)
}

func (c *crashEnv) listed(name string) (wire.SandboxInfo, bool) {
	var list []wire.SandboxInfo
	if err := c.p.adminCall("ls", nil, &list); err != nil {
		c.t.Fatal(err)
	}
	for _, s := range list {
		if s.Name == name {
			return s, true
		}
	}
	return wire.SandboxInfo{}, false
}

// assertGone: no record and no sandbox directory.
func (c *crashEnv) assertGone(name string) {
	c.t.Helper()
	if info, ok := c.listed(name); ok {
		c.t.Fatalf("%s is still listed: %+v", name, info)
	}
	if _, err := os.Stat(filepath.Join(c.state, "sandboxes", name)); !os.IsNotExist(err) {
		c.t.Fatalf("the sandbox directory of %s: %v", name, err)
	}
}

// sendLost sends a manifest to a broker that dies before it answers.
func sendLost(t *testing.T, cl *inbox.Client, m map[string]any) {
	t.Helper()
	m["version"] = 1
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var st wire.StatusItem
	if err := cl.Call(ctx, "send", map[string]any{"manifest": m}, &st); err == nil {
		t.Fatalf("send %v was answered (%s %q) by a broker that should have died", m["id"], st.State, st.Detail)
	}
}

// items lists a sandbox's unread items of one type.
func items[T any](t *testing.T, cl *inbox.Client, typ string) []T {
	t.Helper()
	var res wire.ListResult
	if err := cl.Call(context.Background(), "list", nil, &res); err != nil {
		t.Fatal(err)
	}
	var out []T
	for _, raw := range res.Items {
		var head struct {
			Type string `json:"type"`
		}
		json.Unmarshal(raw, &head)
		if head.Type == typ {
			var it T
			json.Unmarshal(raw, &it)
			out = append(out, it)
		}
	}
	return out
}

// TestCrashAfterSpawnCreatedTheSandbox: the worker made the sandbox and
// died before recording it; the next broker reports the spawn failed and
// leaves neither record nor sandbox.
func TestCrashAfterSpawnCreatedTheSandbox(t *testing.T) {
	c := newCrashEnv(t, crashpoint.SpawnCreated, true)
	c.p.newSandbox(wire.NewArgs{Name: "lead", Repo: c.repo, Role: "orchestrator"})
	wantStatus(t, spawn(t, c.p.client("lead"), "s-1", map[string]any{"branch": "kid", "prompt": "p"}), "started", "creation of child `kid` started")
	c.died()
	wantStatus(t, statusOf(t, c.p.client("lead"), "s-1", "done", "failed"), "failed",
		"creation of child `kid` failed: the worker stopped during creating — the child was removed")
	c.assertGone("kid")
}

// TestCrashBetweenDoneImportAndDelivery: a done report imported but not
// delivered is not accepted: the child's send gets the interrupted
// status, its agent stays watched, and its next report is delivered once.
func TestCrashBetweenDoneImportAndDelivery(t *testing.T) {
	c := newCrashEnv(t, crashpoint.DoneImported, true)
	c.p.newSandbox(wire.NewArgs{Name: "lead", Repo: c.repo, Role: "orchestrator"})
	lead := c.p.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "kid", "prompt": "report-later", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `kid` is ready")
	c.died() // the agent's report
	lead = c.p.client("lead")
	kid := c.p.client("kid")
	// The new broker answers host commands before it has recovered the
	// requests its predecessor left: the status comes once it has.
	var sts []wire.StatusItem
	wait.For(t, "the child's report to get a status", func() bool {
		sts = items[wire.StatusItem](t, kid, wire.ItemStatus)
		return len(sts) > 0
	})
	if len(sts) != 1 || sts[0].State != "failed" || sts[0].Detail != orchestrate.InterruptedDetail {
		t.Fatalf("the child's statuses after the crash: %+v", sts)
	}
	if got := items[wire.MessageItem](t, lead, wire.ItemMessage); len(got) != 0 {
		t.Fatalf("the orchestrator got %+v from a report that was never accepted", got)
	}
	if info, _ := c.listed("kid"); info.State != "ready" {
		t.Fatalf("the child after the crash: %+v", info)
	}
	// Still watched: its agent ending is news.
	c.exec("kid", "tmux", "kill-window", "-t", "jailbee:scripted")
	if blocked := messageFrom(t, lead, "kid", "blocked"); blocked.OriginID != "" {
		t.Fatalf("blocked: %+v", blocked)
	}
	c.exec("kid", "jailbee", "inbox", "send", "message", "--kind", "done", "--wait", "--text", "done again")
	done := messageFrom(t, lead, "kid", "done")
	if done.Body != "done again" || !fullSHA.MatchString(done.ImportedSHA) {
		t.Fatalf("the report after the crash: %+v", done)
	}
	if more := items[wire.MessageItem](t, lead, wire.ItemMessage); len(more) != 0 {
		t.Fatalf("more messages than the one report: %+v", more)
	}
}

// TestCrashAfterDoneDelivered: the report is delivered and its child not
// yet destroyed; the next broker destroys it, as the report said.
func TestCrashAfterDoneDelivered(t *testing.T) {
	c := newCrashEnv(t, crashpoint.DoneDelivered, true)
	c.p.newSandbox(wire.NewArgs{Name: "lead", Repo: c.repo, Role: "orchestrator"})
	spawn(t, c.p.client("lead"), "s-1", map[string]any{"branch": "kid", "prompt": "report-later"})
	c.died()
	lead := c.p.client("lead")
	if done := messageFrom(t, lead, "kid", "done"); done.OnDone != "destroy" || !fullSHA.MatchString(done.ImportedSHA) {
		t.Fatalf("the delivered report: %+v", done)
	}
	wait.For(t, "the reported child to be destroyed", func() bool {
		_, ok := c.listed("kid")
		return !ok
	})
	c.assertGone("kid")
}

// TestCrashBetweenFinishImportAndDelivery: a done report waited for its
// stopped orchestrator; the broker died after the import, before the
// delivery. The next broker delivers it exactly once and the child gets
// its done status.
func TestCrashBetweenFinishImportAndDelivery(t *testing.T) {
	c := newCrashEnv(t, crashpoint.FinishImported, true)
	c.p.newSandbox(wire.NewArgs{Name: "lead", Repo: c.repo, Role: "orchestrator"})
	spawn(t, c.p.client("lead"), "s-1", map[string]any{"branch": "kid", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, c.p.client("lead"), "s-1", "done", "failed"), "done", "child `kid` is ready")
	if err := c.p.adminCall("stop", wire.NameArgs{Name: "lead"}, nil); err != nil {
		t.Fatal(err)
	}
	c.exec("kid", "sh", "-c", commitCmd+" --allow-empty -m work")
	head := c.exec("kid", "git", "rev-parse", "HEAD")
	if st := sendManifest(t, c.p.client("kid"), map[string]any{"id": "d-1", "type": "message", "kind": "done", "body": "finished"}); st.State != "queued" {
		t.Fatalf("the report to a stopped orchestrator: %+v", st)
	}
	if err := c.p.adminCall("start", wire.NameArgs{Name: "lead"}, nil); err != nil {
		t.Fatal(err)
	}
	c.died() // a round imported the report
	lead := c.p.client("lead")
	if done := messageFrom(t, lead, "kid", "done"); done.Body != "finished" || done.ImportedSHA != head || done.OriginID != "d-1" {
		t.Fatalf("the report after the crash: %+v", done)
	}
	wantStatus(t, statusOf(t, c.p.client("kid"), "d-1", "done"), "done",
		"delivered to lead: imported as refs/jailbee/from/kid/kid at "+head[:12]+"; this child is kept")
	time.Sleep(3 * broker.RoundInterval) // rounds pass: nothing is delivered again
	if more := items[wire.MessageItem](t, lead, wire.ItemMessage); len(more) != 0 {
		t.Fatalf("more messages than the one report: %+v", more)
	}
}

// TestCrashAfterUpdateMerged: the merge happened in the child, its message
// and status did not; the next broker answers the update failed, nothing
// is delivered, and a new update finds the work already contained.
func TestCrashAfterUpdateMerged(t *testing.T) {
	c := newCrashEnv(t, crashpoint.UpdateMerged, false)
	c.orchAndKid()
	c.exec("orch", "sh", "-c", commitCmd+" --allow-empty -m o")
	orchHead := c.exec("orch", "git", "rev-parse", "HEAD")
	sendLost(t, c.p.client("orch"), map[string]any{"id": "up-1", "type": "update", "child": "kid", "merge": true})
	c.died()
	orch, kid := c.p.client("orch"), c.p.client("kid")
	wantStatus(t, statusOf(t, orch, "up-1", "done", "failed"), "failed", orchestrate.InterruptedDetail)
	if got := items[wire.MessageItem](t, kid, wire.ItemMessage); len(got) != 0 {
		t.Fatalf("the child got %+v from an update never answered", got)
	}
	if got := c.exec("kid", "git", "rev-parse", "HEAD"); got != orchHead {
		t.Fatalf("the child's HEAD %s, want the merged %s", got, orchHead)
	}
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-2", "type": "update", "child": "kid", "merge": true}), "done",
		"delivered to kid: refs/jailbee/from/orch/main at "+orchHead[:12]+"; already contained in work/kid, HEAD unchanged")
}

// TestCrashAfterImportTransferred: the ref landed, the status did not; the
// import answers failed and a new one succeeds.
func TestCrashAfterImportTransferred(t *testing.T) {
	c := newCrashEnv(t, crashpoint.ImportTransferred, false)
	c.orchAndKid()
	c.exec("kid", "sh", "-c", commitCmd+" --allow-empty -m k")
	kidHead := c.exec("kid", "git", "rev-parse", "HEAD")
	sendLost(t, c.p.client("orch"), map[string]any{"id": "imp-1", "type": "import", "child": "kid"})
	c.died()
	orch := c.p.client("orch")
	wantStatus(t, statusOf(t, orch, "imp-1", "done", "failed"), "failed", orchestrate.InterruptedDetail)
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "imp-2", "type": "import", "child": "kid"}), "done",
		"imported as refs/jailbee/from/kid/work/kid at "+kidHead[:12])
}

// TestCrashAfterDestroyRemovedTheUnit: the sandbox is gone, its record is
// not; the next broker finishes the destroy before it serves anything.
func TestCrashAfterDestroyRemovedTheUnit(t *testing.T) {
	c := newCrashEnv(t, crashpoint.DestroyUnitGone, false)
	c.orchAndKid()
	sendLost(t, c.p.client("orch"), map[string]any{"id": "del-1", "type": "destroy", "child": "kid", "force": true})
	c.died()
	c.assertGone("kid")
	wantStatus(t, statusOf(t, c.p.client("orch"), "del-1", "done", "failed"), "failed", orchestrate.InterruptedDetail)
	wantStatus(t, sendManifest(t, c.p.client("orch"), map[string]any{"id": "del-2", "type": "destroy", "child": "kid"}),
		"refused", "`kid` is not a child of this orchestrator")
}
