package broker_test

import (
	"context"
	"strings"
	"testing"

	"agentbox/internal/inbox"
	"agentbox/internal/wire"
)

// sendManifest sends a manifest of any type and returns its first status.
func sendManifest(t testing.TB, c *inbox.Client, m map[string]any) wire.StatusItem {
	t.Helper()
	if _, ok := m["version"]; !ok {
		m["version"] = 1
	}
	var st wire.StatusItem
	if err := c.Call(context.Background(), "send", map[string]any{"manifest": m}, &st); err != nil {
		t.Fatalf("send %v: %v", m["id"], err)
	}
	return st
}

func wantStatus(t testing.TB, st wire.StatusItem, state, detail string) {
	t.Helper()
	if st.State != state || st.Detail != detail {
		t.Fatalf("status %s %q, want %s %q", st.State, st.Detail, state, detail)
	}
}

const commitCmd = "git -c user.name=Kid -c user.email=kid@example.com commit -q"

// TestImportManifest: an orchestrator's import puts its child's HEAD at
// refs/jailbee/from/<child>/<branch> in its own repository, merges nothing,
// moves the child's import point (destroy then needs no force), and a
// resend of the id imports nothing again.
func TestImportManifest(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch := e.client("orch")
	orchHead := e.mustExec("orch", "git", "rev-parse", "HEAD")

	e.mustExec("kid", "sh", "-c", "echo work > work.txt && git add work.txt && "+commitCmd+" -m work")
	kidHead := e.mustExec("kid", "git", "rev-parse", "HEAD")
	ref := "refs/jailbee/from/kid/work/kid"

	st := sendManifest(t, orch, map[string]any{"id": "imp-1", "type": "import", "child": "kid"})
	wantStatus(t, st, "done", "imported as "+ref+" at "+kidHead[:12])
	if got := e.mustExec("orch", "git", "rev-parse", ref); got != kidHead {
		t.Fatalf("%s in the orchestrator = %s, want %s", ref, got, kidHead)
	}
	// Nothing merged: the orchestrator's branch and work tree are as they were.
	if got := e.mustExec("orch", "sh", "-c", "git rev-parse HEAD; git status --porcelain; test -e work.txt || echo no-work"); got != orchHead+"\nno-work" {
		t.Fatalf("orchestrator after the import: %q", got)
	}
	if got := e.row("kid").Imported; got != kidHead {
		t.Fatalf("import point %s, want %s", got, kidHead)
	}

	// A resend of the same id returns the same status and imports nothing.
	e.mustExec("kid", "sh", "-c", commitCmd+" --allow-empty -m more")
	again := sendManifest(t, orch, map[string]any{"id": "imp-1", "type": "import", "child": "kid"})
	if again.ID != st.ID || again.Detail != st.Detail {
		t.Fatalf("resend: %+v, want the first status %+v", again, st)
	}
	if got := e.mustExec("orch", "git", "rev-parse", ref); got != kidHead {
		t.Fatalf("a resend imported again: %s is %s", ref, got)
	}

	// Another orchestrator's child, or no child at all, is refused.
	e.orchestrator("other")
	e.child("stranger", "other")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "imp-2", "type": "import", "child": "stranger"}),
		"refused", "`stranger` is not a child of this orchestrator")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "imp-3", "type": "import", "child": "nobody"}),
		"refused", "`nobody` is not a child of this orchestrator")
}

// TestStopImportDestroyManifests: stop ends the child's processes and
// records its work; a stopped child is imported (its sandbox started for
// the transfer and stopped again) and destroyed by what was recorded.
func TestStopImportDestroyManifests(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch := e.client("orch")
	uid := e.hostUID("kid")

	e.mustExec("kid", "sh", "-c", "nohup sh -c 'while :; do sleep 0.1; done' >/dev/null 2>&1 &")
	e.mustExec("kid", "sh", "-c", "echo a > a && git add a && "+commitCmd+" -m a")
	kidHead := e.mustExec("kid", "git", "rev-parse", "HEAD")
	if procs, ok := e.sandboxProcesses("kid", uid); ok && len(procs) == 0 {
		t.Fatal("no process of the running child is seen: the check after stop would prove nothing")
	}

	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "stop-1", "type": "stop", "child": "kid"}),
		"done", "child `kid` stopped")
	if info := e.info("kid"); info.State != "stopped" || info.Running {
		t.Fatalf("after stop: %+v", info)
	}
	if procs, _ := e.sandboxProcesses("kid", uid); len(procs) != 0 {
		t.Fatalf("processes of the stopped child: %v", procs)
	}
	if row := e.row("kid"); row.StopHead != kidHead || row.StopDirty {
		t.Fatalf("recorded at stop: head %s dirty %v, want %s clean", row.StopHead, row.StopDirty, kidHead)
	}

	// Commits never imported: destroy refused, by the HEAD recorded at stop.
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "del-1", "type": "destroy", "child": "kid"}),
		"refused", "`kid` has commits that were never imported (HEAD "+kidHead[:12]+", last imported "+e.row("kid").Imported[:12]+"): import them, or fetch them into the host repository with 'jailbee fetch kid', or use --force")

	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "imp-1", "type": "import", "child": "kid"}),
		"done", "imported as refs/jailbee/from/kid/work/kid at "+kidHead[:12])
	if info := e.info("kid"); info.State != "stopped" || info.Running {
		t.Fatalf("an import left the stopped child %+v", info)
	}

	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "del-2", "type": "destroy", "child": "kid"}),
		"done", "child `kid` destroyed")
	for _, s := range e.list() {
		if s.Name == "kid" {
			t.Fatalf("kid is still listed: %+v", s)
		}
	}
}

// TestDestroyManifestGuard: a running child with unsaved work is refused
// without force and destroyed with it.
func TestDestroyManifestGuard(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch := e.client("orch")

	e.mustExec("kid", "touch", "untracked")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "del-1", "type": "destroy", "child": "kid"}),
		"refused", "`kid` has uncommitted changes: commit them, or use --force")
	e.mustExec("kid", "sh", "-c", "git add untracked && "+commitCmd+" -m u")
	st := sendManifest(t, orch, map[string]any{"id": "del-2", "type": "destroy", "child": "kid"})
	if st.State != "refused" || !strings.Contains(st.Detail, "commits that were never imported") {
		t.Fatalf("unimported commit: %s %q", st.State, st.Detail)
	}
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "del-3", "type": "destroy", "child": "kid", "force": true}),
		"done", "child `kid` destroyed")
	// The resent id answers the same, and a later destroy names no child.
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "del-3", "type": "destroy", "child": "kid", "force": true}),
		"done", "child `kid` destroyed")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "del-4", "type": "destroy", "child": "kid"}),
		"refused", "`kid` is not a child of this orchestrator")
}
