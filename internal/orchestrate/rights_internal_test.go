package orchestrate

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"agentbox/internal/grant"
	"agentbox/internal/manifest"
	"agentbox/internal/serial"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// TestPlanRightsExpiries: a timed grant extends a shorter expiry, keeps a
// later one, and never shortens a permanent right; never makes a timed
// right permanent.
func TestPlanRightsExpiries(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	cur := []store.Right{
		{Sandbox: "k", Kind: store.RightMount, Item: "short", Owner: store.OwnerOrchestration, Expires: now.Add(time.Minute)},
		{Sandbox: "k", Kind: store.RightMount, Item: "long", Owner: store.OwnerOrchestration, Expires: now.Add(2 * time.Hour)},
		{Sandbox: "k", Kind: store.RightLoose, Owner: store.OwnerOrchestration},
	}
	grantFor := func(ttl string, items grant.Rights) *manifest.Rights {
		d, never, err := grant.ParseTTL(ttl)
		if err != nil {
			t.Fatal(err)
		}
		return &manifest.Rights{Grant: &manifest.RightsGrant{Items: items, For: ttl, TTL: d, Never: never}}
	}
	p := planRights("k", cur, grantFor("1h", grant.Rights{Mounts: []string{"short", "long"}, Loose: true}), now)
	if len(p.put) != 1 || p.put[0].Item != "short" || !p.put[0].Expires.Equal(now.Add(time.Hour)) {
		t.Fatalf("put %+v, want short extended to 1h", p.put)
	}
	want := "granted mount short for 1h; loose keeps its permanent right (no expiry); mount long keeps its later expiry 1970-01-12T15:46:40Z"
	if got := rightsDetail(p, grantFor("1h", grant.Rights{}).Grant); got != want {
		t.Fatalf("detail %q\nwant   %q", got, want)
	}
	p = planRights("k", cur, grantFor("never", grant.Rights{Mounts: []string{"long"}}), now)
	if len(p.put) != 1 || !p.put[0].Expires.IsZero() || len(p.attach) != 0 {
		t.Fatalf("never: put %+v attach %v, want long permanent, nothing attached again", p.put, p.attach)
	}
}

// TestRightsWaitGivesTheTurnAway: a holder of the broker's turn that
// needs the rights lock while a round holds it (detaching an expired
// mount scans the sandbox's processes, as long as its bound) waits
// without the turn: the executor serves another holder meanwhile, and the
// rights change is made once the lock is free.
func TestRightsWaitGivesTheTurnAway(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(filepath.Join(t.TempDir(), "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.CreateSandbox(ctx, store.Sandbox{Name: "k", UUID: "u-k", Role: wire.RoleOrchestrator,
		Branch: "main", Repo: t.TempDir(), State: store.StateStopped}); err != nil {
		t.Fatal(err)
	}
	o := &Orchestrator{Store: st}
	o.rightsMu.Lock() // the round's expiry, scanning
	ex := &serial.Executor{}
	changed := make(chan error, 1)
	holding := make(chan struct{})
	go ex.Run(ctx, func(ctx context.Context) {
		close(holding)
		_, _, err := o.HandRights(ctx, "k", grant.Rights{Loose: true}, grant.Rights{})
		changed <- err
	})
	<-holding
	// The rights change has the turn; this holder is served while it
	// waits for the lock, or only after (the guard then ends the test).
	other := make(chan struct{})
	go func() {
		ex.Run(ctx, func(context.Context) {})
		close(other)
	}()
	select {
	case <-other:
	case <-time.After(30 * time.Second):
		o.rightsMu.Unlock()
		t.Fatal("another holder waited for the rights lock with the holder that needed it")
	}
	o.rightsMu.Unlock()
	if err := <-changed; err != nil {
		t.Fatalf("the rights change: %v", err)
	}
	if rights, err := st.Rights(ctx, "k"); err != nil || len(rights) != 1 || rights[0].Kind != store.RightLoose {
		t.Fatalf("k's rights: %+v, %v; want loose", rights, err)
	}
}
