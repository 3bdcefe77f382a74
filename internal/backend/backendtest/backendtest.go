// Package backendtest is the conformance suite every backend.Backend runs:
// what the broker relies on, seen only through the interface, with real
// git repositories (filled and moved with gitx, git running inside the
// sandboxes) and real Unix sockets.
package backendtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/gitx"
	"agentbox/internal/serial"
	"agentbox/internal/term"
	"agentbox/internal/testutil/serve"
	"agentbox/internal/testutil/wait"
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

// Options adapts the suite to a backend.
type Options struct {
	// HostUID returns the host uid for a new sandbox (the broker's
	// CreateOptions.HostUID); nil gives 0.
	HostUID func(t testing.TB) int
	// Limits are set on every sandbox the suite creates.
	Limits backend.Limits
	// AgentOnly: the backend has only the agent user (ExecOptions.User
	// other than the agent is ErrUnsupported).
	AgentOnly bool
	// AttachAtStart: AttachSocket on a running sandbox takes effect at its
	// next start (the local backend), not at once.
	AttachAtStart bool
	// WithAgents, if set, returns a backend (as newBackend does) whose
	// sandboxes get agents (the backend's AgentBinaries option) on their
	// PATH; without it the agent test is skipped.
	WithAgents func(t *testing.T, agents map[string]string) backend.Backend
}

// suite is one subtest's backend and options.
type suite struct {
	t    *testing.T
	b    backend.Backend
	opts Options
}

// Run runs the conformance suite. newBackend is called once per subtest
// and must return a backend with no sandboxes of its own making yet.
func Run(t *testing.T, newBackend func(t *testing.T) backend.Backend, opts Options) {
	tests := []struct {
		name string
		fn   func(s *suite)
	}{
		{"Type", testType},
		{"CreateIsStoppedAndEmpty", testCreateStopped},
		{"CreateExistingName", testCreateExisting},
		{"CreateInvalidName", testCreateInvalidName},
		{"UUIDsAreUnique", testUUIDsUnique},
		{"ExecWhenStopped", testExecStopped},
		{"StartStopIdempotent", testStartStopIdempotent},
		{"ExecStatusAndStreams", testExecStreams},
		{"ExecUsersAndDir", testExecUsersAndDir},
		{"ExecOutputHeldInBackground", testExecBackgroundHolder},
		{"ExecTerminal", testExecTerminal},
		{"ExecCancelEndsCommand", testExecCancel},
		{"ExecCancelEndsForks", testExecCancelForks},
		{"StopEndsEveryProcess", testStopEndsEveryProcess},
		{"CheckoutPersistsAcrossStop", testPersistsAcrossStop},
		{"AttachDetachSocket", testAttachDetach},
		{"AttachBothSocketKinds", testAttachBothKinds},
		{"HostMountReadWrite", testHostMountReadWrite},
		{"HostMountDetachWhileReading", testHostMountDetachWhileReading},
		{"HostMountSymlinks", testHostMountSymlinks},
		{"HostMountDestroy", testHostMountDestroy},
		{"AgentBinaries", testAgentBinaries},
		{"FillCheckoutFromHost", testFillCheckout},
		{"TransferBetweenSandboxes", testTransfer},
		{"TransferBound", testTransferBound},
		{"WorkChecks", testWorkChecks},
		{"Destroy", testDestroy},
		{"DestroyGivesTheTurnAway", testDestroyGivesTheTurnAway},
		{"UnknownSandbox", testUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(&suite{t: t, b: newBackend(t), opts: opts}) })
	}
}

// options are the CreateOptions of a new sandbox name.
func (s *suite) options(name string) backend.CreateOptions {
	o := backend.CreateOptions{Name: name, Limits: s.opts.Limits}
	if s.opts.HostUID != nil {
		o.HostUID = s.opts.HostUID(s.t)
	}
	return o
}

// create makes a stopped sandbox and destroys it when the test ends.
func (s *suite) create(label string) (string, backend.Instance) {
	s.t.Helper()
	name := Name(s.t, label)
	inst, err := s.b.Create(s.t.Context(), s.options(name))
	if err != nil {
		s.t.Fatalf("Create(%s): %v", name, err)
	}
	s.t.Cleanup(func() {
		if err := s.b.Destroy(context.Background(), name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			s.t.Errorf("cleanup Destroy(%s): %v", name, err)
		}
	})
	return name, inst
}

// started makes a running sandbox.
func (s *suite) started(label string) string {
	s.t.Helper()
	name, _ := s.create(label)
	if err := s.b.Start(s.t.Context(), name); err != nil {
		s.t.Fatalf("Start(%s): %v", name, err)
	}
	return name
}

// filled makes a running sandbox whose checkout is branch main of repo.
func (s *suite) filled(label string, repo Repo) string {
	s.t.Helper()
	name := s.started(label)
	FillCheckout(s.t, s.b, name, repo.Path, "main", repo.Second)
	return name
}

// Runner runs commands in the sandbox name through the backend, for gitx.
func Runner(b backend.Backend, name string) gitx.Runner {
	return gitx.RunnerFunc(func(ctx context.Context, c gitx.Cmd) (int, error) {
		return b.Exec(ctx, name, backend.ExecOptions{
			Argv: c.Argv, Dir: c.Dir, Env: c.Env, Stdin: c.Stdin, Stdout: c.Stdout, Stderr: c.Stderr, Started: c.Started,
		})
	})
}

// Checkout is the sandbox's repository, for gitx.
func Checkout(b backend.Backend, name string) gitx.Repo {
	return gitx.SandboxRepo(name, Runner(b, name), backend.WorkspacePath)
}

// FillCheckout fills a running sandbox's empty checkout with branch at
// commit of the host repository repo, as the broker does: every git
// command inside the sandbox, the init and the checkout with the fetch.
func FillCheckout(t testing.TB, b backend.Backend, name, repo, branch, commit string) {
	t.Helper()
	opts := gitx.TransferOptions{Init: true, Checkout: branch}
	if err := gitx.Transfer(t.Context(), gitx.HostRepo(repo), commit, Checkout(b, name), "refs/jailbee/start", opts); err != nil {
		t.Fatalf("transfer into %s: %v", name, err)
	}
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
	return KindDir(t, backend.OrchestrationSocket, greeting)
}

// KindDir is SocketDir for a directory of kind: its socket is
// kind.SocketFile().
func KindDir(t testing.TB, kind backend.SocketKind, greeting string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bt-sock-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, kind.SocketFile())
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	serve.Serve(t, ln, func(c net.Conn) { c.Write([]byte(greeting)) })
	return dir
}

func (s *suite) find(name string) (backend.Instance, bool) {
	s.t.Helper()
	list, err := s.b.List(s.t.Context())
	if err != nil {
		s.t.Fatalf("List: %v", err)
	}
	for _, inst := range list {
		if inst.Name == name {
			return inst, true
		}
	}
	return backend.Instance{}, false
}

func testType(s *suite) {
	if s.b.Type() == "" {
		s.t.Fatal("Type() is empty")
	}
}

func testCreateStopped(s *suite) {
	name, inst := s.create("new")
	if inst.Name != name || inst.Running || !uuidPattern.MatchString(inst.UUID) {
		s.t.Fatalf("Create returned %+v; want name %s, stopped, a v4 uuid", inst, name)
	}
	if got, ok := s.find(name); !ok || !reflect.DeepEqual(got, inst) {
		s.t.Fatalf("List has %+v (found %v), want %+v", got, ok, inst)
	}
	if err := s.b.Start(s.t.Context(), name); err != nil {
		s.t.Fatal(err)
	}
	// An empty checkout the agent user owns and can write.
	if got := Sh(s.t, s.b, name, "ls -A; stat -c %u "+backend.WorkspacePath+"; touch f && echo ok"); got != strconv.Itoa(backend.AgentUID)+"\nok" {
		s.t.Fatalf("new checkout: %q; want empty, owned by %d, writable", got, backend.AgentUID)
	}
}

func testCreateExisting(s *suite) {
	name, inst := s.create("dup")
	_, err := s.b.Create(s.t.Context(), s.options(name))
	if !errors.Is(err, backend.ErrExists) {
		s.t.Fatalf("second Create: err = %v, want ErrExists", err)
	}
	if got, _ := s.find(name); got.UUID != inst.UUID {
		s.t.Fatalf("failed Create changed the sandbox: uuid %s, want %s", got.UUID, inst.UUID)
	}
}

func testCreateInvalidName(s *suite) {
	for _, name := range []string{"", "-x", "Upper", "a/b", "..", strings.Repeat("a", backend.NameMaxLen+1)} {
		_, err := s.b.Create(s.t.Context(), s.options(name))
		if !errors.Is(err, backend.ErrInvalidName) {
			s.t.Errorf("Create(%q): err = %v, want ErrInvalidName", name, err)
		}
	}
}

func testUUIDsUnique(s *suite) {
	seen := map[string]string{}
	for i := range 3 {
		name, inst := s.create("u" + strconv.Itoa(i))
		if other, dup := seen[inst.UUID]; dup {
			s.t.Fatalf("%s and %s share uuid %s", name, other, inst.UUID)
		}
		seen[inst.UUID] = name
	}
	list, err := s.b.List(s.t.Context())
	if err != nil {
		s.t.Fatal(err)
	}
	for _, inst := range list {
		if name, ok := seen[inst.UUID]; ok {
			if inst.Name != name {
				s.t.Errorf("List: uuid %s on %s, want %s", inst.UUID, inst.Name, name)
			}
			delete(seen, inst.UUID)
		}
	}
	if len(seen) != 0 {
		s.t.Fatalf("List is missing %v", seen)
	}
}

func testExecStopped(s *suite) {
	name, _ := s.create("stopped")
	_, err := s.b.Exec(s.t.Context(), name, backend.ExecOptions{Argv: []string{"true"}})
	if !errors.Is(err, backend.ErrNotRunning) {
		s.t.Fatalf("Exec on a stopped sandbox: err = %v, want ErrNotRunning", err)
	}
}

func testStartStopIdempotent(s *suite) {
	name := s.started("idem")
	if err := s.b.Start(s.t.Context(), name); err != nil {
		s.t.Fatalf("Start of a running sandbox: %v", err)
	}
	if inst, _ := s.find(name); !inst.Running {
		s.t.Fatal("List: started sandbox not running")
	}
	for range 2 {
		if err := s.b.Stop(s.t.Context(), name); err != nil {
			s.t.Fatalf("Stop: %v", err)
		}
	}
	if inst, _ := s.find(name); inst.Running {
		s.t.Fatal("List: stopped sandbox running")
	}
}

func testExecStreams(s *suite) {
	t, b := s.t, s.b
	name := s.started("streams")
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
	// A signal's status is 128+n.
	if r = Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "kill -TERM $$"}}); r.Code != 128+15 {
		t.Fatalf("killed by SIGTERM: exit %d, want %d", r.Code, 128+15)
	}
	// A missing command is the shell's 127.
	if r = Exec(t, b, name, backend.ExecOptions{Argv: []string{"no-such-command-xyz"}}); r.Code != 127 {
		t.Fatalf("missing command: exit %d (%q), want 127", r.Code, r.Stderr)
	}
	// Files go to the command as they are; Started says when ours may go.
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	started := false
	code, err := b.Exec(t.Context(), name, backend.ExecOptions{
		Argv: []string{"echo", "through a file"}, Stdout: wr,
		Started: func() { started = true; wr.Close() },
	})
	if err != nil || code != 0 || !started {
		t.Fatalf("Exec with a file: %d, %v, started %v", code, err, started)
	}
	got, _ := io.ReadAll(rd)
	rd.Close()
	if string(got) != "through a file\n" {
		t.Fatalf("through a file: %q (the pipe must end when the command ends)", got)
	}
}

// testExecBackgroundHolder: a command that leaves a process in the
// background holding its stdout and stderr (what git run by the broker
// does when a hook of the sandbox's starts one) still ends: its Exec
// returns its status and output once it has ended and its output stopped
// coming, not when the process in the background lets go. The minute is
// only a bound on the test: the command's process lives 10.
func testExecBackgroundHolder(s *suite) {
	t, b := s.t, s.b
	name := s.started("holder")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code, err := b.Exec(ctx, name, backend.ExecOptions{Argv: []string{"sh", "-c", "sleep 600 & echo out; echo err >&2; exit 3"},
		Stdout: &stdout, Stderr: &stderr})
	if err != nil || code != 3 || stdout.String() != "out\n" || stderr.String() != "err\n" {
		t.Fatalf("a command that left a process holding its output: %d, %v, stdout %q, stderr %q; want 3 and its output", code, err, stdout.String(), stderr.String())
	}
}

func testExecUsersAndDir(s *suite) {
	t, b := s.t, s.b
	name := s.started("users")
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"id", "-u"}}); strings.TrimSpace(r.Stdout) != strconv.Itoa(backend.AgentUID) {
		t.Errorf("id -u = %q, want %d", r.Stdout, backend.AgentUID)
	}
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"id", "-g"}}); strings.TrimSpace(r.Stdout) != strconv.Itoa(backend.AgentGID) {
		t.Errorf("id -g = %q, want %d", r.Stdout, backend.AgentGID)
	}
	if s.opts.AgentOnly {
		if _, err := b.Exec(t.Context(), name, backend.ExecOptions{Argv: []string{"true"}, User: "root"}); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("User root: err = %v, want ErrUnsupported", err)
		}
	} else if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"id", "-u"}, User: "root"}); strings.TrimSpace(r.Stdout) != "0" {
		t.Errorf("User root: id -u = %q, want 0", r.Stdout)
	}
	if got := Sh(t, b, name, "pwd"); got != backend.WorkspacePath {
		t.Fatalf("default dir %q, want %s", got, backend.WorkspacePath)
	}
	Sh(t, b, name, "mkdir sub && echo deep > sub/f")
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"cat", "f"}, Dir: "sub"}); r.Stdout != "deep\n" {
		t.Fatalf("Dir sub: %+v", r)
	}
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"pwd"}, Dir: "/tmp"}); r.Stdout != "/tmp\n" {
		t.Fatalf("Dir /tmp: %+v", r)
	}
}

func testExecTerminal(s *suite) {
	t := s.t
	name := s.started("tty")
	data := s.execOnTerminal(name, "test -t 0 && test -t 1 && echo is-a-terminal; exit 3", 3)
	if !strings.Contains(string(data), "is-a-terminal") {
		t.Fatalf("terminal output %q", data)
	}
	// What the command leaves running with its terminal (deaf to the
	// hangup at the command's end) does not hold Exec, nor the terminal
	// handed in, past the command's end.
	data = s.execOnTerminal(name, "trap '' HUP; sleep 600 & echo left-running; exit 4", 4)
	if !strings.Contains(string(data), "left-running") {
		t.Fatalf("terminal output %q", data)
	}
}

// execOnTerminal runs script with a new terminal as its streams, checks
// its exit status, and returns what the terminal showed (hang guards on
// Exec and on the terminal's end).
func (s *suite) execOnTerminal(name, script string, want int) []byte {
	t, b := s.t, s.b
	t.Helper()
	master, slave, err := term.OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	out := make(chan []byte, 1)
	go func() {
		data, _ := io.ReadAll(master) // ends with EIO once the slave is closed everywhere
		out <- data
	}()
	type result struct {
		code int
		err  error
	}
	ran := make(chan result, 1)
	go func() {
		code, err := b.Exec(t.Context(), name, backend.ExecOptions{
			Argv: []string{"sh", "-c", script},
			TTY:  true, Stdin: slave, Stdout: slave, Stderr: slave,
		})
		ran <- result{code, err}
	}()
	select {
	case r := <-ran:
		if r.err != nil || r.code != want {
			t.Fatalf("Exec with a terminal: %d, %v; want %d", r.code, r.err, want)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("Exec with a terminal of %q did not return (hang guard)", script)
	}
	slave.Close()
	select {
	case data := <-out:
		return data
	case <-time.After(30 * time.Second):
		t.Fatal("the terminal never closed")
		return nil
	}
}

func testExecCancel(s *suite) {
	name := s.started("cancel")
	ctx, cancel := context.WithCancel(s.t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := s.b.Exec(ctx, name, backend.ExecOptions{Argv: []string{"sh", "-c", "echo $$ > /tmp/pid; exec sleep 600"}})
		done <- err
	}()
	wait.For(s.t, "the sandbox's state", func() bool {
		return Exec(s.t, s.b, name, backend.ExecOptions{Argv: []string{"test", "-s", "/tmp/pid"}}).Code == 0
	})
	cancel()
	select {
	case err := <-done:
		if err == nil {
			s.t.Fatal("a cancelled Exec returned no error")
		}
	case <-time.After(30 * time.Second):
		s.t.Fatal("cancelling did not end the command")
	}
	wait.For(s.t, "the sandbox's state", func() bool {
		return Exec(s.t, s.b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "kill -0 $(cat /tmp/pid)"}}).Code != 0
	})
}

// testExecCancelForks: a cancelled command that forks all the time leaves
// nothing behind, not even what it forked while the cancel was under way.
// Each child writes ~/late a moment after it was forked, so a survivor
// shows up there after Exec has returned.
func testExecCancelForks(s *suite) {
	t, b := s.t, s.b
	name := s.started("forks")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		// The idle sleeps, with an environment of 1.6 MiB each, make the
		// kill take a while, as a build's many processes would.
		_, err := b.Exec(ctx, name, backend.ExecOptions{Argv: []string{"sh", "-c",
			`x=$(head -c 131000 /dev/zero | tr '\0' x)
			export A1=$x A2=$x A3=$x A4=$x A5=$x A6=$x A7=$x A8=$x A9=$x A10=$x A11=$x A12=$x A13=$x
			i=0; while [ $i -lt 150 ]; do sleep 1000 & i=$((i + 1)); done
			while :; do (sleep 0.3; echo x >> "$HOME/late") & sleep 0.02; done`}})
		done <- err
	}()
	wait.For(t, "the command's children to write", func() bool {
		return Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", `test -s "$HOME/late"`}}).Code == 0
	})
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cancelled Exec returned no error")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("cancelling did not end the command")
	}
	for _, p := range Processes(t, b, name) {
		if p == "sleep 0.3" || p == "sleep 1000" || strings.Contains(p, "$HOME/late") {
			t.Fatalf("a cancelled command's process still runs after Exec returned: %q", p)
		}
	}
	Sh(t, b, name, `rm -f "$HOME/late"`)
	time.Sleep(time.Second) // three times what a child sleeps
	if out := Sh(t, b, name, `cat "$HOME/late" 2>/dev/null | wc -l`); out != "0" {
		t.Fatalf("%s children of a cancelled command ran on after Exec returned", out)
	}
}

// testStopEndsEveryProcess: what a command left running in the background
// ends with Stop, whoever started it.
func testStopEndsEveryProcess(s *suite) {
	t, b := s.t, s.b
	name := s.started("stopall")
	Sh(t, b, name, "nohup sh -c 'while :; do date +%s%N > /home/agent/beat; sleep 0.05; done' >/dev/null 2>&1 &")
	wait.For(t, "the sandbox's state", func() bool {
		return Exec(t, b, name, backend.ExecOptions{Argv: []string{"test", "-s", "/home/agent/beat"}}).Code == 0
	})
	if err := b.Stop(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	first := Sh(t, b, name, "cat /home/agent/beat")
	time.Sleep(300 * time.Millisecond)
	if again := Sh(t, b, name, "cat /home/agent/beat"); again != first {
		t.Fatal("a background loop survived Stop: its heartbeat still changes")
	}
	for _, p := range Processes(t, b, name) {
		if p == "sleep 0.05" || strings.Contains(p, "/home/agent/beat") {
			t.Fatalf("a process of the old unit after a restart: %q", p)
		}
	}
}

// Processes lists the command lines (arguments joined by spaces) of the
// sandbox's live processes, read from /proc: the Incus image has no ps.
// A process that has exited, a zombie included, has none and is left out.
func Processes(t testing.TB, b backend.Backend, name string) []string {
	t.Helper()
	out := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c",
		`for p in /proc/[0-9]*; do tr '\0' ' ' < "$p/cmdline" 2>/dev/null; echo; done`}}).Stdout
	var procs []string
	for line := range strings.Lines(out) {
		if p := strings.TrimSpace(line); p != "" {
			procs = append(procs, p)
		}
	}
	return procs
}

func testPersistsAcrossStop(s *suite) {
	t, b := s.t, s.b
	name := s.started("persist")
	Sh(t, b, name, "echo kept > note.txt; echo home > /home/agent/h")
	if err := b.Stop(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec(t.Context(), name, backend.ExecOptions{Argv: []string{"true"}}); !errors.Is(err, backend.ErrNotRunning) {
		t.Fatalf("Exec after Stop: err = %v, want ErrNotRunning", err)
	}
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if got := Sh(t, b, name, "cat note.txt /home/agent/h"); got != "kept\nhome" {
		t.Fatalf("after restart: %q", got)
	}
}

func testAttachDetach(s *suite) {
	t, b := s.t, s.b
	name, _ := s.create("sock")
	probe := backend.ExecOptions{Argv: []string{"sh", "-c", "test -S " + backend.SocketMountPath + "/broker.sock"}}
	if err := b.AttachSocket(t.Context(), name, backend.OrchestrationSocket, SocketDir(t, "one\n")); err != nil {
		t.Fatalf("AttachSocket: %v", err)
	}
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if r := Exec(t, b, name, probe); r.Code != 0 {
		t.Fatalf("attached socket not visible: %+v", r)
	}
	// The agent user can connect; the mount is read-only.
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "rm -f " + backend.SocketMountPath + "/broker.sock"}}); r.Code == 0 {
		t.Fatal("sandbox removed the attached socket")
	}
	if err := b.DetachSocket(t.Context(), name, backend.OrchestrationSocket); err != nil {
		t.Fatalf("DetachSocket: %v", err)
	}
	if err := b.DetachSocket(t.Context(), name, backend.OrchestrationSocket); err != nil {
		t.Fatalf("second DetachSocket: %v", err)
	}
	restart := func() {
		t.Helper()
		if s.opts.AttachAtStart {
			if err := b.Stop(t.Context(), name); err != nil {
				t.Fatal(err)
			}
			if err := b.Start(t.Context(), name); err != nil {
				t.Fatal(err)
			}
		}
	}
	restart()
	if r := Exec(t, b, name, probe); r.Code == 0 {
		t.Fatal("socket still visible after DetachSocket")
	}
	if err := b.AttachSocket(t.Context(), name, backend.OrchestrationSocket, SocketDir(t, "two\n")); err != nil {
		t.Fatal(err)
	}
	restart()
	if r := Exec(t, b, name, probe); r.Code != 0 {
		t.Fatalf("re-attached socket not visible: %+v", r)
	}
}

// restart stops and starts a sandbox where attachments wait for the
// next start (AttachAtStart); elsewhere they are there at once.
func (s *suite) restart(name string) {
	s.t.Helper()
	if !s.opts.AttachAtStart {
		return
	}
	if err := s.b.Stop(s.t.Context(), name); err != nil {
		s.t.Fatal(err)
	}
	if err := s.b.Start(s.t.Context(), name); err != nil {
		s.t.Fatal(err)
	}
}

// testAttachBothKinds: the orchestration and model directories are two
// attachments, each at its own path showing its own directory, reachable
// by the agent user; detaching one leaves the other.
func testAttachBothKinds(s *suite) {
	t, b := s.t, s.b
	name, _ := s.create("kinds")
	dirs := map[backend.SocketKind]string{}
	for _, kind := range []backend.SocketKind{backend.OrchestrationSocket, backend.ModelSocket} {
		dirs[kind] = KindDir(t, kind, kind.String()+"\n")
		writeFile(t, filepath.Join(dirs[kind], "which"), kind.String()+"\n")
		if err := b.AttachSocket(t.Context(), name, kind, dirs[kind]); err != nil {
			t.Fatalf("AttachSocket(%s): %v", kind, err)
		}
	}
	in, _ := s.find(name)
	if in.SocketDir != dirs[backend.OrchestrationSocket] || in.ModelDir != dirs[backend.ModelSocket] {
		t.Fatalf("List: socket dir %q, model dir %q; want %q and %q", in.SocketDir, in.ModelDir, dirs[backend.OrchestrationSocket], dirs[backend.ModelSocket])
	}
	for kind, dir := range dirs {
		if !slices.Contains(in.Mounts, backend.Mount{Name: kind.DeviceName(), Source: dir}) {
			t.Fatalf("List: mounts %+v lack %s at %s", in.Mounts, kind.DeviceName(), dir)
		}
	}
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	// What each path shows: its directory's marker and socket, or "none".
	look := func(kind backend.SocketKind) string {
		t.Helper()
		p := kind.MountPath()
		return Sh(t, b, name, "cat "+p+"/which 2>/dev/null && test -S "+p+"/"+kind.SocketFile()+" || echo none")
	}
	want := func(orch, model string) {
		t.Helper()
		if got := look(backend.OrchestrationSocket); got != orch {
			t.Fatalf("%s shows %q, want %q", backend.SocketMountPath, got, orch)
		}
		if got := look(backend.ModelSocket); got != model {
			t.Fatalf("%s shows %q, want %q", backend.ModelMountPath, got, model)
		}
	}
	want("orchestration", "model")
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "touch " + backend.ModelMountPath + "/x"}}); r.Code == 0 {
		t.Fatal("the model directory is writable inside")
	}
	if err := b.DetachSocket(t.Context(), name, backend.ModelSocket); err != nil {
		t.Fatalf("DetachSocket(model): %v", err)
	}
	s.restart(name)
	want("orchestration", "none")
	if in, _ := s.find(name); in.SocketDir != dirs[backend.OrchestrationSocket] || in.ModelDir != "" {
		t.Fatalf("List after detaching the model: %+v", in)
	}
	if err := b.AttachSocket(t.Context(), name, backend.ModelSocket, dirs[backend.ModelSocket]); err != nil {
		t.Fatal(err)
	}
	if err := b.DetachSocket(t.Context(), name, backend.OrchestrationSocket); err != nil {
		t.Fatalf("DetachSocket(orchestration): %v", err)
	}
	s.restart(name)
	want("none", "model")
	if in, _ := s.find(name); in.SocketDir != "" || in.ModelDir != dirs[backend.ModelSocket] {
		t.Fatalf("List after detaching the orchestration socket: %+v", in)
	}
}

// testAgentBinaries: an agent binary given to the backend runs by name
// on the sandbox's PATH, and the agent user cannot change it.
func testAgentBinaries(s *suite) {
	t := s.t
	if s.opts.WithAgents == nil {
		t.Skip("no WithAgents for this backend")
	}
	script := "#!/bin/sh\necho \"fakeagent ran $*\"\n"
	// Writable by anyone: only the read-only binding keeps it unchanged.
	bin := filepath.Join(t.TempDir(), "fakeagent-1.0")
	if err := os.WriteFile(bin, []byte(script), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o777); err != nil {
		t.Fatal(err)
	}
	s.b = s.opts.WithAgents(t, map[string]string{"fakeagent": bin})
	b := s.b
	name := s.started("agents")
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"fakeagent", "hello"}}); r.Code != 0 || r.Stdout != "fakeagent ran hello\n" {
		t.Fatalf("fakeagent by name: %+v", r)
	}
	for _, attempt := range []string{
		`echo 'echo owned' > "$(command -v fakeagent)"`,
		`: > "$(command -v fakeagent)"`,
		`echo 'echo owned' >> "$(command -v fakeagent)"`,
		`chmod 777 "$(command -v fakeagent)"`,
		`rm -f "$(command -v fakeagent)"`,
		`mv "$(command -v fakeagent)" /tmp/moved`,
	} {
		if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", attempt}}); r.Code == 0 {
			t.Errorf("%s succeeded inside", attempt)
		}
	}
	if data, err := os.ReadFile(bin); err != nil || string(data) != script {
		t.Fatalf("the host file changed: %q, %v", data, err)
	}
	if fi, err := os.Stat(bin); err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("the host file's mode changed: %v, %v", fi.Mode(), err)
	}
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"fakeagent", "again"}}); r.Stdout != "fakeagent ran again\n" {
		t.Fatalf("fakeagent after the attempts: %+v", r)
	}
}

func testFillCheckout(s *suite) {
	t, b := s.t, s.b
	repo := NewRepo(t)
	git(t, repo.Path, "branch", "secret-branch-name")
	name := s.started("fill")
	FillCheckout(t, b, name, repo.Path, "task-1", repo.First)
	if got := Sh(t, b, name, "cat README"); got != "one" {
		t.Fatalf("checkout README = %q, want the first commit's %q", got, "one")
	}
	branch, head, err := gitx.Head(t.Context(), Checkout(b, name))
	if err != nil || branch != "task-1" || head != repo.First {
		t.Fatalf("Head = %q %s %v; want task-1 at %s", branch, head, err, repo.First)
	}
	// Only what the commit reaches came over: no branch or tag of the
	// source, not the later commit, no remote naming the host path.
	if got := Sh(t, b, name, "git for-each-ref --format='%(refname)'"); got != "refs/heads/task-1\nrefs/jailbee/start" {
		t.Fatalf("refs in the sandbox: %q", got)
	}
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"git", "cat-file", "-e", repo.Second}}); r.Code == 0 {
		t.Fatal("the sandbox holds a commit its checkout does not reach")
	}
	if got := Sh(t, b, name, "git remote; cat .git/config .git/FETCH_HEAD 2>/dev/null || true"); strings.Contains(got, repo.Path) {
		t.Fatalf("the host repository's path is in the sandbox: %q", got)
	}
}

func testTransfer(s *suite) {
	t, b := s.t, s.b
	repo := NewRepo(t)
	src := s.filled("src", repo)
	dst := s.filled("dst", repo)
	Sh(t, b, src, "echo work > work.txt && git add work.txt && git -c user.name=A -c user.email=a@example.com commit -qm work")
	_, commit, err := gitx.Head(t.Context(), Checkout(b, src))
	if err != nil {
		t.Fatal(err)
	}
	if err := gitx.Transfer(t.Context(), Checkout(b, src), commit, Checkout(b, dst), "refs/jailbee/from/src/main", gitx.TransferOptions{}); err != nil {
		t.Fatalf("Transfer: %v", err)
	}
	if got := Sh(t, b, dst, "git rev-parse refs/jailbee/from/src/main"); got != commit {
		t.Fatalf("destination ref = %s, want %s", got, commit)
	}
	// Nothing merged: the destination's branch and work tree are as they were.
	if got := Sh(t, b, dst, "git rev-parse HEAD; test -e work.txt || echo no-work"); got != repo.Second+"\nno-work" {
		t.Fatalf("destination work tree changed: %q", got)
	}
	// A destination ref outside refs/, a short id and a branch to check
	// out that git would read as an option are refused.
	for _, bad := range []string{"-b", "bad..branch"} {
		if err := gitx.Transfer(t.Context(), Checkout(b, src), commit, Checkout(b, dst), "refs/x", gitx.TransferOptions{Checkout: bad}); !errors.Is(err, gitx.ErrInvalidArgument) {
			t.Fatalf("checkout %q after the transfer: %v", bad, err)
		}
	}
	if err := gitx.Transfer(t.Context(), Checkout(b, src), commit, Checkout(b, dst), "HEAD", gitx.TransferOptions{}); !errors.Is(err, gitx.ErrInvalidArgument) {
		t.Fatalf("Transfer to HEAD: %v, want ErrInvalidArgument", err)
	}
	if err := gitx.Transfer(t.Context(), Checkout(b, src), commit[:12], Checkout(b, dst), "refs/x", gitx.TransferOptions{}); !errors.Is(err, gitx.ErrInvalidArgument) {
		t.Fatalf("Transfer of a short id: %v, want ErrInvalidArgument", err)
	}
}

// testTransferBound: a source cannot send more than the bound.
func testTransferBound(s *suite) {
	t, b := s.t, s.b
	repo := NewRepo(t)
	src := s.filled("big", repo)
	dst := s.filled("small", repo)
	Sh(t, b, src, "head -c 300000 /dev/urandom > blob && git add blob && git -c user.name=A -c user.email=a@example.com commit -qm blob")
	_, commit, err := gitx.Head(t.Context(), Checkout(b, src))
	if err != nil {
		t.Fatal(err)
	}
	err = gitx.Transfer(t.Context(), Checkout(b, src), commit, Checkout(b, dst), "refs/x", gitx.TransferOptions{MaxBytes: 100000})
	if !errors.Is(err, gitx.ErrTransferTooLarge) {
		t.Fatalf("Transfer past the bound: %v, want ErrTransferTooLarge", err)
	}
	if r := Exec(t, b, dst, backend.ExecOptions{Argv: []string{"git", "rev-parse", "--verify", "-q", "refs/x"}}); r.Code == 0 {
		t.Fatal("the destination got the ref of a transfer past its bound")
	}
	if err := gitx.Transfer(t.Context(), Checkout(b, src), commit, Checkout(b, dst), "refs/x", gitx.TransferOptions{MaxBytes: 1 << 20}); err != nil {
		t.Fatalf("Transfer within the bound: %v", err)
	}
}

func testWorkChecks(s *suite) {
	t, b := s.t, s.b
	repo := NewRepo(t)
	name := s.filled("work", repo)
	co := Checkout(b, name)
	if clean, err := gitx.IsClean(t.Context(), co); err != nil || !clean {
		t.Fatalf("fresh checkout: clean %v, %v", clean, err)
	}
	Sh(t, b, name, "echo x > untracked")
	if clean, err := gitx.IsClean(t.Context(), co); err != nil || clean {
		t.Fatalf("untracked file: clean %v, %v", clean, err)
	}
	Sh(t, b, name, "rm untracked; echo changed > README")
	if clean, err := gitx.IsClean(t.Context(), co); err != nil || clean {
		t.Fatalf("changed file: clean %v, %v", clean, err)
	}
	Sh(t, b, name, "git checkout -q README; git checkout -q --detach")
	if branch, head, err := gitx.Head(t.Context(), co); err != nil || branch != "" || head != repo.Second {
		t.Fatalf("detached Head = %q %s %v", branch, head, err)
	}
}

func testDestroy(s *suite) {
	t, b := s.t, s.b
	name := s.started("gone")
	first, _ := s.find(name)
	Sh(t, b, name, "nohup sleep 600 >/dev/null 2>&1 &")
	if err := b.Destroy(t.Context(), name); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, ok := s.find(name); ok {
		t.Fatal("List still has the destroyed sandbox")
	}
	if _, err := b.Exec(t.Context(), name, backend.ExecOptions{Argv: []string{"true"}}); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Exec after Destroy: %v, want ErrNotFound", err)
	}
	if err := b.Destroy(t.Context(), name); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("second Destroy: %v, want ErrNotFound", err)
	}
	again, err := b.Create(t.Context(), s.options(name))
	if err != nil {
		t.Fatal(err)
	}
	if again.UUID == first.UUID || again.Running {
		t.Fatalf("a re-created sandbox: %+v (old uuid %s)", again, first.UUID)
	}
}

// testDestroyGivesTheTurnAway: a holder of the broker's turn that
// destroys a sandbox lets the next holder run before the sandbox's files
// are gone (the sandbox chose how many there are).
func testDestroyGivesTheTurnAway(s *suite) {
	t, b := s.t, s.b
	name := s.started("turn")
	ex := &serial.Executor{}
	holding := make(chan struct{})
	var destroyed atomic.Bool
	errc := make(chan error, 1)
	go ex.Run(t.Context(), func(ctx context.Context) {
		close(holding)
		// The other holder is in line before the destroy starts.
		for ex.Waiting() == 0 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		err := b.Destroy(ctx, name)
		destroyed.Store(true)
		errc <- err
	})
	<-holding
	// The destroy returns only once it has the turn back, so this runs
	// before it returns exactly when the destroy gave the turn away.
	var during bool
	if err := ex.Run(t.Context(), func(context.Context) { during = !destroyed.Load() }); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if !during {
		t.Fatal("no other holder had the turn until the destroy had removed the sandbox")
	}
	if _, ok := s.find(name); ok {
		t.Fatal("List still has the destroyed sandbox")
	}
}

func testUnknown(s *suite) {
	t, b := s.t, s.b
	name := Name(t, "never")
	ctx := t.Context()
	checks := map[string]error{
		"Start":        b.Start(ctx, name),
		"Stop":         b.Stop(ctx, name),
		"Destroy":      b.Destroy(ctx, name),
		"AttachSocket": b.AttachSocket(ctx, name, backend.OrchestrationSocket, t.TempDir()),
		"DetachSocket": b.DetachSocket(ctx, name, backend.OrchestrationSocket),
		"AttachModel":  b.AttachSocket(ctx, name, backend.ModelSocket, t.TempDir()),
		"DetachModel":  b.DetachSocket(ctx, name, backend.ModelSocket),
	}
	_, checks["Exec"] = b.Exec(ctx, name, backend.ExecOptions{Argv: []string{"true"}})
	for op, err := range checks {
		if !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("%s on an unknown sandbox: err = %v, want ErrNotFound", op, err)
		}
	}
}
