package broker_test

// Units across stop and start, broker restarts and broker crashes, and
// what a starting broker repairs.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// pidsOf are the pids of the processes whose command line has marker,
// less those whose parent has it too: a shell's child between its fork
// and its exec (the loop's date, mv or sleep) still shows the shell's
// command line, and comes and goes. Such a child may also have ended and
// been reaped between the scan and the look at its parent: a process
// whose parent can no longer be read is gone, and not counted.
func pidsOf(marker string) []int {
	ps := processesOf(-1, marker)
	marked := map[int]bool{}
	for _, p := range ps {
		marked[p.pid] = true
	}
	var out []int
	for _, p := range ps {
		if parent := parentPID(p.pid); parent != 0 && !marked[parent] {
			out = append(out, p.pid)
		}
	}
	slices.Sort(out)
	return out
}

// parentPID is pid's parent (0 when it cannot be read).
func parentPID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// assertSandboxProcess checks that the processes with marker run as the
// sandbox's unprivileged host uid (never as host root).
func assertSandboxProcess(t testing.TB, marker string, uid int) {
	t.Helper()
	ps := processesOf(-1, marker)
	if len(ps) == 0 {
		t.Fatalf("no process has %s", marker)
	}
	for _, p := range ps {
		if (uid >= 0 && p.uid != uid) || (os.Geteuid() == 0 && p.uid == 0) {
			t.Fatalf("process %d (%s) runs as uid %d, want %d", p.pid, p.cmdline, p.uid, uid)
		}
	}
}

// insideInbox runs the inbox client inside a sandbox (it reaches the
// broker through the socket dir bound in the unit) and returns the origin
// ids of the unread messages it lists.
func (e *testEnv) insideInbox(name string) string {
	e.t.Helper()
	out := e.mustExec(name, "jailbee", "inbox", "ls", "--json")
	var items []wire.MessageItem
	if err := json.Unmarshal([]byte(out), &items); err != nil {
		e.t.Fatalf("inbox ls inside %s: %v\n%s", name, err, out)
	}
	return strings.Join(originIDs(items), ",")
}

func TestAdminStopStart(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	uid := e.hostUID("kid")
	marker := randomMarker(t)
	hb := e.homeFile("kid", "hb")
	if res, err := e.execIn("kid", "", backgroundHeartbeat(marker)...); err != nil || res.exit != 0 {
		t.Fatalf("start the loop: %+v, %v", res, err)
	}
	waitHeartbeat(t, hb)
	assertSandboxProcess(t, marker, uid)
	e.mustExec("kid", "sh", "-c", "echo work > kept && echo home > ~/kept")

	if err := e.admin("stop", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatal(err)
	}
	// Stop returns once every process of the unit is gone.
	if ps, _ := e.sandboxProcesses("kid", uid); len(ps) > 0 {
		t.Fatalf("processes of kid after stop: %v", ps)
	}
	if ps := processesOf(-1, marker); len(ps) > 0 {
		t.Fatalf("the loop runs after stop: %v", ps)
	}
	if got := e.info("kid"); got.State != store.StateStopped || got.Running || got.Socket == nil {
		t.Fatalf("ls after stop: %+v", got)
	}
	assertNoHeartbeat(t, hb)
	// Stopping again is no error; the orchestrator is untouched.
	if err := e.admin("stop", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if got := e.info("orch"); got.State != store.StateRunning || !got.Running {
		t.Fatalf("orch after kid's stop: %+v", got)
	}
	// A stopped child still gets its messages.
	sendMessage(t, e.client("orch"), map[string]any{"id": "while-stopped", "to": "kid", "body": "later"})

	if err := e.admin("start", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := e.info("kid"); got.State != store.StateRunning || !got.Running {
		t.Fatalf("ls after start: %+v", got)
	}
	if got := e.mustExec("kid", "sh", "-c", "cat kept ~/kept"); got != "work\nhome" {
		t.Fatalf("files after start: %q", got)
	}
	if ps := processesOf(-1, marker); len(ps) > 0 {
		t.Fatalf("the loop came back with start: %v", ps)
	}
	if got := e.insideInbox("kid"); got != "while-stopped" {
		t.Fatalf("inbox inside kid after start: %s", got)
	}
	if err := e.admin("start", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatalf("second start: %v", err)
	}

	for _, op := range []string{"start", "stop"} {
		err := e.admin(op, wire.NameArgs{Name: "nope"}, nil)
		wantWireError(t, op+" of a missing sandbox", err, wire.CodeNotFound, "no sandbox named nope")
	}
}

func TestUnitKeepsRunningAcrossBrokerRestart(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	marker := randomMarker(t)
	hb := e.homeFile("kid", "hb")
	e.mustExec("kid", backgroundHeartbeat(marker)...)
	waitHeartbeat(t, hb)
	pids := pidsOf(marker)
	sockBefore := e.sock("kid")

	e.stop()
	// No broker: the unit runs on.
	waitHeartbeat(t, hb)
	if got := pidsOf(marker); !slices.Equal(got, pids) {
		t.Fatalf("the loop's processes changed while the broker was down: %v -> %v", pids, got)
	}

	e.start()
	if e.sock("kid") != sockBefore {
		t.Fatalf("socket moved across the restart: %s -> %s", sockBefore, e.sock("kid"))
	}
	if got := e.info("kid"); got.State != store.StateRunning || !got.Running {
		t.Fatalf("ls after the restart: %+v", got)
	}
	// The reopened broker serves the sandbox's socket, from the host and
	// from inside the unit that kept running.
	sendMessage(t, e.client("orch"), map[string]any{"id": "after", "to": "kid", "body": "hello"})
	if got := unread(t, e.client("kid")); len(got) != 1 || got[0].OriginID != "after" {
		t.Fatalf("kid's inbox after the restart: %+v", got)
	}
	if got := e.insideInbox("kid"); got != "after" {
		t.Fatalf("inbox inside kid after the restart: %s", got)
	}
	waitHeartbeat(t, hb)
	if got := pidsOf(marker); !slices.Equal(got, pids) {
		t.Fatalf("the loop's processes changed across the restart: %v -> %v", pids, got)
	}
}

func TestUnitSurvivesBrokerProcessKill(t *testing.T) {
	bin, state, repo := jailbeeBin(t), shortTempDir(t), makeRepo(t)
	p := startProcBroker(t, bin, state)
	p.newSandbox(wire.NewArgs{Name: "orch", Repo: repo, Role: "orchestrator"})
	marker := randomMarker(t)
	hb := filepath.Join(state, "sandboxes", "orch", "home", "hb")
	if res, err := adminExec(t, p.adminPath(), "orch", "", backgroundHeartbeat(marker)...); err != nil || res.exit != 0 {
		t.Fatalf("start the loop: %+v, %v", res, err)
	}
	waitHeartbeat(t, hb)
	assertSandboxProcess(t, marker, -1)
	pids := pidsOf(marker)

	p.kill9()
	waitHeartbeat(t, hb)
	if got := pidsOf(marker); !slices.Equal(got, pids) {
		t.Fatalf("the loop's processes changed when the broker was killed: %v -> %v", pids, got)
	}

	p = startProcBroker(t, bin, state)
	if got := listAll(t, p.client("orch")); len(got.Items) != 0 {
		t.Fatalf("orch's inbox: %+v", got)
	}
	// `jailbee exec` through the restarted broker: streams and status.
	cmd := exec.Command(bin, "exec", "--state", state, "orch", "--", "sh", "-c", "cat; echo err >&2; exit 3")
	cmd.Stdin = strings.NewReader("piped\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || stdout.String() != "piped\n" || stderr.String() != "err\n" {
		t.Fatalf("jailbee exec: %v, stdout %q, stderr %q\n%s", err, stdout.String(), stderr.String(), p.stderr)
	}
	out, err := exec.Command(bin, "exec", "--state", state, "orch", "--", "jailbee", "inbox", "ls", "--json").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "[]" {
		t.Fatalf("jailbee exec of the inbox client: %v, %q", err, out)
	}
	waitHeartbeat(t, hb)
	if got := pidsOf(marker); !slices.Equal(got, pids) {
		t.Fatalf("the loop's processes changed across the broker's restart: %v -> %v", pids, got)
	}
}

// TestServeRemovesInterruptedCreate: a sandbox recorded "creating" is a
// create a broker did not finish; the next broker removes it, unit and
// all, before it serves.
func TestServeRemovesInterruptedCreate(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.stop()

	// What a broker killed between the steps of a create leaves: a
	// sandbox in the backend (its unit started), a socket dir, and a row
	// in state creating; and a row whose backend sandbox never came.
	ctx := context.Background()
	st, err := store.Open(filepath.Join(e.state, broker.DBFile))
	if err != nil {
		t.Fatal(err)
	}
	uid := spareHostUID(t)
	if uid != 0 {
		if err := st.ClaimHostUID(ctx, uid); err != nil {
			t.Fatal(err)
		}
	}
	be := e.openBackend()
	inst, err := be.Create(ctx, backend.CreateOptions{Name: "half", HostUID: uid})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, store.Sandbox{Name: "half", UUID: inst.UUID, Role: wire.RoleOrchestrator,
		Branch: "main", Repo: e.repo, State: store.StateCreating, HostUID: uid}); err != nil {
		t.Fatal(err)
	}
	sockDir := filepath.Join(e.state, broker.SockDir, inst.UUID+".0123456789abcdef")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := st.ClaimSocketDir(ctx, "half", sockDir); err != nil {
		t.Fatal(err)
	}
	if err := be.AttachSocket(ctx, "half", backend.OrchestrationSocket, sockDir); err != nil {
		t.Fatal(err)
	}
	if err := be.Start(ctx, "half"); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, store.Sandbox{Name: "nounit", UUID: "no-backend-uuid", Role: wire.RoleOrchestrator,
		Branch: "main", Repo: e.repo, State: store.StateCreating}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if insts, _ := be.List(ctx); len(insts) != 2 || !slices.ContainsFunc(insts, func(in backend.Instance) bool { return in.Name == "half" && in.Running }) {
		t.Fatalf("backend before the restart: %+v", insts)
	}

	e.start()
	if got := e.list(); len(got) != 1 || got[0].Name != "orch" || !got[0].Running {
		t.Fatalf("ls after the restart: %+v", got)
	}
	for _, name := range []string{"half", "nounit"} {
		if _, err := e.b.Store().Sandbox(ctx, name); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s after the restart: %v", name, err)
		}
	}
	tr := trace{name: "half", uuid: inst.UUID, sockDir: sockDir}
	if !onIncus() {
		tr.uid = uidOr(uid)
	}
	e.assertGone(tr)
	if n := strings.Count(e.logs.String(), "removing a sandbox whose create or destroy was interrupted"); n != 2 {
		t.Fatalf("the removals were logged %d times, want 2:\n%s", n, e.logs)
	}
	// The survivor is served; the name is free again.
	if got := unread(t, e.client("orch")); len(got) != 0 {
		t.Fatalf("orch's inbox: %+v", got)
	}
	e.orchestrator("half")
}

// uidOr is uid, or this process's uid for 0 (sandboxes of a broker that
// is not root).
func uidOr(uid int) int {
	if uid == 0 {
		return os.Getuid()
	}
	return uid
}

// TestServeStartsUnitsRecordedRunning: a unit that died while no broker
// ran (a reboot, a kill) is started by the next broker if its sandbox is
// recorded running, and left alone if it is recorded stopped.
func TestServeStartsUnitsRecordedRunning(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	e.child("idle", "orch")
	if err := e.admin("stop", wire.NameArgs{Name: "idle"}, nil); err != nil {
		t.Fatal(err)
	}
	e.mustExec("kid", "sh", "-c", "echo kept > ~/kept")
	e.stop()
	be := e.openBackend()
	for _, name := range []string{"kid", "orch"} { // started at once (unitStartsAtOnce)
		if err := be.Stop(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}

	e.start()
	for _, name := range []string{"kid", "orch"} {
		if got := e.info(name); got.State != store.StateRunning || !got.Running {
			t.Fatalf("%s after the restart: %+v", name, got)
		}
	}
	if got := e.info("idle"); got.State != store.StateStopped || got.Running {
		t.Fatalf("idle after the restart: %+v", got)
	}
	if !strings.Contains(e.logs.String(), `msg="sandbox recorded running is not: starting it" sandbox=kid`) {
		t.Fatalf("the start was not logged:\n%s", e.logs)
	}
	if got := e.mustExec("kid", "cat", "/home/agent/kept"); got != "kept" {
		t.Fatalf("kid's home after the restart: %q", got)
	}
	sendMessage(t, e.client("orch"), map[string]any{"id": "m-1", "to": "kid", "body": "hello"})
	if got := e.insideInbox("kid"); got != "m-1" {
		t.Fatalf("inbox inside kid: %s", got)
	}
}
