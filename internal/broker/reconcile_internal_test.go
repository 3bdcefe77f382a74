package broker

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/store"
)

const sockDev = backend.SocketDeviceName

func TestPlanRepairs(t *testing.T) {
	records := []store.Sandbox{
		{Name: "lead", UUID: "u1", State: store.StateRunning, SocketDir: "/s/sock/u1.aa"},
		{Name: "kid", UUID: "u2", State: store.StateReady, SocketDir: "/s/sock/u2.bb"},
		{Name: "new", UUID: "pending-x", State: store.StateCreating}, // not yet claimed a directory
		{Name: "old", UUID: "u3", State: store.StateStopped},
	}
	lead := backend.Instance{Name: "lead", UUID: "u1", Running: true, SocketDir: "/s/sock/u1.aa"}
	kid := backend.Instance{Name: "kid", UUID: "u2", Running: true, SocketDir: "/s/sock/u2.bb"}
	old := backend.Instance{Name: "old", UUID: "u3"}
	for _, tc := range []struct {
		name       string
		records    []store.Sandbox // default: records
		insts      []backend.Instance
		conflicted map[string]bool
		want       repairPlan
	}{
		{name: "each its own", insts: []backend.Instance{lead, kid, old, {Name: "other"}}},
		{name: "a copy of lead", insts: []backend.Instance{lead, kid, old, {Name: "lead-copy", UUID: "u9", SocketDir: "/s/sock/u1.aa"}},
			want: repairPlan{detach: []detachment{{"lead-copy", sockDev}}, reserve: []string{"lead"}}},
		{name: "two copies of lead, one of kid", insts: []backend.Instance{lead, kid, old,
			{Name: "c1", UUID: "u7", SocketDir: "/s/sock/u1.aa"}, {Name: "c2", UUID: "u8", SocketDir: "/s/sock/u1.aa"},
			{Name: "c3", UUID: "u9", SocketDir: "/s/sock/u2.bb"}},
			want: repairPlan{detach: []detachment{{"c1", sockDev}, {"c2", sockDev}, {"c3", sockDev}}, reserve: []string{"lead", "kid"}}},
		{name: "a copy whose original was deleted: the original is forgotten, not served", insts: []backend.Instance{kid, old,
			{Name: "lead-copy", UUID: "u9", SocketDir: "/s/sock/u1.aa"}},
			want: repairPlan{detach: []detachment{{"lead-copy", sockDev}}, vanished: []string{"lead"}}},
		{name: "a copy carrying lead's directory under another name", insts: []backend.Instance{lead, kid, old,
			{Name: "sneaky", UUID: "u9", Mounts: []backend.Mount{{Name: "data", Source: "/srv/data"}, {Name: "other", Source: "/s/sock/u1.aa"}}}},
			want: repairPlan{detach: []detachment{{"sneaky", "other"}}, reserve: []string{"lead"}}},
		{name: "the socket file itself, and the directory above every socket", insts: []backend.Instance{lead, kid, old,
			{Name: "x", UUID: "u9", Mounts: []backend.Mount{{Name: "f", Source: "/s/sock/u2.bb/broker.sock"}}},
			{Name: "y", UUID: "u8", Mounts: []backend.Mount{{Name: "all", Source: "/s/sock/"}}}},
			want: repairPlan{detach: []detachment{{"x", "f"}, {"y", "all"}}, reserve: []string{"kid", "lead"}}},
		{name: "the host's root, above every directory", insts: []backend.Instance{lead, kid, old,
			{Name: "r", UUID: "u9", Mounts: []backend.Mount{{Name: "root", Source: "/"}}}},
			want: repairPlan{detach: []detachment{{"r", "root"}}, reserve: []string{"lead", "kid"}}},
		{name: "lead's own directory under a second name, and a neighbour's name that only starts alike: left alone", insts: []backend.Instance{kid, old,
			{Name: "lead", UUID: "u1", Running: true, SocketDir: "/s/sock/u1.aa", Mounts: []backend.Mount{{Name: backend.SocketDeviceName, Source: "/s/sock/u1.aa"}, {Name: "again", Source: "/s/sock/u1.aa"}}},
			{Name: "z", UUID: "u7", Mounts: []backend.Mount{{Name: "near", Source: "/s/sock/u1.aaa"}}}}},
		{name: "covered inside: put back", insts: []backend.Instance{{Name: "lead", UUID: "u1", Running: true, SocketDir: "/s/sock/u1.aa", Covered: []string{"socket"}}, kid, old},
			want: repairPlan{restore: []string{"lead"}}},
		{name: "a directory no record claims (yet): left alone", insts: []backend.Instance{lead, kid, old,
			{Name: "new", UUID: "u5", SocketDir: "/s/sock/u5.cc"}}},
		{name: "an import beside lead: both detached, lead unserved", insts: []backend.Instance{lead, kid, old,
			{Name: "lead-twin", UUID: "u1", SocketDir: "/s/sock/u1.aa"}},
			want: repairPlan{detach: []detachment{{"lead", sockDev}, {"lead-twin", sockDev}}, conflict: []string{"lead"}}},
		{name: "an import beside lead, with model sockets: every socket device detached", insts: []backend.Instance{kid, old,
			{Name: "lead", UUID: "u1", Running: true, SocketDir: "/s/sock/u1.aa", ModelDir: "/s/model/u1.aa"},
			{Name: "lead-twin", UUID: "u1", SocketDir: "/s/sock/u1.aa", ModelDir: "/s/model/u1.aa"}},
			want: repairPlan{detach: []detachment{{"lead", sockDev}, {"lead", backend.ModelDeviceName}, {"lead-twin", sockDev}, {"lead-twin", backend.ModelDeviceName}}, conflict: []string{"lead"}}},
		{name: "a copy carrying lead's model socket directory, or the model root", insts: []backend.Instance{lead, kid, old,
			{Name: "lead-copy", UUID: "u9", ModelDir: "/s/model/aa", Mounts: []backend.Mount{{Name: backend.ModelDeviceName, Source: "/s/model/aa"}}},
			{Name: "y", UUID: "u8", Mounts: []backend.Mount{{Name: "models", Source: "/s/model"}}}},
			want: repairPlan{detach: []detachment{{"lead-copy", backend.ModelDeviceName}, {"y", "models"}}, reserve: []string{"lead", "kid"}}},
		{name: "the model directory covered inside: put back", insts: []backend.Instance{{Name: "lead", UUID: "u1", Running: true, SocketDir: "/s/sock/u1.aa", Covered: []string{"model"}}, kid, old},
			want: repairPlan{restore: []string{"lead"}}},
		{name: "the conflict goes on: nothing new", conflicted: map[string]bool{"lead": true},
			insts: []backend.Instance{{Name: "lead", UUID: "u1", Running: true}, kid, old, {Name: "lead-twin", UUID: "u1"}}},
		{name: "the import deleted: lead served afresh", conflicted: map[string]bool{"lead": true},
			insts: []backend.Instance{{Name: "lead", UUID: "u1", Running: true}, kid, old},
			want:  repairPlan{resolved: []string{"lead"}}},
		{name: "the original deleted, its import left: forgotten", conflicted: map[string]bool{"lead": true},
			insts: []backend.Instance{{Name: "lead-twin", UUID: "u1"}, kid, old},
			want:  repairPlan{vanished: []string{"lead"}}},
		{name: "a stopped sandbox deleted", insts: []backend.Instance{lead, kid},
			want: repairPlan{vanished: []string{"old"}}},
		{name: "replaced by another instance of its name", insts: []backend.Instance{lead, kid, {Name: "old", UUID: "u8"}},
			want: repairPlan{vanished: []string{"old"}}},
		{name: "a worker at it: its own failure says why", insts: []backend.Instance{lead, old},
			records: []store.Sandbox{records[0], {Name: "kid", UUID: "u2", State: store.StateRunning, Phase: "agent"}, records[3]}},
		{name: "recorded running or ready, its unit down: recorded stopped", insts: []backend.Instance{{Name: "lead", UUID: "u1", SocketDir: "/s/sock/u1.aa"}, {Name: "kid", UUID: "u2", SocketDir: "/s/sock/u2.bb"}, old},
			want: repairPlan{ended: []string{"lead", "kid"}}},
		{name: "a worker at it, its unit down: left to the worker", insts: []backend.Instance{lead, {Name: "kid", UUID: "u2"}, old},
			records: []store.Sandbox{records[0], {Name: "kid", UUID: "u2", State: store.StateRunning, Phase: "agent"}, records[3]}},
		{name: "queued, creating and destroying have no instance to miss", insts: nil,
			records: []store.Sandbox{{Name: "q", State: store.StateQueued}, {Name: "c", UUID: "pending-y", State: store.StateCreating}, {Name: "d", UUID: "u4", State: store.StateDestroying}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := tc.records
			if recs == nil {
				recs = records
			}
			if got := planRepairs(recs, tc.insts, tc.conflicted); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("planRepairs = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestRestoreBackoff: a sandbox covered again and again is restored at
// once, then after 1 s, 2 s, 4 s ... up to maxRestoreDelay; another
// sandbox is not held up by it; and one left uncovered for twice the
// delay starts over.
func TestRestoreBackoff(t *testing.T) {
	var r restoreBackoff
	t0 := time.Unix(1_000_000, 0)
	now := t0
	var gaps []time.Duration
	last := now
	for now.Sub(t0) < 30*time.Minute {
		if r.take("hostile", now) {
			gaps = append(gaps, now.Sub(last))
			last = now
		}
		if now == t0.Add(time.Minute) && !r.take("quiet", now) {
			t.Fatal("another sandbox waited for the hostile one's delay")
		}
		now = now.Add(100 * time.Millisecond)
	}
	want := []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second, 128 * time.Second, 256 * time.Second, maxRestoreDelay, maxRestoreDelay}
	if len(gaps) < len(want) || !slices.Equal(gaps[:len(want)], want) {
		t.Fatalf("restores came after %v, want %v...", gaps, want)
	}
	// Quiet for twice the delay: the next cover is put back at once, and
	// the one after it a round later.
	now = last.Add(maxRestoreDelay + 2*maxRestoreDelay + time.Second) // next allowed, then twice the delay
	if !r.take("hostile", now) || r.take("hostile", now.Add(firstRestoreDelay/2)) || !r.take("hostile", now.Add(firstRestoreDelay)) {
		t.Fatal("a sandbox quiet for twice its delay did not start over")
	}
}
