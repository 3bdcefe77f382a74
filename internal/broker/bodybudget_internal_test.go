package broker

import (
	"strings"
	"testing"

	"agentbox/internal/modelproxy"
)

// TestBodyBudget: an orchestrator holds at most half its tree's bytes of
// model request bodies, one child a quarter, and the children together
// the other half, each exactly at its bound and refused one byte past it;
// the orchestrator keeps its half beside children that fill theirs;
// another tree is not held back. A sandbox named as its tree is the
// orchestrator.
func TestBodyBudget(t *testing.T) {
	const full = modelproxy.MaxRequestBytes
	for _, tc := range []struct {
		name    string
		take    map[string]int64 // "tree/sandbox": bytes admitted first
		tree    string           // then n more bytes of this tree's
		sandbox string           // sandbox
		n       int64
		refused string // "" admitted
	}{
		{name: "a child at its share", take: map[string]int64{"a/s1": full}, tree: "a", sandbox: "s1", n: full},
		{name: "a child one byte past its share", take: map[string]int64{"a/s1": full}, tree: "a", sandbox: "s1", n: full + 1,
			refused: "sandbox s1 holds 32.0 MiB of model request bodies at once and this one may hold 32.0 MiB: more than it may (64.0 MiB, a child, a quarter of its tree's)"},
		{name: "the children at their share", take: map[string]int64{"a/s1": 2 * full, "a/s2": full}, tree: "a", sandbox: "s3", n: full},
		{name: "the children one byte past their share", take: map[string]int64{"a/s1": 2 * full, "a/s2": full}, tree: "a", sandbox: "s3", n: full + 1,
			refused: "the children of orchestrator a hold 96.0 MiB of model request bodies at once and this one may hold 32.0 MiB: more than they may together (128.0 MiB, half of their tree's: the rest is kept for a)"},
		{name: "the orchestrator at its share beside full children", take: map[string]int64{"a/s1": 2 * full, "a/s2": 2 * full, "a/a": 3 * full}, tree: "a", sandbox: "a", n: full},
		{name: "the orchestrator one byte past its share", take: map[string]int64{"a/s1": 2 * full, "a/s2": 2 * full, "a/a": 3 * full}, tree: "a", sandbox: "a", n: full + 1,
			refused: "sandbox a holds 96.0 MiB of model request bodies at once and this one may hold 32.0 MiB: more than it may (128.0 MiB, an orchestrator, half of its tree's)"},
		{name: "another tree beside a full one", take: map[string]int64{"a/s1": 2 * full, "a/s2": 2 * full, "a/a": 4 * full}, tree: "b", sandbox: "s9", n: full},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newBodyBudget(TreeMaxModelBodyBytes)
			for key, n := range tc.take {
				tree, sandbox, _ := strings.Cut(key, "/")
				if _, err := c.admit(tree, sandbox, sandbox, sandbox != tree, n); err != nil {
					t.Fatalf("setting up %s: %v", key, err)
				}
			}
			release, err := c.admit(tc.tree, tc.sandbox, tc.sandbox, tc.sandbox != tc.tree, tc.n)
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
	if sandboxShare(int64(TreeMaxModelBodyBytes), false) != OrchestratorMaxModelBodyBytes || sandboxShare(int64(TreeMaxModelBodyBytes), true) != ChildMaxModelBodyBytes {
		t.Fatal("the named shares are not what the budget admits")
	}
}

// TestBodyBudgetRelease: a release gives its bytes back, once.
func TestBodyBudgetRelease(t *testing.T) {
	c := newBodyBudget(TreeMaxModelBodyBytes)
	release, err := c.admit("a", "s", "s", true, ChildMaxModelBodyBytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.admit("a", "s", "s", true, 1); err == nil {
		t.Fatal("admitted past the share")
	}
	release()
	release()
	if len(c.byTree) != 0 || len(c.bySandbox) != 0 || len(c.childrenOf) != 0 {
		t.Fatalf("after the release: %v %v %v", c.byTree, c.bySandbox, c.childrenOf)
	}
	if _, err := c.admit("a", "s", "s", true, ChildMaxModelBodyBytes); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}
