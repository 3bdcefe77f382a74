package broker_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/incus"
	"agentbox/internal/backend/incus/incustest"
	"agentbox/internal/backend/local"
	"agentbox/internal/broker"
	"agentbox/internal/cgroup"
	"agentbox/internal/config"
	"agentbox/internal/inbox"
	"agentbox/internal/orchestrate"
	"agentbox/internal/store"
	"agentbox/internal/testutil/agenttest"
	"agentbox/internal/testutil/contain"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// TestMain builds jailbee once (the local backend's launcher and
// supervisor, the client inside sandboxes, and `jailbee broker` for the
// process tests), then runs the tests where a regression cannot damage the
// host: as root, every filesystem but a scratch TMPDIR is read-only.
func TestMain(m *testing.M) {
	contain.Main(m, func() error {
		if err := testbin.Prebuild(); err != nil {
			return err
		}
		return agenttest.Prepare()
	}, testbin.Cleanup)
}

// testEnv is a real broker on a temp state dir with the real local
// (bubblewrap) backend and a real git repository.
type testEnv struct {
	t     testing.TB
	state string
	repo  string
	quota store.Quota // broker.Config.InboxQuota, kept across restarts
	// sandboxes is broker.Config.Sandboxes, kept across restarts.
	sandboxes orchestrate.Sandboxes
	b         *broker.Broker
	be        *recBackend
	logs      *wait.Buffer // everything every broker of the env logged
	// incusProject, when set, runs the env's sandboxes on Incus in that
	// project instead of on the local backend (newIncusTestEnv).
	incusProject string
	// model is broker.Config.Model; agentBins the backend's AgentBinaries
	// (both kept across restarts).
	model     *broker.ModelConfig
	agentBins map[string]string
	// egress is broker.Config.Egress (kept across restarts).
	egress orchestrate.EgressHook
	// caps is broker.Config.Caps (kept across restarts).
	caps orchestrate.Caps
	// treeMaxConns is broker.Config.TreeMaxConns (kept across restarts).
	treeMaxConns int
	// egressHeadTimeout is broker.Config.EgressHeadTimeout.
	egressHeadTimeout time.Duration
	// publish is broker.Config.Publish (kept across restarts).
	publish *orchestrate.Publishing
	// onAttach, when set, runs before each AttachSocket of the backend
	// (kept across restarts).
	onAttach func(name string, socket backend.SocketKind)
}

func newTestEnv(t testing.TB) *testEnv {
	t.Helper()
	return newTestEnvQuota(t, store.Quota{})
}

// newTestEnvQuota is newTestEnv with an inbox quota (zero bounds: the
// broker's defaults).
func newTestEnvQuota(t testing.TB, q store.Quota) *testEnv {
	t.Helper()
	e := newTestEnvStopped(t)
	e.quota = q
	e.start()
	return e
}

// newTestEnvStopped prepares an env without starting its broker. Under
// incustest.BackendEnv=incus its sandboxes are Incus containers: the suite runs
// on both backends from the same test code.
func newTestEnvStopped(t testing.TB) *testEnv {
	t.Helper()
	e := &testEnv{t: t, state: shortTempDir(t), repo: makeRepo(t), sandboxes: testSandboxes(), logs: &wait.Buffer{}}
	e.incusProject = incustest.ProjectFromEnv(t)
	return e
}

// onIncus reports whether the suite runs on Incus (incustest.BackendEnv).
func onIncus() bool { return os.Getenv(incustest.BackendEnv) == incus.Type }

// localOnly skips a test of what only the local backend has (host uids,
// its launcher, its cgroups) when the suite runs on Incus.
func localOnly(t testing.TB, why string) {
	t.Helper()
	if onIncus() {
		t.Skipf("local backend only: %s", why)
	}
}

// noLimits reports whether per-sandbox cgroups cannot be used here (a
// test run that is not root on a cgroup v1 host): sandboxes then run
// without limits, as `jailbee broker --no-limits` would.
func noLimits() bool {
	h, err := cgroup.Detect()
	if err == nil {
		err = h.Usable()
	}
	return err != nil
}

// testSandboxes is what `jailbee broker` runs with by default: the default
// limits and, as root, the default host uid range.
func testSandboxes() orchestrate.Sandboxes {
	def := config.DefaultBroker()
	s := orchestrate.Sandboxes{Limits: def.Limits, NoLimits: noLimits()}
	if os.Geteuid() == 0 {
		s.HostUIDs = &def.SandboxUIDs
	}
	return s
}

// shortTempDir is a temp dir with a short path: socket paths under it must
// fit a Unix socket address (107 bytes), which t.TempDir's long names
// would not. It returns <tmp>/state, not yet created. Every sandbox under
// it is destroyed when the test ends (units outlive brokers and tests).
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "jb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	state := filepath.Join(dir, "state")
	// Cleanups run last in, first out: this one runs after every broker
	// the test starts later was closed or killed, and before the removal.
	t.Cleanup(func() { destroyUnits(t, state) })
	return state
}

// localBackend opens the local backend of the state dir, as a broker does.
func localBackend(t testing.TB, state string) *local.Backend {
	t.Helper()
	be, err := local.New(local.Options{Root: filepath.Join(state, "sandboxes"), Binary: testbin.Jailbee(t), NoLimits: noLimits()})
	if err != nil {
		t.Fatalf("local backend (is bubblewrap installed? scripts/install-deps.sh): %v", err)
	}
	return be
}

// destroyUnits destroys every sandbox of the state dir's backend, then
// checks that no process of any host uid the state dir's brokers ever
// gave a sandbox is left.
func destroyUnits(t testing.TB, state string) {
	if _, err := os.Stat(filepath.Join(state, "sandboxes")); err != nil {
		return
	}
	be := localBackend(t, state)
	ctx := context.Background()
	insts, err := be.List(ctx)
	if err != nil {
		t.Errorf("cleanup: list sandboxes: %v", err)
	}
	for _, in := range insts {
		if err := be.Destroy(ctx, in.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("cleanup: destroy %s: %v", in.Name, err)
		}
	}
	uids := claimedHostUIDs(t, state)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []string
		for _, uid := range uids {
			for _, p := range processesOf(uid, "") {
				left = append(left, fmt.Sprintf("uid %d: %s", uid, p.cmdline))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("cleanup: sandbox processes left after every sandbox was destroyed:\n%s", strings.Join(left, "\n"))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// claimedHostUIDs reads every host uid broker.db ever gave a sandbox.
func claimedHostUIDs(t testing.TB, state string) []int {
	path := filepath.Join(state, broker.DBFile)
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return nil
	}
	defer db.Close()
	rows, err := db.Query(`SELECT uid FROM host_uids`)
	if err != nil {
		t.Errorf("cleanup: host uids: %v", err)
		return nil
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var uid int
		if rows.Scan(&uid) == nil && uid != 0 {
			out = append(out, uid)
		}
	}
	return out
}

// proc is a host process.
type proc struct {
	pid     int
	uid     int
	cmdline string // arguments joined with spaces
}

// processesOf lists the host's processes running as uid (any uid when
// uid < 0) whose command line contains marker ("" matches all).
func processesOf(uid int, marker string) []proc {
	entries, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		puid, ok := procUID(pid)
		if !ok || (uid >= 0 && puid != uid) {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(raw) == 0 {
			continue // gone, or a kernel thread
		}
		cmd := strings.TrimSpace(strings.ReplaceAll(string(raw), "\x00", " "))
		if marker != "" && !strings.Contains(cmd, marker) {
			continue
		}
		out = append(out, proc{pid: pid, uid: puid, cmdline: cmd})
	}
	return out
}

// sandboxProcesses lists the host processes of sandbox name, and whether
// they can be told apart at all: on the local backend those of its host
// uid (not when that is the test's own); on Incus, where every container
// shares one idmap, those in its container's cgroup.
func (e *testEnv) sandboxProcesses(name string, uid int) ([]proc, bool) {
	e.t.Helper()
	if e.incusProject == "" {
		if uid == os.Getuid() {
			return nil, false
		}
		return processesOf(uid, ""), true
	}
	pids := incustest.ContainerPIDs(e.incusProject, name)
	var out []proc
	for _, p := range processesOf(-1, "") {
		if slices.Contains(pids, p.pid) {
			out = append(out, p)
		}
	}
	return out, true
}

// procUID is the real uid of process pid, from its status (the owner of
// /proc/<pid> is root for a process that is not dumpable).
func procUID(pid int) (int, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "Uid:" {
			uid, err := strconv.Atoi(f[1])
			return uid, err == nil
		}
	}
	return 0, false
}

// makeRepo creates a git repository with one commit on main.
func makeRepo(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "repo")
	hostGit(t, "", "init", "-q", "-b", "main", dir)
	hostGit(t, dir, "commit", "-q", "--allow-empty", "-m", "init")
	return dir
}

// hostGit runs git on the host and returns its trimmed output.
func hostGit(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func (e *testEnv) start() {
	e.t.Helper()
	e.be = &recBackend{Backend: e.openBackend(), onAttach: e.onAttach}
	// Info, as a broker runs by default: a debug line per request would
	// weigh on the benchmarks and fill e.logs.
	h := slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelInfo})
	if testing.Verbose() {
		h = slog.NewTextHandler(io.MultiWriter(e.logs, os.Stderr), &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	var be backend.Backend = e.be
	if _, ok := e.be.Backend.(backend.SteppedStarter); ok {
		be = steppedRecBackend{e.be}
	}
	b, err := broker.Open(broker.Config{StateDir: e.state, Backend: be, Logger: slog.New(h),
		Sandboxes: e.sandboxes, InboxQuota: e.quota, Model: e.model, Egress: e.egress, Caps: e.caps, Publish: e.publish,
		TreeMaxConns: e.treeMaxConns, EgressHeadTimeout: e.egressHeadTimeout})
	if err != nil {
		e.t.Fatal(err)
	}
	e.b = b // already while it starts: an onAttach hook may dial a sandbox served before
	if err := b.Serve(); err != nil {
		e.b = nil
		b.Close()
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if e.b == b {
			e.b.Close()
			e.b = nil
		}
	})
}

// openBackend opens the env's backend as its broker does: a handle of its
// own, also for what a test does behind the broker's back.
func (e *testEnv) openBackend() backend.Backend {
	e.t.Helper()
	if e.incusProject == "" {
		be, err := local.New(local.Options{Root: filepath.Join(e.state, "sandboxes"), Binary: testbin.Jailbee(e.t), NoLimits: noLimits(), AgentBinaries: e.agentBins})
		if err != nil {
			e.t.Fatalf("local backend (is bubblewrap installed? scripts/install-deps.sh): %v", err)
		}
		return be
	}
	be, err := incus.New(context.Background(), incus.Options{Project: e.incusProject, Pool: incustest.Pool(), Client: testbin.Jailbee(e.t), AgentBinaries: e.agentBins})
	if err != nil {
		e.t.Fatal(err)
	}
	return be
}

// withT is the env as seen from a subtest: its helpers fail t. The
// subtest must not start or stop the broker.
func (e *testEnv) withT(t testing.TB) *testEnv {
	c := *e
	c.t = t
	return &c
}

// stop closes the broker; sandboxes keep running.
func (e *testEnv) stop() {
	e.t.Helper()
	if err := e.b.Close(); err != nil {
		e.t.Errorf("close broker: %v", err)
	}
	e.b = nil
}

// restart closes the broker and opens a new one on the same state dir.
func (e *testEnv) restart() {
	e.t.Helper()
	e.stop()
	e.start()
}

// adminPath is the admin socket.
func (e *testEnv) adminPath() string { return filepath.Join(e.state, broker.AdminSock) }

// admin runs one admin op and decodes its result.
func (e *testEnv) admin(op string, args, result any) error {
	e.t.Helper()
	return adminCall(e.t, e.adminPath(), op, args, result)
}

// adminCall runs one admin op on a fresh connection to the admin socket.
func adminCall(t testing.TB, sock, op string, args, result any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := inbox.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.Call(ctx, op, args, result)
}

// orchestrator creates an orchestrator sandbox.
func (e *testEnv) orchestrator(name string) {
	e.t.Helper()
	if err := e.admin("new", wire.NewArgs{Name: name, Repo: e.repo, Role: "orchestrator"}, nil); err != nil {
		e.t.Fatalf("new orchestrator %s: %v", name, err)
	}
}

// oneSlotGrant is the default grant with max_running_children 1.
const oneSlotGrant = `{"version":1,"max_running_children":1,"operations":["destroy","import","message","restart","rights","spawn","stop"],"grantable":{"mounts":[],"loose":false,"egress":[]},"default_runner":null,"default_runner_source":null}`

// orchestratorOneSlot creates an orchestrator whose grant lets one child
// run at a time.
func (e *testEnv) orchestratorOneSlot(name string) {
	e.t.Helper()
	if err := e.admin("new", wire.NewArgs{Name: name, Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(oneSlotGrant)}, nil); err != nil {
		e.t.Fatalf("new orchestrator %s: %v", name, err)
	}
}

// child creates a child of parent on branch "work/<name>".
func (e *testEnv) child(name, parent string) {
	e.t.Helper()
	if err := e.admin("new", wire.NewArgs{Name: name, Repo: e.repo, Branch: "work/" + name, Role: "child", Parent: parent}, nil); err != nil {
		e.t.Fatalf("new child %s: %v", name, err)
	}
}

// list runs the admin ls.
func (e *testEnv) list() []wire.SandboxInfo {
	e.t.Helper()
	var list []wire.SandboxInfo
	if err := e.admin("ls", nil, &list); err != nil {
		e.t.Fatal(err)
	}
	return list
}

// info is one sandbox's ls entry.
func (e *testEnv) info(name string) wire.SandboxInfo {
	e.t.Helper()
	for _, sb := range e.list() {
		if sb.Name == name {
			return sb
		}
	}
	e.t.Fatalf("ls has no sandbox %s", name)
	return wire.SandboxInfo{}
}

// row is a sandbox's broker.db row.
func (e *testEnv) row(name string) store.Sandbox {
	e.t.Helper()
	sb, err := e.b.Store().Sandbox(context.Background(), name)
	if err != nil {
		e.t.Fatalf("sandbox %s: %v", name, err)
	}
	return sb
}

// hostUID is the host uid a sandbox's agent processes run as: on the
// local backend its own as root, the test's otherwise; on Incus the agent
// uid through the container's idmap (which every container shares).
func (e *testEnv) hostUID(name string) int {
	e.t.Helper()
	if e.incusProject != "" {
		return incustest.HostUID(e.t, e.incusProject, name, backend.AgentUID)
	}
	if uid := e.row(name).HostUID; uid != 0 {
		return uid
	}
	return os.Getuid()
}

// homeFile is the host path of a file in a sandbox's home.
func (e *testEnv) homeFile(name, file string) string {
	if e.incusProject != "" {
		return filepath.Join(incustest.RootFS(e.incusProject, name), incus.HomePath, file)
	}
	return filepath.Join(e.state, "sandboxes", name, "home", file)
}

// sock returns the host path of a sandbox's broker socket.
func (e *testEnv) sock(name string) string {
	e.t.Helper()
	p := e.b.SocketPath(name)
	if p == "" {
		e.t.Fatalf("sandbox %s has no socket", name)
	}
	return p
}

// client dials a sandbox's socket: the connection speaks as that sandbox.
func (e *testEnv) client(name string) *inbox.Client {
	e.t.Helper()
	c, err := inbox.Dial(context.Background(), e.sock(name))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// rawConn is a plain socket connection for framing tests.
type rawConn struct {
	net.Conn
	r *bufio.Reader
}

func (e *testEnv) raw(name string) *rawConn {
	e.t.Helper()
	return dialRaw(e.t, e.sock(name))
}

// dialRaw connects to a socket for hand-written lines.
func dialRaw(t testing.TB, path string) *rawConn {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawConn{Conn: conn, r: bufio.NewReader(conn)}
}

// reply reads one reply line (failing the test after the hang guard).
func (c *rawConn) reply(t testing.TB) wire.Response {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(wait.Guard))
	defer c.SetReadDeadline(time.Time{})
	line, err := wire.ReadLine(c.r, wire.MaxLineBytes)
	if err != nil {
		t.Fatalf("read reply: %v", err)
	}
	var resp wire.Response
	if err := json.Unmarshal(line, &resp); err != nil {
		t.Fatalf("reply %q: %v", line, err)
	}
	return resp
}

// closed reports whether the broker closed the connection (EOF within the
// hang guard).
func (c *rawConn) closed() bool {
	c.SetReadDeadline(time.Now().Add(wait.Guard))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.r.ReadByte()
	return err == io.EOF
}

// sendMessage sends a message manifest and returns the first status.
func sendMessage(t testing.TB, c *inbox.Client, m map[string]any) wire.StatusItem {
	t.Helper()
	m["version"], m["type"] = 1, "message"
	var st wire.StatusItem
	if err := c.Call(context.Background(), "send", map[string]any{"manifest": m}, &st); err != nil {
		t.Fatalf("send %v: %v", m["id"], err)
	}
	return st
}

// unread lists a sandbox's unread items.
func unread(t testing.TB, c *inbox.Client) []wire.MessageItem {
	t.Helper()
	var res struct {
		Items []wire.MessageItem `json:"items"`
	}
	if err := c.Call(context.Background(), "list", nil, &res); err != nil {
		t.Fatal(err)
	}
	return res.Items
}

func backendOf(t testing.TB, e *testEnv) backend.Backend { return e.b.BackendForTest() }

// setSocketDirForTest rewrites a sandbox's recorded socket dir while the
// broker is stopped.
func setSocketDirForTest(t testing.TB, e *testEnv, name, dir string) {
	t.Helper()
	s, err := store.Open(filepath.Join(e.state, broker.DBFile))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetSocketDirForTest(context.Background(), name, dir); err != nil {
		t.Fatal(err)
	}
}

// execResult is what an admin exec gave back.
type execResult struct {
	exit           int
	stdout, stderr string
}

// execIn runs argv in a sandbox through the admin exec op, with stdin as
// its input and pipes for its output.
func (e *testEnv) execIn(name, stdin string, argv ...string) (execResult, error) {
	e.t.Helper()
	return adminExec(e.t, e.adminPath(), name, stdin, argv...)
}

// mustExec is execIn that fails the test unless the command exits 0.
func (e *testEnv) mustExec(name string, argv ...string) string {
	e.t.Helper()
	res, err := e.execIn(name, "", argv...)
	if err != nil || res.exit != 0 {
		e.t.Fatalf("exec %v in %s: %v, exit %d\nstdout: %s\nstderr: %s", argv, name, err, res.exit, res.stdout, res.stderr)
	}
	return strings.TrimSpace(res.stdout)
}

// adminExec is the admin exec op as `jailbee exec` sends it: the request
// line with the command's stdin, stdout and stderr (pipes) as SCM_RIGHTS.
func adminExec(t testing.TB, sock, name, stdin string, argv ...string) (execResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := inbox.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := newExecPipes(t, stdin)
	var res wire.ExecResult
	err = c.CallFiles(ctx, "exec", wire.ExecArgs{Name: name, Argv: argv}, p.child(), &res)
	out, errOut := p.finish()
	return execResult{exit: res.Exit, stdout: out, stderr: errOut}, err
}

// execPipes are a command's three pipes: the child ends are sent, ours
// feed stdin and collect stdout and stderr.
type execPipes struct {
	inR, outW, errW *os.File
	wg              sync.WaitGroup
	out, errOut     bytes.Buffer
}

func newExecPipes(t testing.TB, stdin string) *execPipes {
	t.Helper()
	p := &execPipes{}
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.inR, p.outW, p.errW = inR, outW, errW
	go func() {
		io.WriteString(inW, stdin)
		inW.Close()
	}()
	for _, c := range []struct {
		r   *os.File
		buf *bytes.Buffer
	}{{outR, &p.out}, {errR, &p.errOut}} {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			io.Copy(c.buf, c.r)
			c.r.Close()
		}()
	}
	return p
}

func (p *execPipes) child() []*os.File { return []*os.File{p.inR, p.outW, p.errW} }

// finish closes the child ends (the broker has its copies once the request
// was written) and waits for the output to end.
func (p *execPipes) finish() (stdout, stderr string) {
	p.inR.Close()
	p.outW.Close()
	p.errW.Close()
	p.wg.Wait()
	return p.out.String(), p.errOut.String()
}

// wantWireError fails unless err is a *wire.Error with code and detail.
func wantWireError(t testing.TB, what string, err error, code wire.Code, detail string) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code || we.Detail != detail {
		t.Fatalf("%s: got %v (%#v),\nwant %s %q", what, err, we, code, detail)
	}
}

// recBackend is the env's local backend, recording the uuid of every
// sandbox it created, so a test can check that nothing of a refused or
// failed create is left (its cgroups are named by uuid).
type recBackend struct {
	backend.Backend
	mu       sync.Mutex
	uuids    []string
	onAttach func(name string, socket backend.SocketKind)
}

// steppedRecBackend is recBackend over a backend.SteppedStarter, which
// recBackend's embedded interface would hide: the broker then runs its
// start's last step out of line, as it does on the bare backend.
type steppedRecBackend struct{ *recBackend }

func (r steppedRecBackend) StartUnit(ctx context.Context, name string) error {
	return r.Backend.(backend.SteppedStarter).StartUnit(ctx, name)
}

func (r steppedRecBackend) FinishStart(ctx context.Context, name string) error {
	return r.Backend.(backend.SteppedStarter).FinishStart(ctx, name)
}

func (r *recBackend) AttachSocket(ctx context.Context, name string, socket backend.SocketKind, dir string) error {
	if r.onAttach != nil {
		r.onAttach(name, socket)
	}
	return r.Backend.AttachSocket(ctx, name, socket, dir)
}

func (r *recBackend) Create(ctx context.Context, opts backend.CreateOptions) (backend.Instance, error) {
	in, err := r.Backend.Create(ctx, opts)
	if err == nil {
		r.mu.Lock()
		r.uuids = append(r.uuids, in.UUID)
		r.mu.Unlock()
	}
	return in, err
}

// created returns the uuids of every sandbox created so far.
func (r *recBackend) created() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.uuids...)
}

// cgroupDirs are the directories a sandbox's cgroups would have, or nil
// without cgroups.
func cgroupDirs(t testing.TB, uuid string) []string {
	t.Helper()
	if noLimits() {
		return nil
	}
	h, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range []string{"pids", "memory", "cpu", "freezer"} {
		if m := h.Mountpoint(c); m != "" {
			out = append(out, filepath.Join(m, cgroup.Parent, uuid))
		}
	}
	return out
}
