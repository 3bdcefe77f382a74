package broker_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"agentbox/internal/wire"
)

// TestHostCommandsShowAtOnce: what a host command changed is in the
// answers of children and grant as soon as it has answered, with no round
// in between (the round loop is held off for the test): a new child, its
// stop and start, a destroy, and an orchestrator destroyed with its
// children and made again under its name.
func TestHostCommandsShowAtOnce(t *testing.T) {
	e := newTestEnv(t)
	e.b.HoldRoundsForTest(true)
	e.orchestrator("orch")
	kids := func(name string) []wire.ChildInfo {
		t.Helper()
		var res wire.ChildrenResult
		if err := e.client(name).Call(context.Background(), "children", nil, &res); err != nil {
			t.Fatalf("children of %s: %v", name, err)
		}
		return res.Children
	}
	want := func(step string, got []wire.ChildInfo, want ...wire.ChildInfo) {
		t.Helper()
		if want == nil {
			want = []wire.ChildInfo{}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after %s: children %+v, want %+v", step, got, want)
		}
	}
	want("new orch", kids("orch"))

	e.child("kid", "orch")
	e.child("bee", "orch")
	running := func(name string) wire.ChildInfo {
		return wire.ChildInfo{Name: name, Branch: "work/" + name, State: "running", Running: true}
	}
	want("new kid and bee", kids("orch"), running("bee"), running("kid"))

	if err := e.admin("stop", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatal(err)
	}
	want("stop kid", kids("orch"), running("bee"), wire.ChildInfo{Name: "kid", Branch: "work/kid", State: "stopped"})
	if err := e.admin("start", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatal(err)
	}
	want("start kid", kids("orch"), running("bee"), running("kid"))
	if err := e.admin("destroy", wire.DestroyArgs{Name: "bee", Force: true}, nil); err != nil {
		t.Fatal(err)
	}
	want("destroy bee", kids("orch"), running("kid"))

	if err := e.admin("destroy", wire.DestroyArgs{Name: "orch", Force: true}, nil); err != nil {
		t.Fatal(err)
	}
	grant := `{"version":1,"max_running_children":1,"operations":["message","spawn"],"grantable":{"mounts":[],"loose":false,"egress":[]},"default_runner":null,"default_runner_source":null}`
	if err := e.admin("new", wire.NewArgs{Name: "orch", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(grant)}, nil); err != nil {
		t.Fatal(err)
	}
	want("orch destroyed with its children and made again", kids("orch"))
	var got json.RawMessage
	if err := e.client("orch").Call(context.Background(), "grant", nil, &got); err != nil {
		t.Fatal(err)
	}
	if string(got) != grant {
		t.Fatalf("grant of the new orch: %s, want %s", got, grant)
	}
}

// TestStatusesOfANameReused: a child destroyed by its orchestrator's
// manifest (no host command, so no refresh) and made again under its
// name before the next round starts with no status: the statuses the
// broker keeps by name are never the earlier child's (its details name
// its work), neither after the host's new nor after the next round.
func TestStatusesOfANameReused(t *testing.T) {
	e := newTestEnv(t)
	e.b.HoldRoundsForTest(true)
	e.orchestrator("orch")
	e.child("kid", "orch")
	sendMessage(t, e.client("kid"), map[string]any{"id": "m-1", "body": "secret work"})
	e.b.RunRoundForTest()
	statuses := func(step string) []json.RawMessage {
		t.Helper()
		var res wire.StatusResult
		if err := e.client("kid").Call(context.Background(), "status", nil, &res); err != nil {
			t.Fatalf("%s: status: %v", step, err)
		}
		return res.Statuses
	}
	if got := statuses("the first kid"); len(got) != 1 {
		t.Fatalf("the first kid's statuses: %s", got)
	}
	wantStatus(t, sendManifest(t, e.client("orch"), map[string]any{"id": "del-1", "type": "destroy", "child": "kid", "force": true}),
		"done", "child `kid` destroyed")
	e.child("kid", "orch")
	if got := statuses("the new kid"); len(got) != 0 {
		t.Fatalf("the new kid sees the statuses of the one before: %s", got)
	}
	e.b.RunRoundForTest()
	if got := statuses("the new kid after a round"); len(got) != 0 {
		t.Fatalf("after a round, the new kid sees the statuses of the one before: %s", got)
	}
}
