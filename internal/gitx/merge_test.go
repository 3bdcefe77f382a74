package gitx_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/gitx"
)

// hostRunner runs a "sandbox" command as a plain process: Merge's logic
// is the same wherever git runs, and these repositories are the test's own.
var hostRunner = gitx.RunnerFunc(func(ctx context.Context, c gitx.Cmd) (int, error) {
	cmd := exec.CommandContext(ctx, c.Argv[0], c.Argv[1:]...)
	cmd.Dir, cmd.Stdin, cmd.Stdout, cmd.Stderr = c.Dir, c.Stdin, c.Stdout, c.Stderr
	cmd.Env = []string{"HOME=" + c.Dir, "GIT_CONFIG_NOSYSTEM=1"}
	for k, v := range c.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	return 0, err
})

// commitFile writes path in repo and commits it; it returns the commit.
func commitFile(t *testing.T, repo, path, content string) string {
	t.Helper()
	writeFile(t, filepath.Join(repo, path), content)
	git(t, repo, "add", path)
	git(t, repo, "commit", "--quiet", "-m", "change "+path)
	return git(t, repo, "rev-parse", "HEAD")
}

// setGitlink commits a submodule entry at path pointing at commit, with
// the empty directory of a submodule that is not checked out.
func setGitlink(t *testing.T, repo, path, commit string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(repo, path), 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, repo, "update-index", "--add", "--cacheinfo", "160000,"+commit+","+path)
	git(t, repo, "commit", "--quiet", "-m", "gitlink "+path)
	return git(t, repo, "rev-parse", "HEAD")
}

func TestMerge(t *testing.T) {
	const (
		linkA = "1111111111111111111111111111111111111111"
		linkB = "2222222222222222222222222222222222222222"
	)
	// Each case gets a repository on main at its second commit; prepare
	// makes the other side on branch "other" (from main's first commit
	// unless it says otherwise) and the branch's own changes, and returns
	// the commit to merge.
	cases := []struct {
		name     string
		prepare  func(t *testing.T, repo, first, second string) string
		how      string
		conflict string // the ConflictError's paths, when refused
	}{
		{
			name:    "already contained",
			prepare: func(t *testing.T, repo, first, second string) string { return first },
			how:     gitx.MergeContained,
		},
		{
			name: "fast-forward",
			prepare: func(t *testing.T, repo, first, second string) string {
				git(t, repo, "checkout", "--quiet", "-b", "other")
				c := commitFile(t, repo, "new.txt", "new\n")
				git(t, repo, "checkout", "--quiet", "main")
				return c
			},
			how: gitx.MergeFastForward,
		},
		{
			name: "divergent: merge commit",
			prepare: func(t *testing.T, repo, first, second string) string {
				git(t, repo, "checkout", "--quiet", "-b", "other", first)
				c := commitFile(t, repo, "other.txt", "other\n")
				git(t, repo, "checkout", "--quiet", "main")
				return c
			},
			how: gitx.MergeCommit,
		},
		{
			name: "content conflict",
			prepare: func(t *testing.T, repo, first, second string) string {
				git(t, repo, "checkout", "--quiet", "-b", "other", first)
				c := commitFile(t, repo, "README", "three\n")
				git(t, repo, "checkout", "--quiet", "main")
				return c
			},
			conflict: `"README"`,
		},
		{
			name: "many conflicts: five named",
			prepare: func(t *testing.T, repo, first, second string) string {
				for i := range 7 {
					writeFile(t, filepath.Join(repo, fmt.Sprintf("f%d", i)), "base\n")
				}
				git(t, repo, "add", ".")
				git(t, repo, "commit", "--quiet", "-m", "files")
				base := git(t, repo, "rev-parse", "HEAD")
				for i := range 7 {
					writeFile(t, filepath.Join(repo, fmt.Sprintf("f%d", i)), "ours\n")
				}
				git(t, repo, "commit", "--quiet", "-am", "ours")
				git(t, repo, "checkout", "--quiet", "-b", "other", base)
				for i := range 7 {
					writeFile(t, filepath.Join(repo, fmt.Sprintf("f%d", i)), "theirs\n")
				}
				git(t, repo, "commit", "--quiet", "-am", "theirs")
				c := git(t, repo, "rev-parse", "HEAD")
				git(t, repo, "checkout", "--quiet", "main")
				return c
			},
			conflict: `"f0", "f1", "f2", "f3", "f4", ...`,
		},
		{
			name: "gitlink changed the same way on both sides: refused anyway",
			prepare: func(t *testing.T, repo, first, second string) string {
				git(t, repo, "checkout", "--quiet", "-b", "other", first)
				c := setGitlink(t, repo, "sub", linkA)
				git(t, repo, "checkout", "--quiet", "main")
				setGitlink(t, repo, "sub", linkA)
				return c
			},
			conflict: `"sub"`,
		},
		{
			name: "gitlink changed on both sides differently",
			prepare: func(t *testing.T, repo, first, second string) string {
				git(t, repo, "checkout", "--quiet", "-b", "other", first)
				c := setGitlink(t, repo, "sub", linkA)
				git(t, repo, "checkout", "--quiet", "main")
				setGitlink(t, repo, "sub", linkB)
				return c
			},
			conflict: `"sub"`,
		},
		{
			name: "gitlink changed on one side only: merged",
			prepare: func(t *testing.T, repo, first, second string) string {
				git(t, repo, "checkout", "--quiet", "-b", "other", first)
				c := setGitlink(t, repo, "sub", linkA)
				git(t, repo, "checkout", "--quiet", "main")
				return c
			},
			how: gitx.MergeCommit,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir, first, second := newRepo(t)
			commit := tc.prepare(t, dir, first, second)
			before := git(t, dir, "rev-parse", "HEAD")
			repo := gitx.SandboxRepo("child", hostRunner, dir)
			res, err := gitx.Merge(ctx, repo, commit, "Merge update")
			if tc.conflict != "" {
				var ce *gitx.ConflictError
				if !errors.As(err, &ce) || ce.Paths != tc.conflict {
					t.Fatalf("Merge = %+v, %v; want a conflict in %s", res, err, tc.conflict)
				}
				if after := git(t, dir, "rev-parse", "HEAD"); after != before {
					t.Fatalf("a refused merge moved HEAD from %s to %s", before, after)
				}
				if st := git(t, dir, "status", "--porcelain"); st != "" {
					t.Fatalf("a refused merge left changes:\n%s", st)
				}
				if in, err := gitx.MergeInProgress(ctx, repo); err != nil || in {
					t.Fatalf("MergeInProgress after a refusal = %v, %v", in, err)
				}
				return
			}
			if err != nil || res.How != tc.how {
				t.Fatalf("Merge = %+v, %v; want %s", res, err, tc.how)
			}
			head := git(t, dir, "rev-parse", "HEAD")
			if res.Head != head {
				t.Fatalf("Merge says HEAD %s, repository has %s", res.Head, head)
			}
			if branch := git(t, dir, "symbolic-ref", "--short", "HEAD"); branch != "main" {
				t.Fatalf("HEAD left main for %s", branch)
			}
			parents := strings.Fields(git(t, dir, "rev-list", "--parents", "-n1", "HEAD"))[1:]
			switch tc.how {
			case gitx.MergeContained:
				if head != before {
					t.Fatalf("a contained commit moved HEAD")
				}
			case gitx.MergeFastForward:
				if head != commit {
					t.Fatalf("fast-forward: HEAD %s, want %s", head, commit)
				}
			case gitx.MergeCommit:
				if len(parents) != 2 || parents[0] != before || parents[1] != commit {
					t.Fatalf("merge commit parents %v, want [%s %s]", parents, before, commit)
				}
				if who := git(t, dir, "log", "-1", "--format=%an <%ae>|%s"); who != "jailbee <jailbee@localhost>|Merge update" {
					t.Fatalf("merge commit by/subject %q", who)
				}
			}
			if st := git(t, dir, "status", "--porcelain"); st != "" {
				t.Fatalf("the merge left changes:\n%s", st)
			}
		})
	}
}

func TestMergeRefusesNonCommitArgument(t *testing.T) {
	dir, _, _ := newRepo(t)
	repo := gitx.SandboxRepo("child", hostRunner, dir)
	for _, arg := range []string{"--abort", "main", "HEAD~1", ""} {
		if _, err := gitx.Merge(context.Background(), repo, arg, "m"); !errors.Is(err, gitx.ErrInvalidArgument) {
			t.Errorf("Merge(%q) = %v, want ErrInvalidArgument", arg, err)
		}
	}
	if _, err := gitx.Merge(context.Background(), gitx.HostRepo(dir), strings.Repeat("a", 40), "m"); err == nil {
		t.Error("Merge ran on a host repository")
	}
}

func TestMergeInProgress(t *testing.T) {
	ctx := context.Background()
	dir, first, _ := newRepo(t)
	repo := gitx.SandboxRepo("child", hostRunner, dir)
	if in, err := gitx.MergeInProgress(ctx, repo); err != nil || in {
		t.Fatalf("MergeInProgress on a quiet repository = %v, %v", in, err)
	}
	git(t, dir, "checkout", "--quiet", "-b", "other", first)
	commitFile(t, dir, "README", "three\n")
	git(t, dir, "checkout", "--quiet", "main")
	cmd := exec.Command("git", "-c", "user.name=T", "-c", "user.email=t@example.com", "merge", "other")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("the conflicting merge succeeded:\n%s", out)
	}
	if in, err := gitx.MergeInProgress(ctx, repo); err != nil || !in {
		t.Fatalf("MergeInProgress in a conflicted merge = %v, %v; want true", in, err)
	}
}
