package orchestrate

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"agentbox/internal/grant"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// TestStartQueuedClaimsEachChildOnce: 60 queued spawns drain through 4
// slots while 8 goroutines free slots (remove a creating child, as a failed create does) and start
// the queue at once, as finished workers and stop manifests do. Each
// child is claimed by one worker: one started status per spawn, never more
// children creating or running than max_running_children.
func TestStartQueuedClaimsEachChildOnce(t *testing.T) {
	const children, slots, freers = 60, 4, 8
	ctx := context.Background()
	st, err := store.Open(filepath.Join(t.TempDir(), "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g := grant.Default()
	g.MaxRunningChildren = slots
	doc, _ := json.Marshal(g)
	if err := st.CreateSandbox(ctx, store.Sandbox{Name: "lead", UUID: "u-lead", Role: wire.RoleOrchestrator,
		Branch: "main", Repo: t.TempDir(), State: store.StateRunning, Grant: string(doc)}); err != nil {
		t.Fatal(err)
	}
	for i := range children {
		name := fmt.Sprintf("c%02d", i)
		raw, _ := json.Marshal(spawnDoc{Ref: "spawn-" + name, Kind: "fork"})
		if err := st.CreateSandbox(ctx, store.Sandbox{Name: name, UUID: "pending-" + name, Role: wire.RoleChild, Parent: "lead",
			Branch: name, State: store.StateQueued, QueuedSeq: int64(i + 1), SpawnDoc: string(raw)}); err != nil {
			t.Fatal(err)
		}
	}
	o := &Orchestrator{Store: st}
	var workers, overfull atomic.Int64
	o.Go = func(func(context.Context)) {
		workers.Add(1)
		if active, _, err := o.slots(ctx, "lead"); err == nil && len(active) > slots {
			overfull.Add(1)
		}
	}
	var wg sync.WaitGroup
	for range freers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				o.startQueued(ctx, "lead")
				all, err := st.Sandboxes(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				left := false
				for _, c := range all {
					switch c.State {
					case store.StateCreating:
						st.DeleteSandbox(ctx, c.Name) // its create failed: its slot frees
						left = true
					case store.StateQueued:
						left = true
					}
				}
				if !left {
					return
				}
			}
		}()
	}
	wg.Wait()

	items, err := st.ListItems(ctx, "lead", false)
	if err != nil {
		t.Fatal(err)
	}
	started := map[string]int{}
	for _, it := range items {
		var s wire.StatusItem
		json.Unmarshal(it.Doc, &s)
		if s.State == wire.StateStarted {
			started[s.Ref]++
		}
	}
	for i := range children {
		ref := fmt.Sprintf("spawn-c%02d", i)
		if started[ref] != 1 {
			t.Errorf("%s: %d started statuses, want 1", ref, started[ref])
		}
	}
	if n := workers.Load(); n != children {
		t.Errorf("%d workers started for %d children", n, children)
	}
	if n := overfull.Load(); n > 0 {
		t.Errorf("%d workers started while more than %d children took a slot", n, slots)
	}
}
