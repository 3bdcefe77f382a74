package broker_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"agentbox/internal/backend/incus"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// incusRequired names the variable .ci/run sets once Incus is set up: a
// missing Incus then fails these tests instead of skipping them.
const incusRequired = "JAILBEE_TEST_INCUS"

// newIncusTestEnv is newTestEnv with its sandboxes on Incus, in a project
// of its own (sharing the default project's images and profiles) that is
// removed with everything in it when the test ends.
func newIncusTestEnv(t *testing.T) *testEnv {
	t.Helper()
	ctx := context.Background()
	b, err := incus.New(ctx, incus.Options{})
	if err == nil && !b.HasImage(ctx) {
		err = incus.ErrNoImage
	}
	if err != nil {
		if os.Getenv(incusRequired) == "1" {
			t.Fatalf("Incus was asked for (%s=1): %v", incusRequired, err)
		}
		t.Skipf("no Incus here (%v)", err)
	}
	project := "jbbroker-" + strings.ToLower(rand.Text()[:10])
	if out, err := exec.Command("incus", "project", "create", project, "-c", "features.images=false", "-c", "features.profiles=false").CombinedOutput(); err != nil {
		t.Fatalf("incus project create: %v: %s", err, out)
	}
	t.Cleanup(func() {
		out, _ := exec.Command("incus", "list", "--project", project, "-f", "csv", "-c", "n").Output()
		for _, name := range strings.Fields(string(out)) {
			exec.Command("incus", "delete", "--project", project, "--force", name).Run()
		}
		if out, err := exec.Command("incus", "project", "delete", project).CombinedOutput(); err != nil {
			t.Errorf("incus project delete: %v: %s", err, out)
		}
	})
	e := newTestEnvStopped(t)
	e.incusProject = project
	e.start()
	return e
}

// TestIncusSpawnDoneAndDestroy: the job on Incus containers, through the
// same broker code as on the local backend: an orchestrator forks a child
// whose scripted agent (in tmux in its container) commits and reports
// done; the commit arrives imported in the orchestrator's repository at
// the exact SHA, and the child is destroyed, container and all.
func TestIncusSpawnDoneAndDestroy(t *testing.T) {
	e := newIncusTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	wantStatus(t, spawn(t, lead, "s-1", map[string]any{"branch": "fix/a", "prompt": "fix it"}), "started", "creation of child `fix-a` started")
	// The agent may report before its readiness is established: either
	// detail is right, and the report may come first.
	var st wire.StatusItem
	var done wire.MessageItem
	nextItem(t, lead, func(raw json.RawMessage) bool {
		var head struct{ Type, Ref, From, Kind string }
		json.Unmarshal(raw, &head)
		switch {
		case head.Type == wire.ItemStatus && head.Ref == "s-1":
			json.Unmarshal(raw, &st)
		case head.Type == wire.ItemMessage && head.From == "fix-a" && head.Kind == "done":
			json.Unmarshal(raw, &done)
		}
		return (st.State == "done" || st.State == "failed") && done.ID != ""
	})
	if st.State != "done" || !strings.HasPrefix(st.Detail, "child `fix-a` is ready") {
		t.Fatalf("spawn status %s %q", st.State, st.Detail)
	}
	if done.Body != "done: fix it" || done.ImportedRef != "refs/jailbee/from/fix-a/fix/a" || !fullSHA.MatchString(done.ImportedSHA) || done.OnDone != "destroy" {
		t.Fatalf("the done report: %+v", done)
	}
	if got := e.mustExec("lead", "git", "rev-parse", done.ImportedRef); got != done.ImportedSHA {
		t.Fatalf("%s in lead: %s, want %s", done.ImportedRef, got, done.ImportedSHA)
	}
	if got := e.mustExec("lead", "git", "log", "-1", "--format=%s", done.ImportedSHA); got != "agent: fix it" {
		t.Fatalf("the imported commit: %q", got)
	}
	waitGone(t, e, "fix-a")
	if out, _ := exec.Command("incus", "list", "--project", e.incusProject, "-f", "csv", "-c", "n").Output(); strings.Contains(string(out), "fix-a") {
		t.Fatalf("the child's container is still there: %s", out)
	}
}

// waitGone waits until the broker no longer lists name.
func waitGone(t *testing.T, e *testEnv, name string) {
	t.Helper()
	wait.For(t, name+" destroyed", func() bool {
		for _, sb := range e.list() {
			if sb.Name == name {
				return false
			}
		}
		return true
	})
}
