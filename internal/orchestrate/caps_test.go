package orchestrate

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/config"
	"agentbox/internal/grant"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// capsFixture is an orchestrator `lead` over a real host repository, with
// a store holding its children; no sandbox is ever made (Go is nil).
type capsFixture struct {
	o    *Orchestrator
	st   *store.Store
	g    grant.Grant
	repo string
}

func newCapsFixture(t *testing.T, slots int) *capsFixture {
	t.Helper()
	repo := t.TempDir()
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init"}} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	st, err := store.Open(filepath.Join(t.TempDir(), "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	g := grant.Default()
	g.MaxRunningChildren = slots
	doc, _ := json.Marshal(g)
	if err := st.CreateSandbox(context.Background(), store.Sandbox{Name: "lead", UUID: "u-lead", Role: wire.RoleOrchestrator,
		Branch: "main", Repo: repo, State: store.StateRunning, Grant: string(doc)}); err != nil {
		t.Fatal(err)
	}
	return &capsFixture{o: &Orchestrator{Store: st}, st: st, g: g, repo: repo}
}

// addChildren records n children of lead in state.
func (f *capsFixture) addChildren(t *testing.T, prefix string, n int, state string) {
	t.Helper()
	for i := range n {
		name := fmt.Sprintf("%s%02d", prefix, i)
		sb := store.Sandbox{Name: name, UUID: "u-" + name, Role: wire.RoleChild, Parent: "lead", Branch: name, Repo: f.repo, State: state}
		if state == store.StateQueued {
			sb.QueuedSeq = int64(i + 1)
		}
		if err := f.st.CreateSandbox(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
	}
}

// spawn sends lead's spawn of a new child on branch, and returns its
// first status.
func (f *capsFixture) spawn(t *testing.T, branch string) wire.StatusItem {
	t.Helper()
	m := &manifest.Manifest{Version: 1, ID: "spawn-" + strings.ReplaceAll(branch, "/", "-"), Type: manifest.TypeSpawn,
		Spawn: &manifest.Spawn{Kind: manifest.KindNew, Branch: branch, Base: "main", Prompt: "work"}}
	from := manifest.Sender{Caller: wire.Caller{Sandbox: "lead", Role: wire.RoleOrchestrator}, Grant: &f.g, Repo: scriptedRepo()}
	sent, err := f.o.Spawn(context.Background(), from.Caller, m, from)
	if err != nil {
		t.Fatal(err)
	}
	var st wire.StatusItem
	if err := json.Unmarshal(sent.Status.Doc, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestSpawnRefusedAtMaxChildren: failed and stopped children count
// toward the cap; the 64th child is accepted, the 65th refused, naming
// the cap and the states of the children that fill it.
func TestSpawnRefusedAtMaxChildren(t *testing.T) {
	f := newCapsFixture(t, 100)
	f.addChildren(t, "failed", 40, store.StateFailed)
	f.addChildren(t, "stopped", DefaultMaxChildren-41, store.StateStopped)
	if st := f.spawn(t, "work/last"); st.State != wire.StateStarted {
		t.Fatalf("spawn of child %d: %s %q, want started", DefaultMaxChildren, st.State, st.Detail)
	}
	st := f.spawn(t, "work/one-more")
	want := "you have 64 children (at most 64, in any state): 40 failed, 23 stopped, 1 creating; destroy one before spawning another"
	if st.State != wire.StateRefused || st.Detail != want {
		t.Fatalf("spawn past the cap: %s %q, want refused %q", st.State, st.Detail, want)
	}
	if _, err := f.st.Sandbox(context.Background(), "work-one-more"); err == nil {
		t.Error("the refused spawn recorded its child")
	}
}

// TestSpawnRefusedAtMaxQueuedSpawns: with every slot used, the 32nd
// queued spawn is accepted and the 33rd refused, naming the cap and the
// children holding the slots.
func TestSpawnRefusedAtMaxQueuedSpawns(t *testing.T) {
	f := newCapsFixture(t, 2)
	f.addChildren(t, "run", 2, store.StateRunning)
	f.addChildren(t, "wait", DefaultMaxQueuedSpawns-1, store.StateQueued)
	if st := f.spawn(t, "work/last"); st.State != wire.StateQueued {
		t.Fatalf("queued spawn %d: %s %q, want queued", DefaultMaxQueuedSpawns, st.State, st.Detail)
	}
	st := f.spawn(t, "work/one-more")
	want := "your spawn queue is full: 32 queued (at most 32, spawns and restarts) for 2 running slots, used by `run00`, `run01`; stop or destroy a child before spawning another"
	if st.State != wire.StateRefused || st.Detail != want {
		t.Fatalf("spawn past the queue cap: %s %q, want refused %q", st.State, st.Detail, want)
	}
}

// scriptedRepo is a repository config whose default agent is a command.
func scriptedRepo() *config.Repo {
	c := config.Default()
	c.Agents = map[string]config.Agent{"scripted": {Command: "true", PromptArgs: []string{"{prompt}"}}}
	c.DefaultAgent = "scripted"
	return c
}

// TestMessagesToFailedChildrenRefusedAtTreeBudget: an orchestrator
// flooding its failed children with 60 KiB messages is refused once the
// children's inboxes together reach the tree budget, though each child's
// own inbox has room; the refusal names the budget and the children that
// hold it.
func TestMessagesToFailedChildrenRefusedAtTreeBudget(t *testing.T) {
	f := newCapsFixture(t, 4)
	f.addChildren(t, "dead", 3, store.StateFailed)
	f.st.SetQuota(store.Quota{MaxUnreadItems: 1000, MaxUnreadBytes: 32 << 20, TreeMaxUnreadItems: 1000, TreeMaxUnreadBytes: 1 << 20})
	lead := wire.Caller{Sandbox: "lead", Role: wire.RoleOrchestrator}
	body := strings.Repeat("x", 60<<10)
	var refusal *Refusal
	sent := 0
	for i := 0; refusal == nil && i < 100; i++ {
		_, err := f.o.SendMessage(context.Background(), lead, Message{ID: fmt.Sprintf("m-%d", i), To: fmt.Sprintf("dead%02d", i%3), Kind: "note", Body: body})
		if r, ok := AsRefusal(err); ok {
			refusal = r
		} else if err != nil {
			t.Fatal(err)
		} else {
			sent++
		}
	}
	if refusal == nil {
		t.Fatal("100 messages of 60 KiB delivered within a 1 MiB tree budget")
	}
	if sent != 17 { // 17 documents of a little over 60 KiB fit in 1 MiB
		t.Errorf("%d messages delivered before the refusal, want 17", sent)
	}
	want := "the inboxes of `lead` and its children are full: 17 unread messages (at most 1000) and 1022 KiB unread (at most 1 MiB), no room for this message (60.1 KiB), held by `dead01` (6 messages, 360.7 KiB), `dead00` (6 messages, 360.7 KiB), `dead02` (5 messages, 300.6 KiB); send again with a new id once they have read their messages, or destroy children that never will"
	if refusal.Detail != want {
		t.Errorf("refusal:\n got %q\nwant %q", refusal.Detail, want)
	}
}

// TestSpawnRefusedAtSpawnsPerHour: an orchestrator spawning and
// destroying children in a loop (each takes a host uid for good) has its
// 256th spawn of the hour accepted and its 257th refused, naming the cap
// and when the next is allowed; destroying children frees no place in the
// count, another orchestrator is not held by it, and the place comes back
// an hour after the oldest spawn.
func TestSpawnRefusedAtSpawnsPerHour(t *testing.T) {
	f := newCapsFixture(t, DefaultMaxChildren)
	clock := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
	f.o.now = func() time.Time { return clock }
	ctx := context.Background()
	for i := range DefaultMaxSpawnsPerHour {
		branch := fmt.Sprintf("loop/%03d", i)
		if st := f.spawn(t, branch); st.State != wire.StateStarted {
			t.Fatalf("spawn %d: %s %q, want started", i+1, st.State, st.Detail)
		}
		if err := f.st.DeleteSandbox(ctx, "loop-"+fmt.Sprintf("%03d", i)); err != nil { // destroyed: its place in max_children is free
			t.Fatal(err)
		}
		if i == 0 {
			clock = clock.Add(10 * time.Minute) // the others come 10 minutes after the first
		}
	}
	st := f.spawn(t, "loop/one-more")
	want := "you have spawned 256 children in the last hour (at most 256 an hour: each new child takes a host uid that is never given again); spawn again in 50m0s"
	if st.State != wire.StateRefused || st.Detail != want {
		t.Fatalf("spawn past the rate: %s %q, want refused %q", st.State, st.Detail, want)
	}
	if _, err := f.st.Sandbox(ctx, "loop-one-more"); err == nil {
		t.Error("the refused spawn recorded its child")
	}

	// Another orchestrator's spawns are counted apart.
	doc, _ := json.Marshal(f.g)
	if err := f.st.CreateSandbox(ctx, store.Sandbox{Name: "other", UUID: "u-other", Role: wire.RoleOrchestrator,
		Branch: "other", Repo: f.repo, State: store.StateRunning, Grant: string(doc)}); err != nil {
		t.Fatal(err)
	}
	m := &manifest.Manifest{Version: 1, ID: "spawn-other", Type: manifest.TypeSpawn,
		Spawn: &manifest.Spawn{Kind: manifest.KindNew, Branch: "other/kid", Base: "main", Prompt: "work"}}
	from := manifest.Sender{Caller: wire.Caller{Sandbox: "other", Role: wire.RoleOrchestrator}, Grant: &f.g, Repo: scriptedRepo()}
	sent, err := f.o.Spawn(ctx, from.Caller, m, from)
	if err != nil {
		t.Fatal(err)
	}
	var other wire.StatusItem
	if err := json.Unmarshal(sent.Status.Doc, &other); err != nil || other.State != wire.StateStarted {
		t.Fatalf("another orchestrator's spawn: %+v %v, want started", other, err)
	}

	// An hour after the first spawn, one place is back, and only one.
	clock = clock.Add(50 * time.Minute)
	if st := f.spawn(t, "loop/after-hour"); st.State != wire.StateStarted {
		t.Fatalf("spawn an hour after the first: %s %q, want started", st.State, st.Detail)
	}
	if st := f.spawn(t, "loop/and-one-more"); st.State != wire.StateRefused || !strings.HasSuffix(st.Detail, "spawn again in 10m0s") {
		t.Fatalf("the next spawn: %s %q, want refused until the second spawn's hour ends", st.State, st.Detail)
	}
}

// TestSpawnRateCap: broker.yaml's tree.max_spawns_per_hour reaches the
// count, and a queued spawn counts as one.
func TestSpawnRateCap(t *testing.T) {
	f := newCapsFixture(t, 1)
	f.o.Caps = Caps{MaxSpawnsPerHour: 2}
	if st := f.spawn(t, "one"); st.State != wire.StateStarted {
		t.Fatalf("first spawn: %s %q", st.State, st.Detail)
	}
	if st := f.spawn(t, "two"); st.State != wire.StateQueued {
		t.Fatalf("second spawn: %s %q, want queued", st.State, st.Detail)
	}
	if st := f.spawn(t, "three"); st.State != wire.StateRefused || !strings.HasPrefix(st.Detail, "you have spawned 2 children in the last hour (at most 2 an hour") {
		t.Fatalf("third spawn: %s %q, want refused at 2 an hour", st.State, st.Detail)
	}
}
