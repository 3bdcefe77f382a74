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
