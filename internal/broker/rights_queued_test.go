package broker_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// looseOneSlotGrant lets one child run at a time and grants loose, so
// egress the repository's cap covers (any, without a cap).
const looseOneSlotGrant = `{"version":1,"max_running_children":1,"operations":["destroy","import","message","restart","rights","spawn","stop"],"grantable":{"mounts":[],"loose":true,"egress":[]},"default_runner":null,"default_runner_source":null}`

// TestRightsQueuedSpawnRecheckedAtStart: a queued spawn's rights passed
// the rights rule when it was sent; the host then tightens the
// repository's egress cap, and when a slot frees the spawn is checked
// again: the one whose egress no longer fits fails, naming the right,
// and its child is removed without it; the one that still fits starts
// with its right.
func TestRightsQueuedSpawnRecheckedAtStart(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	if err := e.admin("new", wire.NewArgs{Name: "lead", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(looseOneSlotGrant)}, nil); err != nil {
		t.Fatal(err)
	}
	lead := e.client("lead")
	egress := func(hosts ...string) map[string]any {
		return map[string]any{"mounts": []string{}, "loose": false, "egress": hosts}
	}
	wantStatus(t, spawn(t, lead, "s-1", map[string]any{"branch": "one", "prompt": "stay-busy", "on_done": "keep"}),
		"started", "creation of child `one` started")
	if st := statusOf(t, lead, "s-1", "done", "failed"); st.State != "done" {
		t.Fatalf("s-1: %+v", st)
	}
	wantStatus(t, spawn(t, lead, "s-2", map[string]any{"branch": "two", "prompt": "stay-busy", "on_done": "keep", "rights": egress("*.com")}),
		"queued", "queued at position 1: 1 of 1 slots are used by `one`")
	wantStatus(t, spawn(t, lead, "s-3", map[string]any{"branch": "three", "prompt": "stay-busy", "on_done": "keep", "rights": egress("github.com")}),
		"queued", "queued at position 2: 1 of 1 slots are used by `one`")

	// The host caps the repository's egress while both wait.
	capped := agentConfig + "orchestration:\n  cap:\n    egress: [github.com]\n"
	if err := os.WriteFile(filepath.Join(e.repo, ".jailbee", "config.yaml"), []byte(capped), 0o644); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, sendManifest(t, lead, map[string]any{"id": "stop-1", "type": "stop", "child": "one"}), "done", "child `one` stopped")

	wantStatus(t, statusOf(t, lead, "s-2", "started"), "started", "creation of child `two` started")
	wantStatus(t, statusOf(t, lead, "s-2", "done", "failed"), "failed",
		"creation of child `two` failed: its rights no longer fit your grant and the repository's orchestration.cap: egress `*.com` is not grantable during creating — the child was removed")
	if _, err := e.b.Store().Sandbox(context.Background(), "two"); err == nil {
		t.Fatal("the child whose rights no longer fit was kept")
	}
	if rights, err := e.b.Store().Rights(context.Background(), "two"); err != nil || len(rights) != 0 {
		t.Fatalf("rights of the failed child: %+v, %v", rights, err)
	}

	// Its failure freed the slot: the next spawn, which still fits, starts
	// with its right.
	wantStatus(t, statusOf(t, lead, "s-3", "started"), "started", "creation of child `three` started")
	if st := statusOf(t, lead, "s-3", "done", "failed"); st.State != "done" {
		t.Fatalf("s-3: %+v", st)
	}
	rights, err := e.b.Store().Rights(context.Background(), "three")
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Right{{Sandbox: "three", Kind: store.RightEgress, Item: "github.com", Owner: store.OwnerOrchestration}}
	if !slices.EqualFunc(rights, want, func(a, b store.Right) bool { return a.Key() == b.Key() && a.Owner == b.Owner && a.Expires.IsZero() }) {
		t.Fatalf("rights of three: %+v, want %+v", rights, want)
	}
}
