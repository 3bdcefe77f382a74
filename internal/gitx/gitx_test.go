package gitx_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/gitx"
)

// git runs a git command for test setup and returns its trimmed output.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=Test", "-c", "user.email=test@example.com"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// newRepo makes a repository on branch main with two commits and returns
// its path and both commit ids.
func newRepo(t *testing.T) (repo, first, second string) {
	t.Helper()
	repo = filepath.Join(t.TempDir(), "repo")
	git(t, "", "init", "--quiet", "--initial-branch=main", repo)
	writeFile(t, filepath.Join(repo, "README"), "one\n")
	git(t, repo, "add", "README")
	git(t, repo, "commit", "--quiet", "-m", "one")
	first = git(t, repo, "rev-parse", "HEAD")
	writeFile(t, filepath.Join(repo, "README"), "two\n")
	git(t, repo, "commit", "--quiet", "-am", "two")
	second = git(t, repo, "rev-parse", "HEAD")
	return repo, first, second
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCurrentBranch(t *testing.T) {
	ctx := context.Background()
	repo, first, _ := newRepo(t)
	got, err := gitx.CurrentBranch(ctx, repo)
	if err != nil || got != "main" {
		t.Fatalf("CurrentBranch = %q, %v; want main", got, err)
	}
	git(t, repo, "checkout", "--quiet", "-b", "feature/x")
	if got, _ := gitx.CurrentBranch(ctx, repo); got != "feature/x" {
		t.Fatalf("CurrentBranch = %q, want feature/x", got)
	}
	git(t, repo, "checkout", "--quiet", "--detach", first)
	if _, err := gitx.CurrentBranch(ctx, repo); !errors.Is(err, gitx.ErrDetachedHead) {
		t.Fatalf("detached: err = %v, want ErrDetachedHead", err)
	}
	_, err = gitx.CurrentBranch(ctx, t.TempDir())
	if err == nil || errors.Is(err, gitx.ErrDetachedHead) {
		t.Fatalf("not a repository: err = %v, want a git error", err)
	}
	if !strings.Contains(err.Error(), "not a git repository") {
		t.Fatalf("error %q does not carry git's message", err)
	}
}

func TestHeadAndResolveCommit(t *testing.T) {
	ctx := context.Background()
	repo, first, second := newRepo(t)
	if got, err := gitx.HeadCommit(ctx, repo); err != nil || got != second {
		t.Fatalf("HeadCommit = %q, %v; want %s", got, err, second)
	}
	for rev, want := range map[string]string{"HEAD~1": first, "main": second, first[:10]: first, "refs/heads/main": second} {
		if got, err := gitx.ResolveCommit(ctx, repo, rev); err != nil || got != want {
			t.Errorf("ResolveCommit(%q) = %q, %v; want %s", rev, got, err, want)
		}
	}
	if _, err := gitx.ResolveCommit(ctx, repo, "no-such-branch"); !errors.Is(err, gitx.ErrUnknownRevision) {
		t.Errorf("missing rev: err = %v, want ErrUnknownRevision", err)
	}
	for _, bad := range []string{"", "--all", "-h"} {
		if _, err := gitx.ResolveCommit(ctx, repo, bad); !errors.Is(err, gitx.ErrInvalidArgument) {
			t.Errorf("ResolveCommit(%q): err = %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func TestIsClean(t *testing.T) {
	ctx := context.Background()
	repo, _, _ := newRepo(t)
	check := func(want bool, when string) {
		t.Helper()
		got, err := gitx.IsClean(ctx, repo)
		if err != nil || got != want {
			t.Fatalf("%s: IsClean = %v, %v; want %v", when, got, err, want)
		}
	}
	check(true, "fresh")
	writeFile(t, filepath.Join(repo, ".gitignore"), "*.log\n")
	check(false, "untracked .gitignore")
	git(t, repo, "add", ".gitignore")
	check(false, "staged")
	git(t, repo, "commit", "--quiet", "-m", "ignore")
	writeFile(t, filepath.Join(repo, "build.log"), "x")
	check(true, "ignored file")
	writeFile(t, filepath.Join(repo, "README"), "changed\n")
	check(false, "modified")
	git(t, repo, "checkout", "--quiet", "--", "README")
	if err := os.MkdirAll(filepath.Join(repo, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(repo, "a", "b", "c"), "x")
	check(false, "untracked file in new directory")
}

func TestIsCleanDoesNotRunRepositoryHooksOrFSMonitor(t *testing.T) {
	ctx := context.Background()
	repo, _, _ := newRepo(t)
	marker := filepath.Join(t.TempDir(), "ran")
	script := filepath.Join(t.TempDir(), "evil.sh")
	writeFile(t, script, "#!/bin/sh\ntouch "+marker+"\n")
	if err := os.Chmod(script, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, repo, "config", "core.fsmonitor", script)
	if _, err := gitx.IsClean(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("IsClean ran the repository's core.fsmonitor command")
	}
}

func TestCloneBranchTip(t *testing.T) {
	ctx := context.Background()
	src, _, second := newRepo(t)
	dst := filepath.Join(t.TempDir(), "clone")
	if err := gitx.Clone(ctx, src, dst, "main", ""); err != nil {
		t.Fatal(err)
	}
	if b, _ := gitx.CurrentBranch(ctx, dst); b != "main" {
		t.Fatalf("branch = %q, want main", b)
	}
	if h, _ := gitx.HeadCommit(ctx, dst); h != second {
		t.Fatalf("HEAD = %s, want %s", h, second)
	}
	if clean, err := gitx.IsClean(ctx, dst); err != nil || !clean {
		t.Fatalf("clone not clean: %v, %v", clean, err)
	}
	data, err := os.ReadFile(filepath.Join(dst, "README"))
	if err != nil || string(data) != "two\n" {
		t.Fatalf("README = %q, %v", data, err)
	}
}

func TestCloneNewBranchAtCommit(t *testing.T) {
	ctx := context.Background()
	src, first, _ := newRepo(t)
	dst := filepath.Join(t.TempDir(), "clone")
	if err := gitx.Clone(ctx, src, dst, "agent/task-1", first); err != nil {
		t.Fatal(err)
	}
	if b, _ := gitx.CurrentBranch(ctx, dst); b != "agent/task-1" {
		t.Fatalf("branch = %q", b)
	}
	if h, _ := gitx.HeadCommit(ctx, dst); h != first {
		t.Fatalf("HEAD = %s, want %s", h, first)
	}
}

func TestCloneCommitReachableFromNoBranch(t *testing.T) {
	ctx := context.Background()
	src, _, _ := newRepo(t)
	writeFile(t, filepath.Join(src, "README"), "dangling\n")
	git(t, src, "commit", "--quiet", "-am", "dangling")
	dangling := git(t, src, "rev-parse", "HEAD")
	git(t, src, "reset", "--quiet", "--hard", "HEAD~1")
	git(t, src, "reflog", "expire", "--expire=now", "--all")
	git(t, src, "update-ref", "refs/jailbee/pin", dangling)
	git(t, src, "gc", "--quiet", "--prune=now")
	dst := filepath.Join(t.TempDir(), "clone")
	if err := gitx.Clone(ctx, src, dst, "pinned", dangling); err != nil {
		t.Fatal(err)
	}
	if h, _ := gitx.HeadCommit(ctx, dst); h != dangling {
		t.Fatalf("HEAD = %s, want %s", h, dangling)
	}
}

func TestCloneNeverSharesObjects(t *testing.T) {
	ctx := context.Background()
	src, _, _ := newRepo(t)
	dst := filepath.Join(t.TempDir(), "clone")
	if err := gitx.Clone(ctx, src, dst, "main", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dst, ".git", "objects", "info", "alternates")); err == nil {
		t.Fatal("clone uses alternates into the source")
	}
	objects := 0
	err := filepath.WalkDir(filepath.Join(src, ".git", "objects"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		objects++
		if n := fi.Sys().(*syscall.Stat_t).Nlink; n != 1 {
			t.Errorf("%s has %d links: the clone hardlinked it", path, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if objects == 0 {
		t.Fatal("source has no object files to check")
	}
}

func TestCloneErrors(t *testing.T) {
	ctx := context.Background()
	src, _, _ := newRepo(t)
	cases := map[string]struct {
		branch, commit string
		want           error
	}{
		"missing branch":  {"nope", "", gitx.ErrUnknownRevision},
		"bad branch name": {"a..b", "", gitx.ErrInvalidArgument},
		"option branch":   {"-b", "", gitx.ErrInvalidArgument},
		"short commit":    {"x", "abc123", gitx.ErrInvalidArgument},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "clone")
			err := gitx.Clone(ctx, src, dst, tc.branch, tc.commit)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	missing := strings.Repeat("0", 40)
	if err := gitx.Clone(ctx, src, filepath.Join(t.TempDir(), "c"), "x", missing); err == nil {
		t.Fatal("clone at a missing commit succeeded")
	}
}

func TestFetch(t *testing.T) {
	ctx := context.Background()
	src, first, second := newRepo(t)
	dst, _, _ := newRepo(t)
	got, err := gitx.Fetch(ctx, dst, src, "refs/heads/main", "refs/jailbee/child/main")
	if err != nil || got != second {
		t.Fatalf("Fetch = %q, %v; want %s", got, err, second)
	}
	if r := git(t, dst, "rev-parse", "refs/jailbee/child/main"); r != second {
		t.Fatalf("ref = %s", r)
	}
	// A rewritten source branch replaces the destination ref.
	git(t, src, "reset", "--quiet", "--hard", first)
	got, err = gitx.Fetch(ctx, dst, src, "refs/heads/main", "refs/jailbee/child/main")
	if err != nil || got != first {
		t.Fatalf("after rewrite Fetch = %q, %v; want %s", got, err, first)
	}
	if _, err := gitx.Fetch(ctx, dst, src, "refs/heads/nope", "refs/jailbee/x"); err == nil {
		t.Fatal("fetch of a missing ref succeeded")
	}
	for _, refs := range [][2]string{{"main", "refs/x"}, {"refs/heads/main", "x"}, {"refs/heads/main", "refs/a..b"}, {"-x", "refs/x"}, {"refs/heads/main", "refs/x:refs/y"}} {
		if _, err := gitx.Fetch(ctx, dst, src, refs[0], refs[1]); !errors.Is(err, gitx.ErrInvalidArgument) {
			t.Errorf("Fetch(%q, %q): err = %v, want ErrInvalidArgument", refs[0], refs[1], err)
		}
	}
}

func TestContextCancelled(t *testing.T) {
	repo, _, _ := newRepo(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := gitx.HeadCommit(ctx, repo); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestFetchHead(t *testing.T) {
	ctx := context.Background()
	src, first, _ := newRepo(t)
	git(t, src, "checkout", "--quiet", "-b", "side", first)
	dst, _, _ := newRepo(t)
	got, err := gitx.Fetch(ctx, dst, src, "HEAD", "refs/jailbee/child/HEAD")
	if err != nil || got != first {
		t.Fatalf("Fetch HEAD = %q, %v; want %s", got, err, first)
	}
}

// A sandbox writes its checkout's .git: IsClean on the host must not run
// the filter commands that repository's config names.
func TestIsCleanDoesNotRunRepositoryFilters(t *testing.T) {
	ctx := context.Background()
	repo, _, _ := newRepo(t)
	marker := filepath.Join(t.TempDir(), "ran")
	git(t, repo, "config", "filter.evil.clean", "touch "+marker+"; cat")
	git(t, repo, "config", "filter.evil.process", "touch "+marker)
	git(t, repo, "config", "filter.evil.required", "true")
	writeFile(t, filepath.Join(repo, ".git", "info", "attributes"), "* filter=evil\n")
	// Same size, other content, old mtime: git must read the file, which
	// runs the clean filter unless it is switched off.
	writeFile(t, filepath.Join(repo, "README"), "tw0\n")
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(repo, "README"), old, old); err != nil {
		t.Fatal(err)
	}
	clean, err := gitx.IsClean(ctx, repo)
	if err != nil || clean {
		t.Fatalf("IsClean = %v, %v; want dirty", clean, err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("IsClean ran the repository's filter command")
	}
}

func TestFetchRefusesExtRedirect(t *testing.T) {
	ctx := context.Background()
	src, _, _ := newRepo(t)
	dst, _, _ := newRepo(t)
	marker := filepath.Join(t.TempDir(), "ran")
	git(t, dst, "config", "url.ext::sh -c touch% "+marker+".insteadOf", src)
	if _, err := gitx.Fetch(ctx, dst, src, "refs/heads/main", "refs/jailbee/x"); err == nil {
		t.Fatal("fetch through an ext:: redirect succeeded")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a url.insteadOf redirect ran an ext:: command")
	}
}
