package broker

import (
	"reflect"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/store"
)

func TestPlanSockets(t *testing.T) {
	records := []store.Sandbox{
		{Name: "lead", UUID: "u1", SocketDir: "/s/sock/u1.aa"},
		{Name: "kid", UUID: "u2", SocketDir: "/s/sock/u2.bb"},
		{Name: "new", UUID: "pending-x"}, // not yet claimed a directory
	}
	for _, tc := range []struct {
		name  string
		insts []backend.Instance
		want  socketPlan
	}{
		{name: "each its own", insts: []backend.Instance{
			{Name: "lead", UUID: "u1", SocketDir: "/s/sock/u1.aa"}, {Name: "kid", UUID: "u2", SocketDir: "/s/sock/u2.bb"}, {Name: "other"}}},
		{name: "a copy of lead", insts: []backend.Instance{
			{Name: "lead", UUID: "u1", SocketDir: "/s/sock/u1.aa"}, {Name: "lead-copy", UUID: "u9", SocketDir: "/s/sock/u1.aa"}},
			want: socketPlan{detach: []string{"lead-copy"}, reserve: []string{"lead"}}},
		{name: "two copies of lead, one of kid", insts: []backend.Instance{
			{Name: "c1", UUID: "u7", SocketDir: "/s/sock/u1.aa"}, {Name: "c2", UUID: "u8", SocketDir: "/s/sock/u1.aa"},
			{Name: "c3", UUID: "u9", SocketDir: "/s/sock/u2.bb"}},
			want: socketPlan{detach: []string{"c1", "c2", "c3"}, reserve: []string{"lead", "kid"}}},
		{name: "a copy whose original is gone from the backend", insts: []backend.Instance{
			{Name: "lead-copy", UUID: "u9", SocketDir: "/s/sock/u1.aa"}},
			want: socketPlan{detach: []string{"lead-copy"}, reserve: []string{"lead"}}},
		{name: "a directory no record claims (yet): left alone", insts: []backend.Instance{
			{Name: "new", UUID: "u5", SocketDir: "/s/sock/u5.cc"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := planSockets(records, tc.insts); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("planSockets = %+v, want %+v", got, tc.want)
			}
		})
	}
}
