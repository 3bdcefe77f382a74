package gitx_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"agentbox/internal/gitx"
)

// prRemote makes a bare repository holding the history of repo with
// commit at refs/pull/pr/head, as a forge keeps a pull request, and
// returns its file URL.
func prRemote(t *testing.T, repo string, pr int, commit string) string {
	t.Helper()
	remote := filepath.Join(t.TempDir(), "remote.git")
	git(t, "", "clone", "--quiet", "--bare", repo, remote)
	git(t, repo, "push", "--quiet", remote, fmt.Sprintf("%s:refs/pull/%d/head", commit, pr))
	return "file://" + remote
}

// hashObject writes data as an object of kind to repo without git's
// checks of its content (what a hostile author's git could send) and
// returns its id.
func hashObject(t *testing.T, repo, kind string, data []byte) string {
	t.Helper()
	cmd := exec.Command("git", "hash-object", "-t", kind, "-w", "--literally", "--stdin")
	cmd.Dir, cmd.Stdin = repo, strings.NewReader(string(data))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hash-object: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func TestFetchPR(t *testing.T) {
	ctx := context.Background()
	repo, first, second := newRepo(t)
	remote := prRemote(t, repo, 7, second)
	git(t, repo, "reset", "--quiet", "--hard", first) // the pull request's commit is only on the remote now
	got, err := gitx.FetchPR(ctx, repo, remote, 7)
	if err != nil || got != second {
		t.Fatalf("FetchPR = %q, %v; want %s", got, err, second)
	}
	if at := git(t, repo, "rev-parse", gitx.PRRefPrefix+"7"); at != second {
		t.Fatalf("%s7 = %s, want %s", gitx.PRRefPrefix, at, second)
	}
	if _, err := gitx.FetchPR(ctx, repo, remote, 8); err == nil {
		t.Fatal("FetchPR of a pull request the remote does not have succeeded")
	}
}

// TestFetchPRChecksObjects: a pull request's objects are its author's. A
// tree with an entry named .git (checked out, it would be the checkout's
// repository) is refused as git refuses it from any untrusted remote,
// and no ref is written.
func TestFetchPRChecksObjects(t *testing.T) {
	ctx := context.Background()
	repo, first, _ := newRepo(t)
	blob := git(t, repo, "rev-parse", first+":README")
	raw := func(hexID string) string {
		var b []byte
		fmt.Sscanf(hexID, "%x", &b)
		return string(b)
	}
	remote := prRemote(t, repo, 1, first)
	bare := strings.TrimPrefix(remote, "file://")
	// The author's objects, in the remote only.
	tree := hashObject(t, bare, "tree", []byte("100644 .git\x00"+raw(blob)))
	commit := hashObject(t, bare, "commit", []byte(fmt.Sprintf("tree %s\nparent %s\nauthor A <a@e> 1 +0000\ncommitter A <a@e> 1 +0000\n\nhostile\n", tree, first)))
	git(t, bare, "update-ref", "refs/pull/3/head", commit)
	if _, err := gitx.FetchPR(ctx, repo, remote, 3); err == nil {
		t.Fatal("FetchPR took a tree with a .git entry")
	}
	if out, err := exec.Command("git", "-C", repo, "rev-parse", "--verify", "--quiet", gitx.PRRefPrefix+"3").Output(); err == nil {
		t.Fatalf("the refused pull request's ref was written: %s", out)
	}
}

// TestFetchPRAsRepoOwner: a root broker fetches a pull request into the
// user's repository as its owner, so every file git writes there stays
// the user's (a root-owned pack or ref directory would be one the user's
// own git cannot change).
func TestFetchPRAsRepoOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	const owner = 4321
	repo, first, second := newRepo(t)
	remote := prRemote(t, repo, 5, second)
	git(t, repo, "reset", "--quiet", "--hard", first)
	git(t, repo, "gc", "--quiet", "--prune=now") // the pull request's objects are only on the remote
	for dir := filepath.Dir(repo); dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		os.Chmod(dir, 0o755) // the temp dirs above it: reachable by the owner
	}
	remoteDir := strings.TrimPrefix(remote, "file://")
	os.Chmod(filepath.Dir(remoteDir), 0o755)
	for _, dir := range []string{repo, remoteDir} { // the remote too: git serves none another user owns
		if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, owner, owner)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := gitx.FetchPR(context.Background(), repo, remote, 5); err != nil || got != second {
		t.Fatalf("FetchPR = %q, %v; want %s", got, err, second)
	}
	filepath.Walk(filepath.Join(repo, ".git"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Sys().(*syscall.Stat_t).Uid != owner {
			t.Errorf("%s is not the repository owner's", strings.TrimPrefix(p, repo))
		}
		return nil
	})
}
