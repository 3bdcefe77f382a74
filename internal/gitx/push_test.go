package gitx_test

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/forge/githubtest"
	"agentbox/internal/gitx"
	"agentbox/internal/testutil/wait"
)

const pushToken = "ghp_pushTOKEN0123456789abcdefghijklmnop"

// importedRef is where the tests keep a child's commit in the user's
// repository, as an import does.
const importedRef = "refs/jailbee/sandboxes/child/feature"

// newRemote makes a bare repository OWNER/NAME.git under root with
// branch feature at commit (fetched from repo) and returns its path.
func newRemote(t *testing.T, root, repo, commit string) string {
	t.Helper()
	bare := filepath.Join(root, "acme", "widget.git")
	git(t, "", "init", "--quiet", "--bare", bare)
	git(t, repo, "push", "--quiet", bare, commit+":refs/heads/feature")
	return bare
}

func TestPushBranchFastForward(t *testing.T) {
	repo, first, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, second)
	root := t.TempDir()
	bare := newRemote(t, root, repo, first)
	srv := githubtest.StartGit(t, pushToken, root)

	err := gitx.HostRepo(repo).PushBranch(t.Context(), srv.URL+"/acme/widget.git", importedRef, "feature", gitx.PushAuth{Token: pushToken})
	if err != nil {
		t.Fatal(err)
	}
	if got := git(t, bare, "rev-parse", "refs/heads/feature"); got != second {
		t.Fatalf("remote feature = %s, want %s", got, second)
	}
	// A new branch, over a file URL with no token.
	err = gitx.HostRepo(repo).PushBranch(t.Context(), "file://"+bare, importedRef, "topic/new", gitx.PushAuth{})
	if err != nil {
		t.Fatal(err)
	}
	if got := git(t, bare, "rev-parse", "refs/heads/topic/new"); got != second {
		t.Fatalf("remote topic/new = %s, want %s", got, second)
	}
	// Pushing what is already there is not an error.
	if err := gitx.HostRepo(repo).PushBranch(t.Context(), "file://"+bare, importedRef, "feature", gitx.PushAuth{}); err != nil {
		t.Fatalf("up-to-date push: %v", err)
	}
}

func TestPushBranchNeverForces(t *testing.T) {
	repo, first, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, first)
	root := t.TempDir()
	bare := newRemote(t, root, repo, second) // the remote is ahead: pushing first would rewind it

	// And a remote commit the repository does not have ("fetch first").
	other := t.TempDir()
	git(t, "", "clone", "--quiet", bare, other)
	git(t, other, "checkout", "--quiet", "feature")
	writeFile(t, filepath.Join(other, "README"), "elsewhere\n")
	git(t, other, "commit", "--quiet", "-am", "elsewhere")
	elsewhere := git(t, other, "rev-parse", "HEAD")
	git(t, other, "push", "--quiet", "origin", "feature:unknown")

	for _, branch := range []string{"feature", "unknown"} {
		before := git(t, bare, "rev-parse", "refs/heads/"+branch)
		err := gitx.HostRepo(repo).PushBranch(t.Context(), "file://"+bare, importedRef, branch, gitx.PushAuth{})
		if !errors.Is(err, gitx.ErrNotFastForward) {
			t.Fatalf("push over %s: %v, want ErrNotFastForward", branch, err)
		}
		if got := git(t, bare, "rev-parse", "refs/heads/"+branch); got != before {
			t.Fatalf("remote %s moved to %s", branch, got)
		}
	}
	if git(t, bare, "rev-parse", "refs/heads/unknown") != elsewhere {
		t.Fatal("the remote's own commit is gone")
	}
}

func TestPushBranchRemoteRefusal(t *testing.T) {
	repo, first, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, second)
	bare := newRemote(t, t.TempDir(), repo, first)
	hook := filepath.Join(bare, "hooks", "pre-receive")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\necho protected branch >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := gitx.HostRepo(repo).PushBranch(t.Context(), "file://"+bare, importedRef, "feature", gitx.PushAuth{})
	if !errors.Is(err, gitx.ErrPushRefused) {
		t.Fatalf("push to a refusing remote: %v, want ErrPushRefused", err)
	}
	if got := git(t, bare, "rev-parse", "refs/heads/feature"); got != first {
		t.Fatalf("remote feature moved to %s", got)
	}
}

// TestPushBranchTokenOnlyInEnvironment runs git through a wrapper that
// logs every command line: the token reaches the server (which refuses
// anyone else) but no git argv, and a wrong token's error does not echo it.
func TestPushBranchTokenOnlyInEnvironment(t *testing.T) {
	repo, first, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, second)
	root := t.TempDir()
	bare := newRemote(t, root, repo, first)
	srv := githubtest.StartGit(t, pushToken, root)
	argvLog := wrapGit(t)

	// The user's own hooks do not run either.
	hookRan := filepath.Join(t.TempDir(), "hook-ran")
	if err := os.WriteFile(filepath.Join(repo, ".git", "hooks", "pre-push"), []byte("#!/bin/sh\ntouch "+hookRan+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	url := srv.URL + "/acme/widget.git"
	wrong := "ghp_wrongTOKEN0123456789abcdefghijklmn"
	err := gitx.HostRepo(repo).PushBranch(t.Context(), url, importedRef, "feature", gitx.PushAuth{Token: wrong})
	if err == nil {
		t.Fatal("a push with the wrong token succeeded")
	}
	// The server's refusal quotes the credentials; git shows it.
	if !strings.Contains(err.Error(), "Permission denied to Basic [redacted]") {
		t.Fatalf("err = %v, want the server's refusal with the credentials removed", err)
	}
	if strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), basic(wrong)) {
		t.Fatalf("the error echoes the token: %v", err)
	}
	if err := gitx.HostRepo(repo).PushBranch(t.Context(), url, importedRef, "feature", gitx.PushAuth{Token: pushToken}); err != nil {
		t.Fatal(err)
	}
	if got := git(t, bare, "rev-parse", "refs/heads/feature"); got != second {
		t.Fatalf("remote feature = %s, want %s", got, second)
	}
	log, err := os.ReadFile(argvLog)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "push") {
		t.Fatalf("the wrapper saw no push: %q", log)
	}
	for _, secret := range []string{pushToken, wrong, basic(pushToken), basic(wrong)} {
		if strings.Contains(string(log), secret) {
			t.Fatalf("a git command line holds the token: %q", log)
		}
	}
	if _, err := os.Stat(hookRan); err == nil {
		t.Fatal("the repository's pre-push hook ran")
	}
}

func basic(token string) string {
	return base64.StdEncoding.EncodeToString([]byte("x-access-token:" + token))
}

// wrapGit puts a git first on PATH that logs each command line to the
// returned file and runs the real git.
func wrapGit(t *testing.T) string {
	t.Helper()
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	log := filepath.Join(dir, "argv.log")
	script := "#!/bin/sh\nprintf '%s ' \"$@\" >> " + log + "\necho >> " + log + "\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "git"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return log
}

func TestPushBranchRefusesArguments(t *testing.T) {
	repo, _, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, second)
	bare := "file://" + newRemote(t, t.TempDir(), repo, second)
	host := gitx.HostRepo(repo)
	for _, c := range []struct{ name, url, ref, branch string }{
		{"credentials in the URL", "https://x-access-token:secret@github.com/acme/widget.git", importedRef, "feature"},
		{"ssh URL", "ssh://git@github.com/acme/widget.git", importedRef, "feature"},
		{"scp-like URL", "git@github.com:acme/widget.git", importedRef, "feature"},
		{"ext URL", "ext::sh -c touch% /tmp/pwned", importedRef, "feature"},
		{"option-like URL", "--upload-pack=touch /tmp/pwned", importedRef, "feature"},
		{"query", "https://github.com/acme/widget.git?x=1", importedRef, "feature"},
		{"short ref", bare, "feature", "feature"},
		{"option-like ref", bare, "--force", "feature"},
		{"bad branch", bare, importedRef, "a..b"},
		{"option-like branch", bare, importedRef, "-f"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := host.PushBranch(t.Context(), c.url, c.ref, c.branch, gitx.PushAuth{})
			if !errors.Is(err, gitx.ErrInvalidArgument) {
				t.Fatalf("PushBranch(%q, %q, %q) = %v, want ErrInvalidArgument", c.url, c.ref, c.branch, err)
			}
		})
	}
	sandbox := gitx.SandboxRepo("child", gitx.RunnerFunc(nil), "/work")
	if err := sandbox.PushBranch(t.Context(), bare, importedRef, "feature", gitx.PushAuth{}); !errors.Is(err, gitx.ErrInvalidArgument) {
		t.Fatalf("PushBranch from a sandbox's repository = %v, want ErrInvalidArgument", err)
	}
}

// TestPushBranchTokenStaysWithItsRemote: should the repository's config
// rewrite the forge's URL to another server, the token is not sent there.
func TestPushBranchTokenStaysWithItsRemote(t *testing.T) {
	repo, first, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, second)
	forgeRoot, otherRoot := t.TempDir(), t.TempDir()
	newRemote(t, forgeRoot, repo, first)
	newRemote(t, otherRoot, repo, first)
	forgeSrv := githubtest.StartGit(t, pushToken, forgeRoot)
	other := githubtest.StartGit(t, pushToken, otherRoot)
	git(t, repo, "config", "url."+other.URL+"/.insteadOf", forgeSrv.URL+"/")

	err := gitx.HostRepo(repo).PushBranch(t.Context(), forgeSrv.URL+"/acme/widget.git", importedRef, "feature", gitx.PushAuth{Token: pushToken})
	if err == nil {
		t.Fatal("the push went through to the other server")
	}
	calls := other.Calls()
	if len(calls) == 0 {
		t.Fatal("the rewrite did not happen: the test proves nothing")
	}
	for _, c := range calls {
		if c.Authorized {
			t.Fatalf("the token reached the other server: %+v", c)
		}
	}
}

// TestPushBranchFromLease: a leased push moves the remote branch only from
// where the caller expects it (absent, or a commit), over http with the
// token too; a branch already at the commit is no change.
func TestPushBranchFromLease(t *testing.T) {
	repo, first, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, second)
	root := t.TempDir()
	bare := newRemote(t, root, repo, first) // feature at first
	srv := githubtest.StartGit(t, pushToken, root)
	url := srv.URL + "/acme/widget.git"
	host := gitx.HostRepo(repo)
	auth := gitx.PushAuth{Token: pushToken}

	// feature exists: a push that expects no branch, or another commit,
	// changes nothing.
	for _, from := range []string{"", second} {
		if _, err := host.PushBranchFrom(t.Context(), url, importedRef, "feature", from, auth); !errors.Is(err, gitx.ErrBranchMoved) {
			t.Fatalf("push over feature expecting %q: %v, want ErrBranchMoved", from, err)
		}
	}
	if got := git(t, bare, "rev-parse", "refs/heads/feature"); got != first {
		t.Fatalf("remote feature moved to %s", got)
	}
	// A lease that is not an ancestor of the commit would rewind it.
	git(t, repo, "update-ref", "refs/jailbee/old", first)
	if _, err := host.PushBranchFrom(t.Context(), url, "refs/jailbee/old", "feature", second, auth); !errors.Is(err, gitx.ErrNotFastForward) {
		t.Fatalf("push rewinding the lease: %v, want ErrNotFastForward", err)
	}
	// From where it is: a fast-forward.
	moved, err := host.PushBranchFrom(t.Context(), url, importedRef, "feature", first, auth)
	if err != nil || !moved {
		t.Fatalf("leased fast-forward: moved %v, %v", moved, err)
	}
	if got := git(t, bare, "rev-parse", "refs/heads/feature"); got != second {
		t.Fatalf("remote feature = %s, want %s", got, second)
	}
	// Already there: success, nothing moved, whatever the lease.
	if moved, err := host.PushBranchFrom(t.Context(), url, importedRef, "feature", "", auth); err != nil || moved {
		t.Fatalf("up-to-date leased push: moved %v, %v", moved, err)
	}
	// A new branch, expecting none.
	if moved, err := host.PushBranchFrom(t.Context(), "file://"+bare, importedRef, "topic/new", "", gitx.PushAuth{}); err != nil || !moved {
		t.Fatalf("new branch: moved %v, %v", moved, err)
	}
	if got := git(t, bare, "rev-parse", "refs/heads/topic/new"); got != second {
		t.Fatalf("remote topic/new = %s, want %s", got, second)
	}
	if err := host.SetRef(t.Context(), "refs/jailbee/pushed/x", second); err != nil || git(t, repo, "rev-parse", "refs/jailbee/pushed/x") != second {
		t.Fatalf("SetRef: %v", err)
	}
}

// TestPushBranchFollowsNoRedirect: a forge remote answering with a
// redirect to another server (301, 302, 307, 308) fails the push; git
// never asks the other server anything, so the token, which travels with
// every request to the forge, cannot be carried there.
func TestPushBranchFollowsNoRedirect(t *testing.T) {
	repo, first, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, second)
	otherRoot := t.TempDir()
	newRemote(t, otherRoot, repo, first)
	other := githubtest.StartGit(t, pushToken, otherRoot)
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.RequestURI(), code)
		}))
		err := gitx.HostRepo(repo).PushBranch(t.Context(), front.URL+"/acme/widget.git", importedRef, "feature", gitx.PushAuth{Token: pushToken})
		front.Close()
		if err == nil {
			t.Fatalf("%d: the push went through", code)
		}
		if strings.Contains(err.Error(), pushToken) {
			t.Fatalf("%d: the error carries the token: %v", code, err)
		}
		if calls := other.Calls(); len(calls) != 0 {
			t.Fatalf("%d: the redirect was followed: %+v", code, calls)
		}
	}
	if got := git(t, "", "--git-dir", filepath.Join(otherRoot, "acme", "widget.git"), "rev-parse", "refs/heads/feature"); got != first {
		t.Fatalf("the other server's branch moved to %s", got)
	}
}

// TestPushBranchEndsWholeOnCancel: a push whose forge stops answering
// (here: after the ref advertisement, the pack's POST is never answered)
// ends, with every process it started, when its context does. Killing
// git push alone left its git-remote-http waiting on the forge and
// holding git's stderr, so the push never returned and the publish
// waiting on it held its orchestrator's one publish for good.
func TestPushBranchEndsWholeOnCancel(t *testing.T) {
	repo, first, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, second)
	root := t.TempDir()
	newRemote(t, root, repo, first)
	real := githubtest.StartGit(t, pushToken, root)
	posted := make(chan struct{}, 1)
	release := make(chan struct{})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			posted <- struct{}{}
			<-release
			return
		}
		req, _ := http.NewRequest(r.Method, real.URL+r.URL.RequestURI(), nil)
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	defer front.Close()
	defer close(release)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- gitx.HostRepo(repo).PushBranch(ctx, front.URL+"/acme/widget.git", importedRef, "feature", gitx.PushAuth{Token: pushToken})
	}()
	select {
	case <-posted:
	case err := <-done:
		t.Fatalf("the push ended before its pack was sent: %v", err)
	case <-time.After(wait.Guard):
		t.Fatal("the push never sent its pack")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled push: %v", err)
		}
	case <-time.After(wait.Guard):
		t.Fatal("the cancelled push did not return")
	}
}

// TestPushBranchRemoteFailureIsUncertain: a remote that applies the
// update and then dies (here in its post-receive hook, which kills
// receive-pack) may have moved the branch: the push's error must not be
// one of the certain refusals, which publish records as failed with
// nothing changed.
func TestPushBranchRemoteFailureIsUncertain(t *testing.T) {
	repo, first, second := newRepo(t)
	git(t, repo, "update-ref", importedRef, second)
	root := t.TempDir()
	bare := newRemote(t, root, repo, first)
	// post-receive runs once the refs are updated; its parent is
	// receive-pack, which has not reported yet.
	writeFile(t, filepath.Join(bare, "hooks", "post-receive"), "#!/bin/sh\nkill -9 $PPID\n")
	if err := os.Chmod(filepath.Join(bare, "hooks", "post-receive"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := gitx.HostRepo(repo).PushBranch(t.Context(), "file://"+bare, importedRef, "feature", gitx.PushAuth{})
	if err == nil {
		t.Fatal("the push reported success")
	}
	for _, certain := range []error{gitx.ErrNotFastForward, gitx.ErrPushRefused, gitx.ErrBranchMoved} {
		if errors.Is(err, certain) {
			t.Fatalf("a remote that died before it reported: %v, a certain refusal", err)
		}
	}
	if got := git(t, bare, "rev-parse", "refs/heads/feature"); got != second {
		t.Fatalf("the remote's branch is at %s: the test's remote did not apply the push", got)
	}
}
