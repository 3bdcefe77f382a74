package orchestrate

import (
	"testing"
	"time"

	"agentbox/internal/grant"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
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
