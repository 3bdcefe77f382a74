package gitx_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"agentbox/internal/gitx"
)

// TestAttackAddWorktreeIgnoresReplaceRefs: a consumer that owned the
// repository's refs during a managed launch runs `git replace ASSIGNED
// OTHER`. The operator fixes owners back and runs `git fsck`, which says
// nothing about replace refs; the next launch's `git worktree add` at the
// assigned revision then checked out OTHER's tree. AddWorktree must check
// out the commit it is given, loose or packed replace refs whatever.
func TestAttackAddWorktreeIgnoresReplaceRefs(t *testing.T) {
	ctx := context.Background()
	repo, first, second := newRepo(t)
	git(t, repo, "replace", first, second)
	if got := git(t, repo, "show", first+":README"); got != "two" {
		t.Fatalf("git reads %q for the replaced commit: the attack needs the replacement", got)
	}
	for i, pack := range []bool{false, true} {
		if pack {
			git(t, repo, "pack-refs", "--all")
		}
		wt := filepath.Join(t.TempDir(), "wt")
		branch := []string{"task/loose", "task/packed"}[i]
		if err := gitx.AddWorktree(ctx, repo, wt, branch, first); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(wt, "README"))
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != "one\n" {
			t.Errorf("packed refs %v: the worktree at %s holds %q, the replacement's content", pack, first, data)
		}
	}
}
