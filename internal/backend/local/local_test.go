package local_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/local"
	"agentbox/internal/serial"
	"agentbox/internal/testutil/contain"
	"agentbox/internal/testutil/testbin"
)

// TestMain builds jailbee (the launcher, supervisor and client), then runs
// the tests where a regression cannot damage the host (contain).
func TestMain(m *testing.M) { contain.Main(m, testbin.Prebuild, testbin.Cleanup) }

// testLimits are small enough to hit in tests, big enough for git.
var testLimits = backend.Limits{Pids: 256, MemoryBytes: 512 << 20, CPUWeight: 100}

func newBackend(t *testing.T) *local.Backend {
	t.Helper()
	return newBackendWith(t, nil)
}

// newBackendWith is newBackend with agent binaries on its sandboxes' PATH.
func newBackendWith(t *testing.T, agents map[string]string) *local.Backend {
	t.Helper()
	b, err := local.New(local.Options{Root: filepath.Join(t.TempDir(), "sandboxes"), Binary: testbin.Jailbee(t), AgentBinaries: agents})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	return b
}

// hostUID picks a host uid for a sandbox as a root broker does: random in
// a range no account uses.
func hostUID(t testing.TB) int {
	if os.Geteuid() != 0 {
		return 0
	}
	var b [4]byte
	rand.Read(b[:])
	return 1<<30 + int(binary.LittleEndian.Uint32(b[:])%(1<<20))
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend { return newBackend(t) },
		backendtest.Options{HostUID: hostUID, Limits: testLimits, AgentOnly: true, AttachAtStart: true,
			WithAgents: func(t *testing.T, agents map[string]string) backend.Backend { return newBackendWith(t, agents) }})
}

// What follows is the sandbox seen from inside and from the host, ported
// from the tests of the design where the sandbox ran as host root.

func TestSystemIsReadOnly(t *testing.T) {
	f := newFixture(t)
	x := f.start("ro", testLimits)
	probe := "/usr/agentbox-write-probe-" + randomHex(t)
	for _, script := range []string{
		"touch " + probe, "touch /etc/passwd", "mkdir /newdir", "touch /run/jailbee/bin/jailbee",
		"touch /run/jailbee/bin/other", "echo x > /proc/sys/kernel/hostname",
	} {
		if r := sh(t, f.b, x.name, script); r.Code == 0 {
			t.Errorf("%q succeeded inside", script)
		}
	}
	if _, err := os.Lstat(probe); err == nil {
		t.Fatal("the probe reached the host's /usr")
	}
	// The tools still run: the system is there, only read-only.
	if got := mustSh(t, f.b, x.name, "ls /usr/bin >/dev/null && test -d /bin && git --version >/dev/null && echo usable"); got != "usable" {
		t.Fatalf("system dirs: %q", got)
	}
}

func TestHostEtcIsHidden(t *testing.T) {
	if _, err := os.Stat("/etc/shadow"); err != nil {
		t.Fatalf("this test needs a host /etc/shadow: %v", err)
	}
	f := newFixture(t)
	x := f.start("etc", testLimits)
	if r := sh(t, f.b, x.name, "cat /etc/shadow"); r.Code == 0 || r.Stdout != "" {
		t.Errorf("read /etc/shadow inside: %+v", r)
	}
	want := "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"
	if got := mustSh(t, f.b, x.name, "cat /etc/passwd"); got != want {
		t.Errorf("/etc/passwd inside is not the generated one: %q", got)
	}
	if got := mustSh(t, f.b, x.name, "hostname; id -un; cat /etc/hostname"); got != x.name+"\nagent\n"+x.name {
		t.Errorf("hostname, user: %q", got)
	}
	// Only the generated files and the few harmless host ones.
	allowed := map[string]bool{}
	for _, n := range strings.Fields("passwd group hosts hostname nsswitch.conf alternatives ld.so.cache ld.so.conf ld.so.conf.d localtime resolv.conf ssl ca-certificates.conf gitconfig protocols services mime.types") {
		allowed[n] = true
	}
	for _, n := range strings.Fields(mustSh(t, f.b, x.name, "ls -A /etc")) {
		if !allowed[n] {
			t.Errorf("/etc/%s is visible inside", n)
		}
	}
}

func TestEnvironmentIsCleared(t *testing.T) {
	t.Setenv("AGENTBOX_HOST_SECRET", "leak")
	t.Setenv("TERM", "xterm-test")
	f := newFixture(t)
	x := f.start("env", testLimits)
	r, err := run(t, f.b, x.name, backend.ExecOptions{Argv: []string{"env"}, Env: map[string]string{"EXTRA": "1"}})
	if err != nil || r.Code != 0 {
		t.Fatalf("env: %+v, %v", r, err)
	}
	got := strings.Fields(r.Stdout)
	slices.Sort(got)
	// Nothing of the host's: the base and the proxy variables (the
	// egress relay: docs/egress.md).
	want := []string{"EXTRA=1", "HOME=/home/agent",
		"HTTPS_PROXY=http://127.0.0.1:3128", "HTTP_PROXY=http://127.0.0.1:3128",
		"LANG=C.UTF-8", "NO_PROXY=localhost,127.0.0.1,::1",
		"PATH=/run/jailbee/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "USER=agent",
		"http_proxy=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128", "no_proxy=localhost,127.0.0.1,::1"}
	if !slices.Equal(got, want) {
		t.Fatalf("environment inside = %q, want exactly %q", got, want)
	}
}

func TestPrivatePIDNamespace(t *testing.T) {
	f := newFixture(t)
	x := f.start("pidns", testLimits)
	lines := strings.Fields(mustSh(t, f.b, x.name, `cat /proc/1/comm; echo $$; ls /proc | grep -c '^[0-9]'`))
	if len(lines) != 3 || lines[0] != "jailbee" {
		t.Fatalf("inside: %q, want pid 1 to be the supervisor", lines)
	}
	if pid, _ := strconv.Atoi(lines[1]); pid < 2 || pid > 100 {
		t.Errorf("the command's pid inside is %s, want a fresh namespace's", lines[1])
	}
	// The supervisor, sh, ls and grep.
	if n, _ := strconv.Atoi(lines[2]); n > 4 {
		t.Errorf("%d processes visible inside, want only the sandbox's", n)
	}
}

func TestHostAbstractSocketUnreachable(t *testing.T) {
	f := newFixture(t)
	x := f.start("abstract", testLimits)
	addr := "@agentbox-test-" + randomHex(t)
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	ops := serveFakeBroker(t, ln)
	// Control: from the host the same client reaches it.
	cmd := exec.Command(testbin.Jailbee(t), "inbox", "ls")
	cmd.Env = []string{"JAILBEE_ORCHESTRATION_SOCKET=" + addr}
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), fakeItem) {
		t.Fatalf("host control: %q, %v", out, err)
	}
	<-ops
	r, err := run(t, f.b, x.name, backend.ExecOptions{Argv: []string{"jailbee", "inbox", "ls"}, Env: map[string]string{"JAILBEE_ORCHESTRATION_SOCKET": addr}})
	if err != nil || r.Code == 0 || strings.Contains(r.Stdout, fakeItem) {
		t.Fatalf("the sandbox reached a host abstract socket: %+v, %v", r, err)
	}
	select {
	case op := <-ops:
		t.Fatalf("the host socket got %q from inside", op)
	default:
	}
}

func TestSocketReachableWithClientOnPath(t *testing.T) {
	f := newFixture(t)
	x := f.create("sock", testLimits)
	dir, ops := fakeBrokerDir(t)
	if err := f.b.AttachSocket(t.Context(), x.name, backend.OrchestrationSocket, dir); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Start(t.Context(), x.name); err != nil {
		t.Fatal(err)
	}
	got := mustSh(t, f.b, x.name, "command -v jailbee; jailbee inbox ls")
	if want := local.ClientBinDir + "/" + local.ClientName + "\nmsg-0001  message  from lead  note: " + fakeItem; got != want {
		t.Fatalf("the client inside: %q, want %q", got, want)
	}
	select {
	case op := <-ops:
		if op != "list" {
			t.Fatalf("the broker got op %q, want list", op)
		}
	case <-time.After(hangGuard):
		t.Fatal("the broker got no request")
	}
	sock := backend.SocketMountPath + "/" + local.SocketFile
	if got := mustSh(t, f.b, x.name, "test -S "+sock+" && echo socket; touch "+backend.SocketMountPath+"/x 2>/dev/null || echo read-only"); got != "socket\nread-only" {
		t.Fatalf("socket dir inside: %q", got)
	}
}

func TestStateSurvivesReopen(t *testing.T) {
	f := newFixture(t)
	x := f.create("reopen", testLimits)
	dir, _ := fakeBrokerDir(t)
	if err := f.b.AttachSocket(t.Context(), x.name, backend.OrchestrationSocket, dir); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Start(t.Context(), x.name); err != nil {
		t.Fatal(err)
	}
	before, err := f.b.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	b2 := openBackend(t, f.root)
	after, err := b2.List(t.Context())
	if err != nil || len(after) != 1 || !reflect.DeepEqual(after[0], before[0]) || !after[0].Running {
		t.Fatalf("after reopen List = %+v, %v; want %+v running", after, err, before)
	}
	if got := mustSh(t, b2, x.name, "jailbee inbox ls"); !strings.Contains(got, fakeItem) {
		t.Fatalf("socket after reopen: %q", got)
	}
	if err := b2.Stop(t.Context(), x.name); err != nil {
		t.Fatal(err)
	}
	if list, _ := f.b.List(t.Context()); len(list) != 1 || list[0].Running {
		t.Fatalf("the first backend after the second stopped it: %+v", list)
	}
}

func TestCreateRecoversFromInterruptedCreate(t *testing.T) {
	f := newFixture(t)
	name := backendtest.Name(t, "half")
	// What a crash in the middle of Create leaves: a directory, no metadata.
	if err := os.MkdirAll(filepath.Join(f.root, name, "checkout"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.root, name, "checkout", "stale"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if list, err := f.b.List(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("List shows an unfinished sandbox: %+v, %v", list, err)
	}
	if err := f.b.Start(t.Context(), name); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Start on an unfinished sandbox: %v, want ErrNotFound", err)
	}
	if _, err := f.b.Exec(t.Context(), name, backend.ExecOptions{Argv: []string{"true"}}); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Exec on an unfinished sandbox: %v, want ErrNotFound", err)
	}
	if _, err := f.b.Create(t.Context(), backend.CreateOptions{Name: name, HostUID: f.freshUID(), Limits: testLimits}); err != nil {
		t.Fatalf("Create over an interrupted create: %v", err)
	}
	t.Cleanup(func() { f.b.Destroy(context.Background(), name) })
	if err := f.b.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, f.b, name, "ls -A"); got != "" {
		t.Fatalf("the new checkout holds %q from the interrupted create", got)
	}
}

func TestDestroyRefusesSymlinkedSandboxDir(t *testing.T) {
	f := newFixture(t)
	victim := t.TempDir()
	if err := os.WriteFile(filepath.Join(victim, "precious"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(f.root, "evil")); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Destroy(t.Context(), "evil"); err == nil {
		t.Fatal("Destroy followed a symlinked sandbox dir")
	}
	if err := f.b.Start(t.Context(), "evil"); err == nil {
		t.Fatal("Start of a symlinked sandbox dir succeeded")
	}
	if data, err := os.ReadFile(filepath.Join(victim, "precious")); err != nil || string(data) != "x" {
		t.Fatalf("symlink target damaged: %q, %v", data, err)
	}
	if list, err := f.b.List(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("List = %+v, %v; a symlink is no sandbox", list, err)
	}
}

func TestExecRefusals(t *testing.T) {
	f := newFixture(t)
	x := f.start("refuse", testLimits)
	for _, user := range []string{"root", "0", "65534", "mallory"} {
		if _, err := f.b.Exec(t.Context(), x.name, backend.ExecOptions{Argv: []string{"true"}, User: user}); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("User %q: %v, want ErrUnsupported", user, err)
		}
	}
	for _, user := range []string{"", local.AgentUser, "1000"} {
		if r, err := run(t, f.b, x.name, backend.ExecOptions{Argv: []string{"id", "-u"}, User: user}); err != nil || strings.TrimSpace(r.Stdout) != "1000" {
			t.Errorf("User %q: %+v, %v", user, r, err)
		}
	}
	for what, opts := range map[string]backend.ExecOptions{
		"empty argv":    {},
		"bad env name":  {Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}},
		"empty env key": {Argv: []string{"true"}, Env: map[string]string{"": "x"}},
		"NUL in value":  {Argv: []string{"true"}, Env: map[string]string{"A": "x\x00y"}},
	} {
		if _, err := f.b.Exec(t.Context(), x.name, opts); err == nil {
			t.Errorf("%s: Exec succeeded", what)
		}
	}
}

// TestModelSocketAttachment: the model directory and its socket are given
// the sandbox's uid, like the orchestration socket's; a running sandbox
// keeps what it started with and gets the directory from its next start.
// A sandbox without one writes no model_dir, so its meta.json is as
// older code wrote it (and older ones load as sandboxes without it).
func TestModelSocketAttachment(t *testing.T) {
	f := newFixture(t)
	x := f.start("model", testLimits)
	dir := backendtest.KindDir(t, backend.ModelSocket, "model\n")
	if err := f.b.AttachSocket(t.Context(), x.name, backend.ModelSocket, dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "anthropic.sock")} {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || int(st.Uid) != x.uid || int(st.Gid) != x.uid {
			t.Fatalf("%s: owner %d:%d, %v; want the sandbox's %d", p, st.Uid, st.Gid, err, x.uid)
		}
	}
	probe := "test -S " + backend.ModelMountPath + "/anthropic.sock && echo there || echo none"
	if got := mustSh(t, f.b, x.name, probe); got != "none" {
		t.Fatalf("a running sandbox got the model directory at once: %q", got)
	}
	if err := f.b.Stop(t.Context(), x.name); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Start(t.Context(), x.name); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, f.b, x.name, probe); got != "there" {
		t.Fatalf("the model directory after a restart: %q", got)
	}

	// No model directory: no model_dir key, as in an older meta.json.
	old := f.create("oldmeta", testLimits)
	data, err := os.ReadFile(filepath.Join(old.dir, "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["model_dir"]; ok {
		t.Fatalf("a sandbox without a model directory records one: %s", data)
	}
	list, err := f.b.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if in.Name == old.name && (in.ModelDir != "" || len(in.Mounts) != 0) {
			t.Fatalf("an older sandbox: %+v", in)
		}
	}
}

// TestAgentBinaryChecks: agent names are plain names (never the client's
// own), and an agent whose binary is gone fails the start naming the
// agent, not the host path.
func TestAgentBinaryChecks(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "secret-host-path-claude")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho ok\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"jailbee", "Claude", "a/b", "..", "-x", ""} {
		_, err := local.New(local.Options{Root: filepath.Join(t.TempDir(), "sandboxes"), Binary: testbin.Jailbee(t), AgentBinaries: map[string]string{name: bin}})
		if err == nil {
			t.Errorf("agent name %q accepted", name)
		}
	}
	b := newBackendWith(t, map[string]string{"claude": bin})
	name := backendtest.Name(t, "noagent")
	if _, err := b.Create(t.Context(), backend.CreateOptions{Name: name, HostUID: hostUID(t), Limits: testLimits}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), name) })
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	err := b.Start(t.Context(), name)
	if err == nil || !strings.Contains(err.Error(), "claude") || strings.Contains(err.Error(), "secret-host-path") {
		t.Fatalf("start without the agent's binary: %v", err)
	}
	if list, _ := b.List(t.Context()); len(list) != 1 || list[0].Running {
		t.Fatalf("after the failed start: %+v", list)
	}
}

// TestDestroyEmptiesOutsideTheTurn: a sandbox decides how many entries
// its tree holds, and a destroy's removal of them ran under the broker's
// turn, so every other request waited for it. The tree now leaves the
// backend's view at once and is emptied outside the turn: another holder
// gets the turn while the removal runs, and the destroy still ends with
// the tree gone.
func TestDestroyEmptiesOutsideTheTurn(t *testing.T) {
	f := newFixture(t)
	x := f.create("flood", testLimits)
	flood := filepath.Join(x.dir, "home", "flood")
	if err := os.Mkdir(flood, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := range 100_000 {
		if err := os.WriteFile(filepath.Join(flood, strconv.Itoa(i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ex := &serial.Executor{}
	var destroyed atomic.Bool
	errc := make(chan error, 1)
	go ex.Run(t.Context(), func(ctx context.Context) {
		err := f.b.Destroy(ctx, x.name)
		destroyed.Store(true)
		errc <- err
	})
	// Once the sandbox is gone from the view, its tree is being emptied.
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(filepath.Join(x.dir, "meta.json")); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox never left the view")
		}
	}
	var during bool
	if err := ex.Run(t.Context(), func(context.Context) { during = !destroyed.Load() }); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if !during {
		t.Fatal("no other holder had the turn until the destroy had emptied the sandbox's tree")
	}
	if _, err := os.Lstat(x.dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox's directory: %v", err)
	}
	if left, err := os.ReadDir(filepath.Join(f.root, ".trash")); err != nil || len(left) != 0 {
		t.Fatalf("the trash after a destroy: %d entries, %v", len(left), err)
	}
}

// TestOpenEmptiesTheTrash: what a crash left half removed in the trash is
// removed when the backend opens.
func TestOpenEmptiesTheTrash(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "sandboxes")
	left := filepath.Join(root, ".trash", "box.X", "home")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	openBackend(t, root)
	if entries, err := os.ReadDir(filepath.Join(root, ".trash")); err != nil || len(entries) != 0 {
		t.Fatalf("the trash after open: %d entries, %v", len(entries), err)
	}
}
