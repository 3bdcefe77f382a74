package broker

import (
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
				for range n {
					if _, err := c.admit(tree, served); err != nil {
						t.Fatalf("setting up %s: %v", tree, err)
					}
				}
			}
			release, err := c.admit(tc.tree, tc.served)
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
	release, err := c.admit("a", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.admit("a", 0); err == nil {
		t.Fatal("a second connection of a tree bounded at 1 was admitted")
	}
	release()
	release() // a second release gives back nothing more
	if _, err := c.admit("a", 0); err != nil {
		t.Fatalf("after the release: %v", err)
	}
	if _, err := c.admit("a", 0); err == nil {
		t.Fatal("a double release freed two places")
	}
	if c.held != 1 || len(c.byTree) != 1 {
		t.Fatalf("held %d, by tree %v", c.held, c.byTree)
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
