// Package backendtest is the conformance suite every backend.Backend runs:
// what the broker relies on, seen only through the interface, with real
// git repositories and real Unix sockets.
package backendtest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/gitx"
)

// uuidPattern is the form every backend's instance uuid takes (Incus's
// volatile.uuid and the local backend's are both version 4).
var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// Repo is a source repository made for a test.
type Repo struct {
	Path   string // host path
	First  string // first commit on main (README "one")
	Second string // second commit, the tip of main (README "two")
}

// NewRepo makes a git repository on branch main with two commits.
func NewRepo(t testing.TB) Repo {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "src")
	git(t, "", "init", "--quiet", "--initial-branch=main", dir)
	writeFile(t, filepath.Join(dir, "README"), "one\n")
	git(t, dir, "add", "README")
	git(t, dir, "commit", "--quiet", "-m", "one")
	first := git(t, dir, "rev-parse", "HEAD")
	writeFile(t, filepath.Join(dir, "README"), "two\n")
	git(t, dir, "commit", "--quiet", "-am", "two")
	return Repo{Path: dir, First: first, Second: git(t, dir, "rev-parse", "HEAD")}
}

func git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=Test", "-c", "user.email=test@example.com"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Name returns a fresh valid sandbox name ending in label: random, so
// backends whose names are global (Incus) never collide between runs.
func Name(t testing.TB, label string) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := "bt-" + hex.EncodeToString(b[:]) + "-" + label
	if err := backend.ValidateName(name); err != nil {
		t.Fatal(err)
	}
	return name
}

// Create makes a sandbox and destroys it when the test ends.
func Create(t testing.TB, b backend.Backend, name string, src backend.GitSource) backend.Instance {
	t.Helper()
	inst, err := b.Create(t.Context(), backend.CreateOptions{Name: name, Source: src})
	if err != nil {
		t.Fatalf("Create(%s): %v", name, err)
	}
	t.Cleanup(func() {
		if err := b.Destroy(t.Context(), name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("cleanup Destroy(%s): %v", name, err)
		}
	})
	return inst
}

// CreateStarted makes a running sandbox on branch main of repo.
func CreateStarted(t testing.TB, b backend.Backend, label string, repo Repo) string {
	t.Helper()
	name := Name(t, label)
	Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "main"})
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatalf("Start(%s): %v", name, err)
	}
	return name
}

// Result is what one Exec produced.
type Result struct {
	Code   int
	Stdout string
	Stderr string
}

// Exec runs opts in the sandbox, capturing output; an Exec error fails t.
func Exec(t testing.TB, b backend.Backend, name string, opts backend.ExecOptions) Result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	opts.Stdout, opts.Stderr = &stdout, &stderr
	code, err := b.Exec(t.Context(), name, opts)
	if err != nil {
		t.Fatalf("Exec(%s, %q): %v (stderr %q)", name, opts.Argv, err, stderr.String())
	}
	return Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}
}

// Sh runs a shell script as the agent user and fails t unless it exits 0;
// it returns the trimmed stdout.
func Sh(t testing.TB, b backend.Backend, name, script string) string {
	t.Helper()
	r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", script}})
	if r.Code != 0 {
		t.Fatalf("sh -c %q exited %d: %s", script, r.Code, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// SocketDir makes a private directory holding a listening broker.sock
// that writes greeting to every connection, as the broker would serve it.
func SocketDir(t testing.TB, greeting string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bt-sock-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "broker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(greeting))
			c.Close()
		}
	}()
	return dir
}

// Options adapts the suite to a backend's documented differences.
type Options struct {
	// HostUser: commands run as the caller's own host user (the local
	// backend's insecure mode), so the user ids inside are not checked.
	HostUser bool
}

// Run runs the conformance suite. newBackend is called once per subtest
// and must return a backend with no sandboxes of its own making yet.
func Run(t *testing.T, newBackend func(t *testing.T) backend.Backend, opts Options) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b backend.Backend, opts Options)
	}{
		{"Type", testType},
		{"CreateIsStoppedWithUUID", testCreateStopped},
		{"CreateChecksOutBranchTip", testCreateBranchTip},
		{"CreateAtCommitOnNewBranch", testCreateAtCommit},
		{"CreateExistingName", testCreateExisting},
		{"CreateInvalidName", testCreateInvalidName},
		{"CreateBadSourceLeavesNothing", testCreateBadSource},
		{"UUIDsAreUnique", testUUIDsUnique},
		{"ExecWhenStopped", testExecStopped},
		{"StartStopIdempotent", testStartStopIdempotent},
		{"ExecStatusAndStreams", testExecStreams},
		{"ExecUsersAndDir", testExecUsersAndDir},
		{"CheckoutPersistsAcrossStop", testPersistsAcrossStop},
		{"AttachDetachSocket", testAttachDetach},
		{"Destroy", testDestroy},
		{"UnknownSandbox", testUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newBackend(t), opts) })
	}
}

func testType(t *testing.T, b backend.Backend, opts Options) {
	if b.Type() == "" {
		t.Fatal("Type() is empty")
	}
}

func find(t *testing.T, b backend.Backend, name string) (backend.Instance, bool) {
	t.Helper()
	list, err := b.List(t.Context())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, inst := range list {
		if inst.Name == name {
			return inst, true
		}
	}
	return backend.Instance{}, false
}

func testCreateStopped(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := Name(t, "new")
	inst := Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "main"})
	if inst.Name != name || inst.Running || !uuidPattern.MatchString(inst.UUID) {
		t.Fatalf("Create returned %+v; want name %s, stopped, a v4 uuid", inst, name)
	}
	got, ok := find(t, b, name)
	if !ok || got != inst {
		t.Fatalf("List has %+v (found %v), want %+v", got, ok, inst)
	}
}

// remoteCommit fetches ref from the sandbox's git remote into a scratch
// repository and returns the commit it names.
func remoteCommit(t *testing.T, b backend.Backend, name, ref string) string {
	t.Helper()
	remote, err := b.GitRemote(t.Context(), name)
	if err != nil {
		t.Fatalf("GitRemote: %v", err)
	}
	scratch := filepath.Join(t.TempDir(), "scratch")
	git(t, "", "init", "--quiet", scratch)
	sha, err := gitx.Fetch(t.Context(), scratch, remote, ref, "refs/verify/sandbox")
	if err != nil {
		t.Fatalf("fetch %s from sandbox: %v", ref, err)
	}
	return sha
}

func testCreateBranchTip(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := Name(t, "tip")
	Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "main"})
	if got := remoteCommit(t, b, name, "refs/heads/main"); got != repo.Second {
		t.Fatalf("sandbox main = %s, want the source tip %s", got, repo.Second)
	}
	if got := remoteCommit(t, b, name, "HEAD"); got != repo.Second {
		t.Fatalf("sandbox HEAD = %s, want %s", got, repo.Second)
	}
}

func testCreateAtCommit(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := Name(t, "at")
	Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "task-1", Commit: repo.First})
	if got := remoteCommit(t, b, name, "refs/heads/task-1"); got != repo.First {
		t.Fatalf("sandbox task-1 = %s, want %s", got, repo.First)
	}
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if got := Sh(t, b, name, "cat README"); got != "one" {
		t.Fatalf("checkout README = %q, want the first commit's %q", got, "one")
	}
}

func testCreateExisting(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := Name(t, "dup")
	inst := Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "main"})
	_, err := b.Create(t.Context(), backend.CreateOptions{Name: name, Source: backend.GitSource{Repo: repo.Path, Branch: "main"}})
	if !errors.Is(err, backend.ErrExists) {
		t.Fatalf("second Create: err = %v, want ErrExists", err)
	}
	if got, _ := find(t, b, name); got.UUID != inst.UUID {
		t.Fatalf("failed Create changed the sandbox: uuid %s, want %s", got.UUID, inst.UUID)
	}
}

func testCreateInvalidName(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	for _, name := range []string{"", "-x", "Upper", "a/b", "..", strings.Repeat("a", backend.NameMaxLen+1)} {
		_, err := b.Create(t.Context(), backend.CreateOptions{Name: name, Source: backend.GitSource{Repo: repo.Path, Branch: "main"}})
		if !errors.Is(err, backend.ErrInvalidName) {
			t.Errorf("Create(%q): err = %v, want ErrInvalidName", name, err)
		}
	}
}

func testCreateBadSource(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := Name(t, "bad")
	for _, src := range []backend.GitSource{
		{Repo: repo.Path, Branch: "no-such-branch"},
		{Repo: repo.Path, Branch: "x", Commit: strings.Repeat("0", 40)},
		{Repo: filepath.Join(t.TempDir(), "missing"), Branch: "main"},
	} {
		if _, err := b.Create(t.Context(), backend.CreateOptions{Name: name, Source: src}); err == nil {
			b.Destroy(t.Context(), name)
			t.Fatalf("Create from %+v succeeded", src)
		}
		if _, ok := find(t, b, name); ok {
			t.Fatalf("failed Create from %+v left a sandbox", src)
		}
	}
	// The name is free again.
	Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "main"})
}

func testUUIDsUnique(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	seen := map[string]string{}
	for i := range 3 {
		name := Name(t, "u"+strconv.Itoa(i))
		inst := Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "main"})
		if other, dup := seen[inst.UUID]; dup {
			t.Fatalf("%s and %s share uuid %s", name, other, inst.UUID)
		}
		seen[inst.UUID] = name
	}
	list, err := b.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, inst := range list {
		if name, ok := seen[inst.UUID]; ok {
			if inst.Name != name {
				t.Errorf("List: uuid %s on %s, want %s", inst.UUID, inst.Name, name)
			}
			delete(seen, inst.UUID)
		}
	}
	if len(seen) != 0 {
		t.Fatalf("List is missing %v", seen)
	}
}

func testExecStopped(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := Name(t, "stopped")
	Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "main"})
	_, err := b.Exec(t.Context(), name, backend.ExecOptions{Argv: []string{"true"}})
	if !errors.Is(err, backend.ErrNotRunning) {
		t.Fatalf("Exec on a stopped sandbox: err = %v, want ErrNotRunning", err)
	}
}

func testStartStopIdempotent(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := CreateStarted(t, b, "idem", repo)
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatalf("Start of a running sandbox: %v", err)
	}
	if inst, _ := find(t, b, name); !inst.Running {
		t.Fatal("List: started sandbox not running")
	}
	for range 2 {
		if err := b.Stop(t.Context(), name); err != nil {
			t.Fatalf("Stop: %v", err)
		}
	}
	if inst, _ := find(t, b, name); inst.Running {
		t.Fatal("List: stopped sandbox running")
	}
}

func testExecStreams(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := CreateStarted(t, b, "streams", repo)
	r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 7"}})
	if r.Code != 7 || r.Stdout != "out\n" || r.Stderr != "err\n" {
		t.Fatalf("got %+v; want exit 7, stdout out, stderr err", r)
	}
	r = Exec(t, b, name, backend.ExecOptions{Argv: []string{"cat"}, Stdin: strings.NewReader("from stdin\n")})
	if r.Code != 0 || r.Stdout != "from stdin\n" {
		t.Fatalf("cat: %+v", r)
	}
	r = Exec(t, b, name, backend.ExecOptions{
		Argv: []string{"sh", "-c", `printf '%s|%s' "$GREETING" "$EMPTY_OK"`},
		Env:  map[string]string{"GREETING": "hello world", "EMPTY_OK": ""},
	})
	if r.Stdout != "hello world|" {
		t.Fatalf("env: stdout %q", r.Stdout)
	}
	// A missing command is an error or a failing status, never success.
	code, err := b.Exec(t.Context(), name, backend.ExecOptions{Argv: []string{"no-such-command-xyz"}, Stderr: io.Discard})
	if err == nil && code == 0 {
		t.Fatal("missing command exited 0")
	}
}

func testExecUsersAndDir(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := CreateStarted(t, b, "users", repo)
	if !opts.HostUser {
		ids := map[string]string{"": strconv.Itoa(backend.AgentUID), "root": "0"}
		for user, want := range ids {
			r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"id", "-u"}, User: user})
			if strings.TrimSpace(r.Stdout) != want {
				t.Errorf("User %q: id -u = %q, want %s", user, r.Stdout, want)
			}
		}
		if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"id", "-g"}}); strings.TrimSpace(r.Stdout) != strconv.Itoa(backend.AgentGID) {
			t.Errorf("id -g = %q, want %d", r.Stdout, backend.AgentGID)
		}
	}
	if got := Sh(t, b, name, "cat README"); got != "two" {
		t.Fatalf("default dir: README = %q, want the checkout's %q", got, "two")
	}
	Sh(t, b, name, "mkdir sub && echo deep > sub/f")
	r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"cat", "f"}, Dir: "sub"})
	if r.Stdout != "deep\n" {
		t.Fatalf("Dir sub: %+v", r)
	}
}

func testPersistsAcrossStop(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := CreateStarted(t, b, "persist", repo)
	Sh(t, b, name, "echo kept > note.txt")
	if err := b.Stop(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec(t.Context(), name, backend.ExecOptions{Argv: []string{"true"}}); !errors.Is(err, backend.ErrNotRunning) {
		t.Fatalf("Exec after Stop: err = %v, want ErrNotRunning", err)
	}
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if got := Sh(t, b, name, "cat note.txt"); got != "kept" {
		t.Fatalf("note.txt = %q after restart", got)
	}
}

func testAttachDetach(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := CreateStarted(t, b, "sock", repo)
	// The client's own lookup: the override variable (set where no mount
	// can carry the socket), else the mount path.
	sock := `"${JAILBEE_ORCHESTRATION_SOCKET:-` + backend.SocketMountPath + `/broker.sock}"`
	probe := backend.ExecOptions{Argv: []string{"sh", "-c", "test -S " + sock}}
	if r := Exec(t, b, name, probe); r.Code == 0 {
		t.Fatal("socket visible before AttachSocket")
	}
	if err := b.AttachSocket(t.Context(), name, SocketDir(t, "one\n")); err != nil {
		t.Fatalf("AttachSocket: %v", err)
	}
	if r := Exec(t, b, name, probe); r.Code != 0 {
		t.Fatalf("attached socket not visible at %s: %+v", sock, r)
	}
	// Read-only: the sandbox cannot replace the socket.
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "rm -f " + sock}}); r.Code == 0 && !opts.HostUser {
		t.Fatal("sandbox removed the attached socket")
	}
	if err := b.DetachSocket(t.Context(), name); err != nil {
		t.Fatalf("DetachSocket: %v", err)
	}
	if r := Exec(t, b, name, probe); r.Code == 0 {
		t.Fatal("socket still visible after DetachSocket")
	}
	if err := b.DetachSocket(t.Context(), name); err != nil {
		t.Fatalf("second DetachSocket: %v", err)
	}
	// Attaching again, to a new directory, replaces the attachment.
	if err := b.AttachSocket(t.Context(), name, SocketDir(t, "two\n")); err != nil {
		t.Fatal(err)
	}
	if r := Exec(t, b, name, probe); r.Code != 0 {
		t.Fatalf("re-attached socket not visible: %+v", r)
	}
}

func testDestroy(t *testing.T, b backend.Backend, opts Options) {
	repo := NewRepo(t)
	name := CreateStarted(t, b, "gone", repo)
	first, _ := find(t, b, name)
	if err := b.Destroy(t.Context(), name); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, ok := find(t, b, name); ok {
		t.Fatal("List still has the destroyed sandbox")
	}
	if _, err := b.Exec(t.Context(), name, backend.ExecOptions{Argv: []string{"true"}}); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Exec after Destroy: %v, want ErrNotFound", err)
	}
	if err := b.Destroy(t.Context(), name); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("second Destroy: %v, want ErrNotFound", err)
	}
	again := Create(t, b, name, backend.GitSource{Repo: repo.Path, Branch: "main"})
	if again.UUID == first.UUID {
		t.Fatal("a re-created sandbox kept the old uuid")
	}
	if again.Running {
		t.Fatal("a re-created sandbox is running")
	}
}

func testUnknown(t *testing.T, b backend.Backend, opts Options) {
	name := Name(t, "never")
	ctx := t.Context()
	checks := map[string]error{
		"Start":        b.Start(ctx, name),
		"Stop":         b.Stop(ctx, name),
		"Destroy":      b.Destroy(ctx, name),
		"AttachSocket": b.AttachSocket(ctx, name, t.TempDir()),
		"DetachSocket": b.DetachSocket(ctx, name),
	}
	_, checks["Exec"] = b.Exec(ctx, name, backend.ExecOptions{Argv: []string{"true"}})
	_, checks["GitRemote"] = b.GitRemote(ctx, name)
	for op, err := range checks {
		if !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("%s on an unknown sandbox: err = %v, want ErrNotFound", op, err)
		}
	}
}
