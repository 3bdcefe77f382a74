package broker

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
)

// TestConnBudget: a tree holds at most treeMax connections; all trees
// together at most what the descriptors allow once each served sandbox's
// reserve is kept; a release frees one place, once.
func TestConnBudget(t *testing.T) {
	const served = 3
	// Room for exactly 10 connections across trees.
	descriptors := served*descriptorsPerSandbox + 10*descriptorsPerConn
	for _, tc := range []struct {
		name    string
		treeMax int
		take    map[string]int // admitted first
		tree    string         // then one more of this tree
		served  int
		refused string // "" admitted
	}{
		{name: "tree below its bound", treeMax: 4, take: map[string]int{"a": 3}, tree: "a", served: served},
		{name: "tree at its bound", treeMax: 4, take: map[string]int{"a": 4}, tree: "a", served: served, refused: "orchestrator a and its children hold 4 model and egress connections at once, the most tree.max_connections allows"},
		{name: "another tree beside a full one", treeMax: 4, take: map[string]int{"a": 4}, tree: "b", served: served},
		{name: "descriptors: the last place", treeMax: 100, take: map[string]int{"a": 5, "b": 4}, tree: "c", served: served},
		{name: "descriptors: past the last place", treeMax: 100, take: map[string]int{"a": 5, "b": 5}, tree: "c", served: served, refused: "as many model and egress connections as its open-file limit allows (10 across all sandboxes)"},
		{name: "a sandbox more served keeps its reserve", treeMax: 100, take: map[string]int{"a": 5, "b": 4}, tree: "c", served: served + 1, refused: "open-file limit"},
		{name: "no room at all", treeMax: 100, tree: "a", served: served + 10, refused: "open-file limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConnBudget(tc.treeMax, descriptors)
			for tree, n := range tc.take {
				for i := range n {
					// each its own sandbox: the share is tested below
					if _, err := c.admit(tree, fmt.Sprint(tree, i), "kid", false, served); err != nil {
						t.Fatalf("setting up %s: %v", tree, err)
					}
				}
			}
			release, err := c.admit(tc.tree, tc.tree+"-new", "kid", false, tc.served)
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("got %v, want a refusal with %q", err, tc.refused)
			case err == nil:
				release()
			}
		})
	}
}

func TestConnBudgetRelease(t *testing.T) {
	c := newConnBudget(1, 100)
	release, err := c.admit("a", "s", "s", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.admit("a", "t", "t", false, 0); err == nil {
		t.Fatal("a second connection of a tree bounded at 1 was admitted")
	}
	release()
	release() // a second release gives back nothing more
	if _, err := c.admit("a", "s", "s", false, 0); err != nil {
		t.Fatalf("after the release: %v", err)
	}
	if _, err := c.admit("a", "t", "t", false, 0); err == nil {
		t.Fatal("a double release freed two places")
	}
	if c.held != 1 || len(c.byTree) != 1 || len(c.bySandbox) != 1 || len(c.childrenOf) != 0 {
		t.Fatalf("held %d, by tree %v, by sandbox %v", c.held, c.byTree, c.bySandbox)
	}
}

// TestConnBudgetSandboxShare: one child holds at most a quarter of its
// tree's bound (at the share, and one past it), and its release gives its
// place back; its sibling and its orchestrator are served beside it.
func TestConnBudgetSandboxShare(t *testing.T) {
	c := newConnBudget(16, 1000)
	var releases []func()
	for i := range 4 {
		release, err := c.admit("lead", "u-kid", "kid", true, 0)
		if err != nil {
			t.Fatalf("connection %d of the share: %v", i+1, err)
		}
		releases = append(releases, release)
	}
	_, err := c.admit("lead", "u-kid", "kid", true, 0)
	if err == nil || !strings.Contains(err.Error(), "sandbox kid holds 4 model and egress connections at once, the most it may (a child, a quarter of tree.max_connections)") {
		t.Fatalf("past the share: %v", err)
	}
	for _, who := range []string{"sib", "lead"} {
		if _, err := c.admit("lead", "u-"+who, who, who != "lead", 0); err != nil {
			t.Fatalf("%s beside a child's full share: %v", who, err)
		}
	}
	releases[0]()
	if _, err := c.admit("lead", "u-kid", "kid", true, 0); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	for _, tc := range []struct {
		treeMax, orchestrator, child, children int
	}{{16, 8, 4, 8}, {1024, 512, 256, 512}, {3, 1, 1, 2}, {1, 1, 1, 1}} {
		if o, k, ks := sandboxShare(tc.treeMax, false), sandboxShare(tc.treeMax, true), childrenShare(tc.treeMax); o != tc.orchestrator || k != tc.child || ks != tc.children {
			t.Errorf("a bound of %d: shares %d, %d, %d, want %d, %d, %d", tc.treeMax, o, k, ks, tc.orchestrator, tc.child, tc.children)
		}
	}
}

// TestConnBudgetChildrenShare: an orchestrator's children together hold at
// most what its share leaves of the tree's bound (at it, and one past it,
// whichever child asks), and the orchestrator still gets its whole share
// beside them; a child's release gives the children a place back. With a
// bound of 1, the child may take the one place.
func TestConnBudgetChildrenShare(t *testing.T) {
	c := newConnBudget(16, 1000)
	var releases []func()
	for i := range 8 {
		release, err := c.admit("lead", fmt.Sprint("u-kid", i%2), "kid", true, 0)
		if err != nil {
			t.Fatalf("connection %d of the children's share: %v", i+1, err)
		}
		releases = append(releases, release)
	}
	_, err := c.admit("lead", "u-sib", "sib", true, 0)
	if err == nil || !strings.Contains(err.Error(), "the children of orchestrator lead hold 8 model and egress connections at once, the most they may together (half of tree.max_connections: the rest is kept for lead)") {
		t.Fatalf("a child past the children's share: %v", err)
	}
	for i := range 8 {
		if _, err := c.admit("lead", "u-lead", "lead", false, 0); err != nil {
			t.Fatalf("the orchestrator's connection %d beside its full children: %v", i+1, err)
		}
	}
	releases[0]()
	if _, err := c.admit("lead", "u-sib", "sib", true, 0); err != nil {
		t.Fatalf("after a child's release: %v", err)
	}
	one := newConnBudget(1, 1000)
	if _, err := one.admit("lead", "u-kid", "kid", true, 0); err != nil {
		t.Fatalf("a bound of 1: %v", err)
	}
	if _, err := one.admit("lead", "u-lead", "lead", false, 0); err == nil || !strings.Contains(err.Error(), "orchestrator lead and its children hold 1 model and egress connections at once, the most tree.max_connections allows") {
		t.Fatalf("past a bound of 1: %v", err)
	}
}

// TestSpareDescriptors: the budget follows the process's open-file limit
// (lowered here, then put back).
func TestSpareDescriptors(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	before, err := spareDescriptors()
	if err != nil {
		t.Fatal(err)
	}
	if lim.Cur < 2000 {
		t.Skipf("open-file limit %d is too low to lower", lim.Cur)
	}
	lowered := lim
	lowered.Cur -= 500
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	after, err := spareDescriptors()
	if err != nil {
		t.Fatal(err)
	}
	// Other tests' descriptors may come and go meanwhile: a few either way.
	if d := before - after; d < 490 || d > 510 {
		t.Fatalf("lowering the limit by 500 took %d from the budget (%d -> %d)", d, before, after)
	}
}
