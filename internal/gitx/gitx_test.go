package gitx_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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

func TestContextCancelled(t *testing.T) {
	repo, _, _ := newRepo(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := gitx.HeadCommit(ctx, repo); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestRepoRoot(t *testing.T) {
	ctx := context.Background()
	repo, _, _ := newRepo(t)
	sub := filepath.Join(repo, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{repo, sub} {
		if got, err := gitx.RepoRoot(ctx, p); err != nil || got != repo {
			t.Errorf("RepoRoot(%s) = %q, %v; want %s", p, got, err, repo)
		}
	}
	bare := filepath.Join(t.TempDir(), "bare.git")
	git(t, "", "init", "--quiet", "--bare", bare)
	if got, err := gitx.RepoRoot(ctx, bare); err != nil || got != bare {
		t.Errorf("bare RepoRoot = %q, %v; want %s", got, err, bare)
	}
	if _, err := gitx.RepoRoot(ctx, filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing dir: err = %v, want ErrNotExist", err)
	}
	plain := t.TempDir()
	if _, err := gitx.RepoRoot(ctx, plain); !errors.Is(err, gitx.ErrNotRepository) {
		t.Errorf("plain dir: err = %v, want ErrNotRepository", err)
	}
	file := filepath.Join(plain, "f")
	writeFile(t, file, "x")
	if _, err := gitx.RepoRoot(ctx, file); !errors.Is(err, gitx.ErrNotRepository) {
		t.Errorf("a file: err = %v, want ErrNotRepository", err)
	}
}

// TestHostGitRunsNoRepositoryCommand: the host commands gitx runs on the
// user's repository (branch, commit, root) never run a command the
// repository's config names, even when it names one for everything.
func TestHostGitRunsNoRepositoryCommand(t *testing.T) {
	ctx := context.Background()
	repo, _, _ := newRepo(t)
	marker := filepath.Join(t.TempDir(), "ran")
	cmd := "touch " + marker
	hooks := filepath.Join(repo, ".git", "hooks")
	for _, h := range []string{"post-checkout", "pre-push", "reference-transaction", "fsmonitor-watchman"} {
		writeFile(t, filepath.Join(hooks, h), "#!/bin/sh\n"+cmd+"\n")
		os.Chmod(filepath.Join(hooks, h), 0o755)
	}
	for _, kv := range [][2]string{
		{"core.fsmonitor", cmd}, {"core.hooksPath", hooks}, {"filter.x.clean", cmd}, {"filter.x.smudge", cmd},
		{"filter.x.process", cmd}, {"core.alternateRefsCommand", cmd}, {"uploadpack.packObjectsHook", cmd},
		{"core.sshCommand", cmd}, {"alias.rev-parse", "!" + cmd},
	} {
		git(t, repo, "config", kv[0], kv[1])
	}
	writeFile(t, filepath.Join(repo, ".gitattributes"), "* filter=x\n")
	if _, err := gitx.CurrentBranch(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if _, err := gitx.ResolveCommit(ctx, repo, "HEAD"); err != nil {
		t.Fatal(err)
	}
	if _, err := gitx.RepoRoot(ctx, repo); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a command from the repository's config ran on the host")
	}
}

// TestCheckBranchNameShowsAsItIs: git takes any byte from 0x80 on in a
// ref name, and a sandbox names its own branches (its HEAD at done), which
// the host's refs, logs and output show: invalid UTF-8, C1 controls (a
// lone 0x9b, or U+009B, is a CSI to a terminal) and format characters
// (U+202E reverses what follows, U+200B hides) are refused; other
// Unicode is a branch name as before.
func TestCheckBranchNameShowsAsItIs(t *testing.T) {
	ctx := t.Context()
	for _, b := range []string{"fix/a\x9b2J", "fix/a\u009b2J", "fix/\u009d0;title", "fix/a\u202egnp.exe", "fix/b\u200bc", "fix/\u2066d", "fix/\xff"} {
		if git(t, "", "check-ref-format", "--branch", b) == "" {
			t.Fatalf("git refuses %q itself", b)
		}
		if err := gitx.CheckBranchName(ctx, b); !errors.Is(err, gitx.ErrInvalidArgument) {
			t.Errorf("CheckBranchName(%q) = %v", b, err)
		}
	}
	for _, b := range []string{"fix/ünïcode", "feat/日本語", "main"} {
		if err := gitx.CheckBranchName(ctx, b); err != nil {
			t.Errorf("CheckBranchName(%q) = %v", b, err)
		}
	}
}
