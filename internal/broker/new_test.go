package broker_test

// The admin new op: what it makes, what it refuses, and that a refused
// or failed create leaves nothing behind.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/config"
	"agentbox/internal/grant"
	"agentbox/internal/wire"
)

// footprint is everything a sandbox leaves on the broker's side: broker.db
// rows, backend instances, socket dirs, host uids given out, and the
// number of sandboxes the backend created.
type footprint struct {
	rows, insts, sockDirs []string
	uids                  []int
	created               int
}

func (e *testEnv) footprint() footprint {
	e.t.Helper()
	var f footprint
	sbs, err := e.b.Store().Sandboxes(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, sb := range sbs {
		f.rows = append(f.rows, sb.Name+"/"+sb.State)
	}
	insts, err := e.be.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, in := range insts {
		f.insts = append(f.insts, in.Name+"/"+in.UUID)
	}
	entries, err := os.ReadDir(filepath.Join(e.state, broker.SockDir))
	if err != nil {
		e.t.Fatal(err)
	}
	for _, d := range entries {
		f.sockDirs = append(f.sockDirs, d.Name())
	}
	f.uids = claimedHostUIDs(e.t, e.state)
	f.created = len(e.be.created())
	return f
}

// assertNothingLeft checks that what happened since before added no
// sandbox: no row, no backend instance, no socket dir; and that every
// sandbox the backend created meanwhile is gone with its cgroups, and no
// process runs as a host uid given out meanwhile.
func (e *testEnv) assertNothingLeft(what string, before footprint) {
	e.t.Helper()
	after := e.footprint()
	if !slices.Equal(after.rows, before.rows) {
		e.t.Errorf("%s: broker.db rows %v, before %v", what, after.rows, before.rows)
	}
	if !slices.Equal(after.insts, before.insts) {
		e.t.Errorf("%s: backend sandboxes %v, before %v", what, after.insts, before.insts)
	}
	if !slices.Equal(after.sockDirs, before.sockDirs) {
		e.t.Errorf("%s: socket dirs %v, before %v", what, after.sockDirs, before.sockDirs)
	}
	for _, uuid := range e.be.created()[before.created:] {
		for _, dir := range cgroupDirs(e.t, uuid) {
			if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
				e.t.Errorf("%s: cgroup %s is left (%v)", what, dir, err)
			}
		}
	}
	for _, uid := range after.uids {
		if slices.Contains(before.uids, uid) {
			continue
		}
		if ps := processesOf(uid, ""); len(ps) > 0 {
			e.t.Errorf("%s: processes of host uid %d are left: %v", what, uid, ps)
		}
	}
}

func TestAdminNewRefusals(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	plain := t.TempDir()
	missing := filepath.Join(plain, "missing")
	detached := makeRepo(t)
	hostGit(t, detached, "checkout", "-q", "--detach")
	empty := filepath.Join(t.TempDir(), "empty")
	hostGit(t, "", "init", "-q", "-b", "main", empty)

	for _, tc := range []struct {
		name   string
		args   wire.NewArgs
		code   wire.Code
		detail string
	}{
		{"parent missing", wire.NewArgs{Name: "c1", Role: "child", Parent: "nope"},
			wire.CodeNotFound, "no sandbox named nope"},
		{"parent is a child", wire.NewArgs{Name: "c1", Role: "child", Parent: "kid"},
			wire.CodeBadRequest, "`kid` is not an orchestrator"},
		{"no such directory", wire.NewArgs{Name: "o1", Role: "orchestrator", Repo: missing},
			wire.CodeBadRequest, "no such directory: " + missing},
		{"not a repository", wire.NewArgs{Name: "o1", Role: "orchestrator", Repo: plain},
			wire.CodeBadRequest, "not a git repository: " + plain},
		{"child in no repository", wire.NewArgs{Name: "c1", Role: "child", Parent: "orch", Repo: plain},
			wire.CodeBadRequest, "not a git repository: " + plain},
		{"relative repository", wire.NewArgs{Name: "o1", Role: "orchestrator", Repo: "repo"},
			wire.CodeBadRequest, "the repository must be an absolute path"},
		{"invalid branch", wire.NewArgs{Name: "c1", Role: "child", Parent: "orch", Branch: "bad..name"},
			wire.CodeBadRequest, `invalid branch name: "bad..name"`},
		{"branch like an option", wire.NewArgs{Name: "o1", Role: "orchestrator", Repo: e.repo, Branch: "-f"},
			wire.CodeBadRequest, `invalid branch name: "-f"`},
		{"second child on a branch", wire.NewArgs{Name: "c1", Role: "child", Parent: "orch", Branch: "work/kid"},
			wire.CodeBadRequest, "`orch` already has a child on branch work/kid: `kid`"},
		{"name of an orchestrator", wire.NewArgs{Name: "orch", Role: "orchestrator", Repo: e.repo},
			wire.CodeBadRequest, "sandbox `orch` already exists"},
		{"name of a child", wire.NewArgs{Name: "kid", Role: "child", Parent: "orch", Branch: "other"},
			wire.CodeBadRequest, "sandbox `kid` already exists"},
		{"invalid name", wire.NewArgs{Name: "Bad_Name", Role: "orchestrator", Repo: e.repo},
			wire.CodeBadRequest, fmt.Sprintf(`invalid sandbox name "Bad_Name": use lowercase letters, digits and dashes (at most %d), not starting with a dash`, backend.NameMaxLen)},
		{"no role", wire.NewArgs{Name: "o1", Repo: e.repo},
			wire.CodeBadRequest, "role must be orchestrator or child"},
		{"detached HEAD", wire.NewArgs{Name: "o1", Role: "orchestrator", Repo: detached},
			wire.CodeBadRequest, "the repository's HEAD is detached: name a branch with --branch"},
		{"no commit", wire.NewArgs{Name: "o1", Role: "orchestrator", Repo: empty},
			wire.CodeBadRequest, "the repository has no commit to start from"},
		{"grant on a child", wire.NewArgs{Name: "c1", Role: "child", Parent: "orch", Branch: "x", Grant: json.RawMessage(`{"version":1}`)},
			wire.CodeBadRequest, "a grant is only for an orchestrator"},
		{"invalid grant", wire.NewArgs{Name: "o1", Role: "orchestrator", Repo: e.repo, Grant: json.RawMessage(`{"version":2,"max_running_children":1,"operations":[],"grantable":{"mounts":[],"loose":false,"egress":[]}}`)},
			wire.CodeBadRequest, "invalid grant: grant: version must be 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := e.withT(t)
			before := e.footprint()
			err := e.admin("new", tc.args, nil)
			wantWireError(t, "new", err, tc.code, tc.detail)
			e.assertNothingLeft("refused new", before)
		})
	}
	// Arguments that do not decode.
	before := e.footprint()
	err := e.admin("new", map[string]any{"name": "o1", "role": "orchestrator", "repo": e.repo, "extra": 1}, nil)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeBadRequest || !strings.HasPrefix(we.Detail, "invalid arguments: ") {
		t.Fatalf("new with an unknown argument: %v", err)
	}
	e.assertNothingLeft("new with an unknown argument", before)
	// The detached repository is fine with a branch named.
	if err := e.admin("new", wire.NewArgs{Name: "o1", Role: "orchestrator", Repo: detached, Branch: "main"}, nil); err != nil {
		t.Fatalf("new on a detached repository with --branch: %v", err)
	}
}

func TestAdminNewGrants(t *testing.T) {
	e := newTestEnv(t)
	var res wire.NewResult
	if err := e.admin("new", wire.NewArgs{Name: "orch", Repo: e.repo, Role: "orchestrator"}, &res); err != nil {
		t.Fatal(err)
	}
	info := e.info("orch")
	if res.Name != "orch" || res.UUID != info.UUID || res.Branch != "main" {
		t.Fatalf("new result %+v, ls %+v", res, info)
	}
	// No grant named: the default one, as broker.db holds it and as the
	// orchestrator reads it.
	def, _ := json.Marshal(grant.Default())
	if got := e.row("orch").Grant; got != string(def) {
		t.Fatalf("default grant recorded: %s, want %s", got, def)
	}
	var read json.RawMessage
	if err := e.client("orch").Call(context.Background(), "grant", nil, &read); err != nil {
		t.Fatal(err)
	}
	assertSameJSON(t, "grant op of the default grant", read, def)

	// A grant named is validated and recorded canonically.
	narrow := `{ "operations":["spawn","message"], "version":1, "max_running_children":1, "grantable":{"mounts":[],"loose":false,"egress":[]}}`
	if err := e.admin("new", wire.NewArgs{Name: "narrow", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(narrow)}, nil); err != nil {
		t.Fatal(err)
	}
	g, err := grant.Parse([]byte(narrow))
	if err != nil {
		t.Fatal(err)
	}
	canon, _ := json.Marshal(g)
	if got := e.row("narrow").Grant; got != string(canon) {
		t.Fatalf("grant recorded: %s, want %s", got, canon)
	}
	if err := e.client("narrow").Call(context.Background(), "grant", nil, &read); err != nil {
		t.Fatal(err)
	}
	assertSameJSON(t, "grant op", read, canon)

	// A child gets none, and may not be given one.
	before := e.footprint()
	err = e.admin("new", wire.NewArgs{Name: "kid", Role: "child", Parent: "orch", Grant: json.RawMessage(def)}, nil)
	wantWireError(t, "child with a grant", err, wire.CodeBadRequest, "a grant is only for an orchestrator")
	e.assertNothingLeft("child with a grant", before)
	e.child("kid", "orch")
	if got := e.row("kid").Grant; got != "" {
		t.Fatalf("child's grant: %q", got)
	}
}

func assertSameJSON(t testing.TB, what string, got, want []byte) {
	t.Helper()
	var g, w any
	if json.Unmarshal(got, &g) != nil || json.Unmarshal(want, &w) != nil {
		t.Fatalf("%s: %s, want %s", what, got, want)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Fatalf("%s: %s, want %s", what, got, want)
	}
}

func TestAdminNewBranches(t *testing.T) {
	e := newTestEnv(t)
	mainCommit := hostGit(t, e.repo, "rev-parse", "HEAD")
	// A branch "feature" one commit ahead, checked out on the host.
	hostGit(t, e.repo, "checkout", "-q", "-b", "feature")
	if err := os.WriteFile(filepath.Join(e.repo, "f.txt"), []byte("feature\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostGit(t, e.repo, "add", "f.txt")
	hostGit(t, e.repo, "commit", "-q", "-m", "feature")
	featureCommit := hostGit(t, e.repo, "rev-parse", "HEAD")

	// No branch named: the repository's current branch.
	e.orchestrator("orch")
	assertCheckout(t, e, "orch", "feature", featureCommit)
	// A branch of the repository: that branch at its commit; a new branch
	// starts from the repository's HEAD.
	for _, tc := range []struct{ name, branch, commit string }{
		{"on-main", "main", mainCommit},
		{"on-feature", "feature", featureCommit},
		{"on-new", "work/new", featureCommit},
	} {
		var res wire.NewResult
		if err := e.admin("new", wire.NewArgs{Name: tc.name, Role: "child", Parent: "orch", Branch: tc.branch}, &res); err != nil {
			t.Fatalf("new %s: %v", tc.name, err)
		}
		if res.Branch != tc.branch {
			t.Fatalf("new %s: branch %q", tc.name, res.Branch)
		}
		info := e.info(tc.name)
		if info.Branch != tc.branch || info.Parent == nil || *info.Parent != "orch" || info.Role != "child" || !info.Running || info.Socket == nil {
			t.Fatalf("ls entry of %s: %+v", tc.name, info)
		}
		assertCheckout(t, e, tc.name, tc.branch, tc.commit)
		if got := e.row(tc.name).Imported; got != tc.commit {
			t.Fatalf("%s: last imported %s, want its start commit %s", tc.name, got, tc.commit)
		}
	}
	// A child with no branch named gets the repository's current branch,
	// which orch's child on-feature already has.
	err := e.admin("new", wire.NewArgs{Name: "dflt", Role: "child", Parent: "orch"}, nil)
	wantWireError(t, "second child on the current branch", err, wire.CodeBadRequest, "`orch` already has a child on branch feature: `on-feature`")

	// One child per branch per orchestrator: another orchestrator's child
	// may have it, and once the first child is gone the branch is free.
	e.orchestrator("orch2")
	if err := e.admin("new", wire.NewArgs{Name: "other", Role: "child", Parent: "orch2", Branch: "main"}, nil); err != nil {
		t.Fatalf("child of another orchestrator on main: %v", err)
	}
	err = e.admin("new", wire.NewArgs{Name: "again", Role: "child", Parent: "orch", Branch: "main"}, nil)
	wantWireError(t, "second child of orch on main", err, wire.CodeBadRequest, "`orch` already has a child on branch main: `on-main`")
	if err := e.admin("destroy", wire.DestroyArgs{Name: "on-main"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.admin("new", wire.NewArgs{Name: "again", Role: "child", Parent: "orch", Branch: "main"}, nil); err != nil {
		t.Fatalf("child on main once on-main is gone: %v", err)
	}
}

// assertCheckout checks a sandbox's checkout, with git inside it.
func assertCheckout(t testing.TB, e *testEnv, name, branch, commit string) {
	t.Helper()
	got := e.mustExec(name, "sh", "-c", "git symbolic-ref --short HEAD && git rev-parse HEAD && git status --porcelain --untracked-files=all | wc -l && git for-each-ref --format='%(refname) %(objectname)'")
	want := branch + "\n" + commit + "\n0\nrefs/heads/" + branch + " " + commit + "\nrefs/jailbee/start " + commit
	if got != want {
		t.Fatalf("checkout of %s:\n%s\nwant\n%s", name, got, want)
	}
}

// TestAdminNewFailureUndoesEverything: a create that fails after its unit
// started (the host repository lacks an object the commit needs) is
// undone: unit, cgroups, socket dir and record.
func TestAdminNewFailureUndoesEverything(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	// A repository whose commit resolves but whose tree object is gone.
	broken := makeRepo(t)
	if err := os.WriteFile(filepath.Join(broken, "f.txt"), []byte("content\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostGit(t, broken, "add", "f.txt")
	hostGit(t, broken, "commit", "-q", "-m", "a file")
	tree := hostGit(t, broken, "rev-parse", "HEAD^{tree}")
	if err := os.Remove(filepath.Join(broken, ".git", "objects", tree[:2], tree[2:])); err != nil {
		t.Fatal(err)
	}
	before := e.footprint()
	err := e.admin("new", wire.NewArgs{Name: "broken", Role: "orchestrator", Repo: broken}, nil)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeInternal || !strings.HasPrefix(we.Detail, "new failed: checkout: ") {
		t.Fatalf("new from a broken repository: %v", err)
	}
	if got := len(e.be.created()) - before.created; got != 1 {
		t.Fatalf("the backend created %d sandboxes, want the one undone", got)
	}
	e.assertNothingLeft("failed new", before)
	if !strings.Contains(e.logs.String(), "admin request failed") {
		t.Fatalf("the failure was not logged:\n%s", e.logs)
	}
	// The name is free again.
	if err := e.admin("new", wire.NewArgs{Name: "broken", Role: "orchestrator", Repo: e.repo}, nil); err != nil {
		t.Fatalf("new after the failed one: %v", err)
	}
}

// TestHostUIDNeverGivenTwice: a root broker gives each sandbox a host uid
// of its own, and never one it gave before, even once that sandbox is
// gone and across restarts.
func TestHostUIDNeverGivenTwice(t *testing.T) {
	localOnly(t, "Incus maps a container's uids itself")
	if os.Geteuid() != 0 {
		t.Skip("a broker that is not root runs sandboxes as its own uid")
	}
	e := newTestEnvStopped(t)
	first := spareHostUID(t)
	e.sandboxes.HostUIDs = &config.UIDRange{First: uint32(first), Count: 1}
	e.start()
	e.orchestrator("a")
	if got := e.row("a").HostUID; got != first {
		t.Fatalf("a's host uid %d, want %d, the only one in the range", got, first)
	}
	if ps := processesOf(first, "_sandbox-init"); len(ps) == 0 {
		t.Fatalf("a's supervisor as uid %d: %v", first, ps)
	}
	if n, err := e.destroy("a", false); err != nil || n != 1 {
		t.Fatalf("destroy a: %d, %v", n, err)
	}
	full := fmt.Sprintf("new failed: no free host uid found in 64 tries in %d..%d: widen sandbox_uids in broker.yaml", first, first)
	for _, restart := range []bool{false, true} {
		if restart {
			e.restart()
		}
		before := e.footprint()
		err := e.admin("new", wire.NewArgs{Name: "b", Repo: e.repo, Role: "orchestrator"}, nil)
		wantWireError(t, fmt.Sprintf("new with the range used up (restarted %v)", restart), err, wire.CodeInternal, full)
		e.assertNothingLeft("new with the range used up", before)
	}
	// One more uid in the range: b gets it.
	e.stop()
	e.sandboxes.HostUIDs = &config.UIDRange{First: uint32(first), Count: 2}
	e.start()
	e.orchestrator("b")
	if got := e.row("b").HostUID; got != first+1 {
		t.Fatalf("b's host uid %d, want %d", got, first+1)
	}
	uids := claimedHostUIDs(t, e.state)
	slices.Sort(uids)
	if !slices.Equal(uids, []int{first, first + 1}) {
		t.Fatalf("host uids claimed: %v", uids)
	}
}
