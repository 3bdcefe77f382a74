package broker

import (
	"strings"
	"testing"

	"agentbox/internal/modelproxy"
)

// TestBodyBudget: one sandbox holds at most half its tree's bytes of model
// request bodies, a tree at most TreeMaxModelBodyBytes, each exactly at
// its bound and refused one byte past it; another tree is not held back.
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
		{name: "a sandbox at its share", take: map[string]int64{"a/s1": 3 * full}, tree: "a", sandbox: "s1", n: full},
		{name: "a sandbox one byte past its share", take: map[string]int64{"a/s1": 3 * full}, tree: "a", sandbox: "s1", n: full + 1,
			refused: "sandbox s1 holds 96.0 MiB of model request bodies at once and this one may hold 32.0 MiB: more than one sandbox may (128.0 MiB, half of its tree's)"},
		{name: "a tree at its bound", take: map[string]int64{"a/s1": 4 * full, "a/s2": 3 * full}, tree: "a", sandbox: "s3", n: full},
		{name: "a tree one byte past its bound", take: map[string]int64{"a/s1": 4 * full, "a/s2": 3 * full}, tree: "a", sandbox: "s3", n: full + 1,
			refused: "orchestrator a and its children hold 224.0 MiB of model request bodies at once and this one may hold 32.0 MiB: more than they may (256.0 MiB)"},
		{name: "another tree beside a full one", take: map[string]int64{"a/s1": 4 * full, "a/s2": 4 * full}, tree: "b", sandbox: "s9", n: full},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newBodyBudget(TreeMaxModelBodyBytes)
			for key, n := range tc.take {
				tree, sandbox, _ := strings.Cut(key, "/")
				if _, err := c.admit(tree, sandbox, sandbox, n); err != nil {
					t.Fatalf("setting up %s: %v", key, err)
				}
			}
			release, err := c.admit(tc.tree, tc.sandbox, tc.sandbox, tc.n)
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

// TestBodyBudgetRelease: a release gives its bytes back, once.
func TestBodyBudgetRelease(t *testing.T) {
	c := newBodyBudget(TreeMaxModelBodyBytes)
	release, err := c.admit("a", "s", "s", SandboxMaxModelBodyBytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.admit("a", "s", "s", 1); err == nil {
		t.Fatal("admitted past the share")
	}
	release()
	release()
	if len(c.byTree) != 0 || len(c.bySandbox) != 0 {
		t.Fatalf("after the release: %v %v", c.byTree, c.bySandbox)
	}
	if _, err := c.admit("a", "s", "s", SandboxMaxModelBodyBytes); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}
