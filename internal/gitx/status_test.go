package gitx_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"agentbox/internal/gitx"
)

// TestReadWorkTree: one git status gives the branch, HEAD and whether
// anything is changed, staged or untracked; HEAD without a commit is an
// error.
func TestReadWorkTree(t *testing.T) {
	ctx := context.Background()
	repo, first, second := newRepo(t)
	r := gitx.SandboxRepo("child", hostRunner, repo)
	for _, tc := range []struct {
		name  string
		setup func()
		want  gitx.WorkTree
	}{
		{"clean", func() {}, gitx.WorkTree{Branch: "main", Commit: second, Clean: true}},
		{"untracked", func() { writeFile(t, filepath.Join(repo, "new"), "x") }, gitx.WorkTree{Branch: "main", Commit: second}},
		{"staged", func() { git(t, repo, "add", "new") }, gitx.WorkTree{Branch: "main", Commit: second}},
		{"changed", func() {
			git(t, repo, "rm", "-q", "--cached", "new")
			os.Remove(filepath.Join(repo, "new"))
			writeFile(t, filepath.Join(repo, "README"), "three\n")
		}, gitx.WorkTree{Branch: "main", Commit: second}},
		{"detached", func() { git(t, repo, "checkout", "-q", "-f", "--detach", first) }, gitx.WorkTree{Commit: first, Clean: true}},
		{"other branch", func() { git(t, repo, "checkout", "-q", "-b", "work/x") }, gitx.WorkTree{Branch: "work/x", Commit: first, Clean: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			got, err := gitx.ReadWorkTree(ctx, r)
			if err != nil || got != tc.want {
				t.Fatalf("ReadWorkTree = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	empty := filepath.Join(t.TempDir(), "empty")
	git(t, "", "init", "-q", empty)
	if got, err := gitx.ReadWorkTree(ctx, gitx.SandboxRepo("child", hostRunner, empty)); err == nil {
		t.Fatalf("a repository without a commit: %+v", got)
	}
}
