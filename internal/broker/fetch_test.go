package broker_test

// The admin fetch op: a sandbox's branch into the user's repository.

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"agentbox/internal/wire"
)

// TestFetchSandbox: `jailbee fetch` puts the sandbox's branch at
// refs/jailbee/sandboxes/NAME/BRANCH of the user's repository, moves
// nothing else there, prints the full commit, and counts as an import:
// the destroy that refused for unimported commits (naming the command)
// then succeeds. A hostile sandbox config changes none of it.
func TestFetchSandbox(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("lead")
	hostRefs := hostGit(t, e.repo, "for-each-ref")
	// Its own upload-pack settings and a hook are the sandbox's business:
	// the host fetches only the ref it asked for.
	e.mustExec("lead", "sh", "-c", "git config uploadpack.allowAnySHA1InWant true && git config uploadpack.hideRefs refs/nothing && "+
		"git tag v1 && echo w > w.txt && git add w.txt && "+commitCmd+" -m work && git checkout -q -b other && "+commitCmd+" --allow-empty -m other && git checkout -q -")
	head := e.mustExec("lead", "git", "rev-parse", "HEAD")
	other := e.mustExec("lead", "git", "rev-parse", "other")
	start := e.row("lead").Imported

	err := e.admin("destroy", wire.DestroyArgs{Name: "lead"}, nil)
	wantWireError(t, "destroy before the fetch", err, wire.CodeBadRequest,
		"`lead` has commits that were never imported (HEAD "+head[:12]+", last imported "+start[:12]+"): import them, or fetch them into the host repository with 'jailbee fetch lead', or use --force")

	// Another branch first: fetched, but HEAD's work is still unimported.
	var res wire.FetchResult
	if err := e.admin("fetch", wire.FetchArgs{Name: "lead", Branch: "other"}, &res); err != nil {
		t.Fatal(err)
	}
	if res != (wire.FetchResult{Ref: "refs/jailbee/sandboxes/lead/other", SHA: other}) {
		t.Fatalf("fetch of other: %+v, want its ref at %s", res, other)
	}
	if e.row("lead").Imported != start {
		t.Fatal("a fetch of a branch HEAD is not on moved the import point")
	}

	if err := e.admin("fetch", wire.FetchArgs{Name: "lead"}, &res); err != nil {
		t.Fatal(err)
	}
	if res != (wire.FetchResult{Ref: "refs/jailbee/sandboxes/lead/main", SHA: head}) {
		t.Fatalf("fetch: %+v, want refs/jailbee/sandboxes/lead/main at %s", res, head)
	}
	want := hostRefs + "\n" + head + " commit\trefs/jailbee/sandboxes/lead/main\n" + other + " commit\trefs/jailbee/sandboxes/lead/other"
	if got := hostGit(t, e.repo, "for-each-ref"); got != want {
		t.Fatalf("host refs after the fetch:\n%s\nwant:\n%s", got, want)
	}
	if got := hostGit(t, e.repo, "show", res.SHA+":w.txt"); got != "w" {
		t.Fatalf("fetched tree: w.txt = %q", got)
	}
	if got := e.mustExec("lead", "git", "for-each-ref", "refs/namespaces"); got != "" {
		t.Fatalf("the transfer's ref stayed in the sandbox: %s", got)
	}
	if err := e.admin("destroy", wire.DestroyArgs{Name: "lead"}, nil); err != nil {
		t.Fatalf("destroy after the fetch: %v", err)
	}
}

// TestFetchSandboxRefusals: an unknown sandbox, a branch the sandbox does
// not have and a directory that is no repository are refused with what
// the user needs; a stopped sandbox is fetched from and stays stopped.
func TestFetchSandboxRefusals(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("lead")
	err := e.admin("fetch", wire.FetchArgs{Name: "nope"}, nil)
	wantWireError(t, "unknown sandbox", err, wire.CodeNotFound, "no sandbox named nope")
	err = e.admin("fetch", wire.FetchArgs{Name: "lead", Branch: "missing"}, nil)
	wantWireError(t, "missing branch", err, wire.CodeBadRequest, "`lead` has no branch missing")
	plain := t.TempDir()
	err = e.admin("fetch", wire.FetchArgs{Name: "lead", Repo: plain}, nil)
	wantWireError(t, "not a repository", err, wire.CodeBadRequest, "not a git repository: "+plain)

	// Into another repository, from a stopped sandbox.
	other := makeRepo(t)
	head := e.mustExec("lead", "git", "rev-parse", "HEAD")
	if err := e.admin("stop", wire.NameArgs{Name: "lead"}, nil); err != nil {
		t.Fatal(err)
	}
	var res wire.FetchResult
	if err := e.admin("fetch", wire.FetchArgs{Name: "lead", Repo: other}, &res); err != nil {
		t.Fatal(err)
	}
	if got := hostGit(t, other, "rev-parse", "refs/jailbee/sandboxes/lead/main"); got != head || res.SHA != head {
		t.Fatalf("fetched %s (reported %s), want %s", got, res.SHA, head)
	}
	if e.info("lead").Running {
		t.Fatal("the stopped sandbox runs after the fetch")
	}
}

// TestFetchSandboxAsRepoOwner: a root broker writes in the user's
// repository (a fetch; a fill's transfer ref) as its owner, so what git
// writes there stays the user's.
func TestFetchSandboxAsRepoOwner(t *testing.T) {
	localOnly(t, "the broker's uid")
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	e := newTestEnv(t)
	e.orchestrator("lead")
	e.mustExec("lead", "sh", "-c", "echo w > w.txt && git add w.txt && "+commitCmd+" -m work")
	const owner = 4321
	for dir := e.repo; dir != "/"; dir = filepath.Dir(dir) {
		os.Chmod(dir, 0o755) // the temp dirs above it: reachable by the owner
		if strings.Count(dir, "/") <= 2 {
			break
		}
	}
	if err := filepath.Walk(e.repo, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, owner, owner)
	}); err != nil {
		t.Fatal(err)
	}
	e.child("kid", "lead") // filled from the repository: its transfer ref comes and goes
	if err := e.admin("fetch", wire.FetchArgs{Name: "lead"}, nil); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(filepath.Join(e.repo, ".git", "refs", "namespaces")); len(left) > 0 {
		t.Errorf("a transfer's ref stayed in the repository: %s", left[0].Name())
	}
	filepath.Walk(filepath.Join(e.repo, ".git"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Sys().(*syscall.Stat_t).Uid != owner {
			t.Errorf("%s is not the repository owner's", strings.TrimPrefix(p, e.repo))
		}
		return nil
	})
}
