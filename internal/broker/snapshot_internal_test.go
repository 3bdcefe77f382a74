package broker

import (
	"encoding/json"
	"maps"
	"reflect"
	"testing"

	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// TestRefreshEditsLeaveTheLastSnapshot: a host command's edit, even of the
// empty snapshot a broker has before its first round, makes a new
// snapshot and leaves the one readers hold as it was.
func TestRefreshEditsLeaveTheLastSnapshot(t *testing.T) {
	for _, prev := range []*Snapshot{{}, {
		Children: map[string][]wire.ChildInfo{"o": {{Name: "old", Branch: "b", State: "running", Running: true}}},
		Grants:   map[string]json.RawMessage{"o": json.RawMessage(`{}`)},
		Statuses: map[string][]store.Item{"old": {{Ref: "r"}}},
		parents:  map[string]string{"old": "o"},
	}} {
		before := *prev
		before.Children, before.Grants = cloneDeep(prev.Children), maps.Clone(prev.Grants)
		e := &snapEdit{next: &Snapshot{Children: prev.Children, Statuses: prev.Statuses, Grants: prev.Grants, parents: prev.parents}}
		e.update(store.Sandbox{Name: "o", Role: wire.RoleOrchestrator, Grant: `{"v":1}`}, false)
		e.update(store.Sandbox{Name: "kid", Role: wire.RoleChild, Parent: "o", Branch: "k", State: store.StateRunning}, true)
		e.forget("old")
		want := []wire.ChildInfo{{Name: "kid", Branch: "k", State: "running", Running: true}}
		if got := e.next.Children["o"]; !reflect.DeepEqual(got, want) {
			t.Fatalf("children %+v, want %+v", got, want)
		}
		if got := string(e.next.Grants["o"]); got != `{"v":1}` {
			t.Fatalf("grant %s", got)
		}
		if _, ok := e.next.Statuses["old"]; ok {
			t.Fatal("the destroyed sandbox's statuses are still there")
		}
		if !reflect.DeepEqual(prev.Children, before.Children) || !reflect.DeepEqual(prev.Grants, before.Grants) || len(prev.Statuses) != len(before.Statuses) {
			t.Fatalf("the last snapshot changed: %+v", prev)
		}
	}
}

func cloneDeep(m map[string][]wire.ChildInfo) map[string][]wire.ChildInfo {
	if m == nil {
		return nil
	}
	out := map[string][]wire.ChildInfo{}
	for k, v := range m {
		out[k] = append([]wire.ChildInfo(nil), v...)
	}
	return out
}
