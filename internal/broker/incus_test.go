package broker_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/incus"
	"agentbox/internal/backend/incus/incustest"
	"agentbox/internal/broker"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// newIncusTestEnv is newTestEnv for a test of what only Incus has: it
// runs in the suite's Incus pass (incustest.BackendEnv=incus) and is skipped in
// the local one.
func newIncusTestEnv(t *testing.T) *testEnv {
	t.Helper()
	if !onIncus() {
		t.Skipf("an Incus test: it runs with %s=incus", incustest.BackendEnv)
	}
	return newTestEnv(t)
}

// TestIncusSpawnDoneAndDestroy: the job on Incus containers, through the
// same broker code as on the local backend: an orchestrator forks a child
// whose scripted agent (in tmux in its container) commits and reports
// done; the commit arrives imported in the orchestrator's repository at
// the exact SHA, and the child is destroyed, container and all.
func TestIncusSpawnDoneAndDestroy(t *testing.T) {
	e := newIncusTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	wantStatus(t, spawn(t, lead, "s-1", map[string]any{"branch": "fix/a", "prompt": "fix it"}), "started", "creation of child `fix-a` started")
	// The agent may report before its readiness is established: either
	// detail is right, and the report may come first.
	var st wire.StatusItem
	var done wire.MessageItem
	nextItem(t, lead, func(raw json.RawMessage) bool {
		var head struct{ Type, Ref, From, Kind string }
		json.Unmarshal(raw, &head)
		switch {
		case head.Type == wire.ItemStatus && head.Ref == "s-1":
			json.Unmarshal(raw, &st)
		case head.Type == wire.ItemMessage && head.From == "fix-a" && head.Kind == "done":
			json.Unmarshal(raw, &done)
		}
		return (st.State == "done" || st.State == "failed") && done.ID != ""
	})
	if st.State != "done" || !strings.HasPrefix(st.Detail, "child `fix-a` is ready") {
		t.Fatalf("spawn status %s %q", st.State, st.Detail)
	}
	if done.Body != "done: fix it" || done.ImportedRef != "refs/jailbee/from/fix-a/fix/a" || !fullSHA.MatchString(done.ImportedSHA) || done.OnDone != "destroy" {
		t.Fatalf("the done report: %+v", done)
	}
	if got := e.mustExec("lead", "git", "rev-parse", done.ImportedRef); got != done.ImportedSHA {
		t.Fatalf("%s in lead: %s, want %s", done.ImportedRef, got, done.ImportedSHA)
	}
	if got := e.mustExec("lead", "git", "log", "-1", "--format=%s", done.ImportedSHA); got != "agent: fix it" {
		t.Fatalf("the imported commit: %q", got)
	}
	waitGone(t, e, "fix-a")
	if out, _ := exec.Command("incus", "list", "--project", e.incusProject, "-f", "csv", "-c", "n").Output(); strings.Contains(string(out), "fix-a") {
		t.Fatalf("the child's container is still there: %s", out)
	}
}

// TestIncusCopyLosesTheSocket: a raw `incus copy` of an orchestrator
// carries its socket device; the next round removes the copy's device,
// moves the original's socket to a fresh directory and removes the old
// one (every connection to it drops), and the original's client, on the
// new socket, still has its inbox.
func TestIncusCopyLosesTheSocket(t *testing.T) {
	e, old, conn := leadWithMessage(t, "before the copy")
	incusCmd(t, e, "copy", "lead", "lead-copy")
	wait.For(t, "the original's socket to move", func() bool {
		now := e.b.SocketPath("lead") // "" while it moves
		return now != "" && now != old
	})
	// The round saw the copy carry the device (a round may run before the
	// test could look at the copy itself).
	if logs := e.logs.String(); !strings.Contains(logs, "instance=lead-copy") || !strings.Contains(logs, "carries a socket that is not its own") {
		t.Fatalf("no round found the copy's socket device:\n%s", logs)
	}
	wait.For(t, "the copy's device to go", func() bool {
		return !strings.Contains(incusDevices(t, e.incusProject, "lead-copy"), "jailbee-orchestration")
	})
	waitSocketDirGone(t, e, old)
	if !conn.closed() {
		t.Fatal("a connection to the old socket survived the move")
	}
	msgs := items[wire.MessageItem](t, e.client("lead"), wire.ItemMessage)
	if len(msgs) != 1 || msgs[0].Body != "before the copy" {
		t.Fatalf("lead's inbox on its new socket: %+v", msgs)
	}
	// Rounds pass: the original keeps its new socket.
	moved := e.sock("lead")
	time.Sleep(3 * broker.RoundInterval)
	if e.sock("lead") != moved {
		t.Fatal("the socket moved again")
	}

	// A copy whose device goes by another name (made here from scratch,
	// so no round catches it half made) still carries lead's directory.
	args := []string{"init", incus.DefaultImage, "sneaky", "-c", "user.jailbee.managed=true"}
	if pool := incustest.Pool(); pool != "" {
		args = append(args, "--storage", pool)
	}
	incusCmd(t, e, args...)
	incusCmd(t, e, "config", "device", "add", "sneaky", "other", "disk", "source="+filepath.Dir(moved), "path=/mnt/other")
	wait.For(t, "the original's socket to move again", func() bool {
		now := e.b.SocketPath("lead")
		return now != "" && now != moved
	})
	wait.For(t, "sneaky's device to go", func() bool {
		return !strings.Contains(incusDevices(t, e.incusProject, "sneaky"), "other")
	})
	if logs := e.logs.String(); !strings.Contains(logs, "instance=sneaky mount=other") {
		t.Fatalf("no round named sneaky's device:\n%s", logs)
	}
	if msgs := items[wire.MessageItem](t, e.client("lead"), wire.ItemMessage); len(msgs) != 1 {
		t.Fatalf("lead's inbox on its third socket: %+v", msgs)
	}
}

// TestIncusCoveredInsideIsPutBack: root inside a sandbox covers its
// socket directory, then the jailbee client the broker runs there (every
// command's framer); each round notices and puts them back, and the
// broker's commands run again with its own client.
func TestIncusCoveredInsideIsPutBack(t *testing.T) {
	e := newIncusTestEnv(t)
	e.orchestrator("lead")
	asRoot := func(script string) string { return asRootIn(t, e, "lead", script) }
	asRoot("mount -t tmpfs none " + backend.SocketMountPath)
	wait.For(t, "the socket back inside", func() bool {
		return asRoot("test -S "+backend.SocketMountPath+"/broker.sock && echo there || true") == "there"
	})
	asRoot("printf '#!/bin/sh\\nexit 0\\n' > /tmp/fake && chmod 755 /tmp/fake && mount --bind /tmp/fake " + incus.ClientPath)
	wait.For(t, "the broker's client back inside", func() bool {
		res, err := e.execIn("lead", "", "echo", "real")
		return err == nil && res.exit == 0 && res.stdout == "real\n"
	})
	if n := strings.Count(e.logs.String(), "something inside a sandbox covers what the broker placed there"); n < 2 {
		t.Fatalf("the rounds logged %d repairs, want one for the socket and one for the client:\n%s", n, e.logs.String())
	}
}

// incusDevices lists an instance's device names.
// asRootIn runs script as root inside the Incus sandbox name, straight
// through incus (not through the broker), and returns its output.
func asRootIn(t *testing.T, e *testEnv, name, script string) string {
	t.Helper()
	out, err := exec.Command("incus", "exec", "--project", e.incusProject, name, "--", "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("as root inside %s: %v: %s", name, err, out)
	}
	return strings.TrimSpace(string(out))
}

// incusRunning reports whether Incus runs the container name, asked
// straight (not through the broker).
func incusRunning(t *testing.T, project, name string) bool {
	t.Helper()
	out, err := exec.Command("incus", "list", "--project", project, "--format", "csv", "--columns", "s", "^"+name+"$").CombinedOutput()
	if err != nil {
		t.Fatalf("incus list %s: %v: %s", name, err, out)
	}
	return strings.TrimSpace(string(out)) == "RUNNING"
}

// TestIncusImportOfHangingStartStallsNobodyElse: root inside a child
// makes its /dev/null a FIFO at every boot (its init is root's to
// change), which holds up the last step of each start, the egress relay,
// for the backend's whole bound (30 s). Its orchestrator stops it and
// imports it, which starts it: that step runs out of the executor's line,
// so another orchestrator's send is answered before the import. The
// import fails at the bound, and the child, recorded stopped, is not left
// running.
func TestIncusImportOfHangingStartStallsNobodyElse(t *testing.T) {
	e := newIncusTestEnv(t)
	e.orchestrator("lead")
	e.child("kid", "lead")
	e.orchestrator("other")
	e.child("quiet", "other")
	lead := e.client("lead")
	asRootIn(t, e, "kid", `init=$(readlink -f /sbin/init) && mv "$init" "$init.real" && `+
		`printf '#!/bin/sh\numount -l /dev/null; rm -f /dev/null; mkfifo -m 666 /dev/null\nexec %s.real\n' "$init" > "$init" && chmod 755 "$init"`)
	wantStatus(t, sendManifest(t, lead, map[string]any{"id": "stop-1", "type": "stop", "child": "kid"}), "done", "child `kid` stopped")

	imported := make(chan wire.StatusItem, 1)
	go func() {
		var st wire.StatusItem
		lead.Call(context.Background(), "send", map[string]any{"manifest": map[string]any{
			"version": 1, "id": "imp-1", "type": "import", "child": "kid"}}, &st)
		imported <- st
	}()
	wait.For(t, "kid's container to run again for the import", func() bool { return incusRunning(t, e.incusProject, "kid") })
	// Well inside the relay's 30 s bound, so a send that waits for the
	// start fails here, not by a race with the import's answer.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var sent wire.StatusItem
	err := e.client("other").Call(ctx, "send", map[string]any{"manifest": map[string]any{
		"version": 1, "id": "m-1", "type": "message", "to": "quiet", "body": "hello"}}, &sent)
	if err != nil || sent.State != wire.StateDone {
		t.Fatalf("another orchestrator's send while the child starts: %+v %v", sent, err)
	}
	select {
	case st := <-imported:
		t.Fatalf("the import answered (%s %q) before another orchestrator's send: that send waited for the child's start", st.State, st.Detail)
	default:
	}
	var st wire.StatusItem
	select {
	case st = <-imported:
	case <-time.After(3 * time.Minute):
		t.Fatal("the import never answered")
	}
	if st.State != wire.StateFailed || !strings.Contains(e.logs.String(), "egress relay: not started within") {
		t.Fatalf("import of a child whose start hangs: %s %q, want failed at the egress relay's bound; log:\n%s", st.State, st.Detail, e.logs.String())
	}
	wait.For(t, "kid's container to stop again", func() bool { return !incusRunning(t, e.incusProject, "kid") })
	if info := e.info("kid"); info.State != "stopped" || info.Running {
		t.Fatalf("after the failed import: %+v", info)
	}
}

func incusDevices(t *testing.T, project, name string) string {
	t.Helper()
	out, err := exec.Command("incus", "config", "device", "list", "--project", project, name).CombinedOutput()
	if err != nil {
		t.Fatalf("incus config device list %s: %v: %s", name, err, out)
	}
	return string(out)
}

// TestIncusImportTwinLosesTheSocket: an `incus import` of an
// orchestrator's backup under another name shares its uuid: the broker
// cannot tell the two apart, so neither has a socket while both exist
// (the original's directory and connections go, both devices are
// removed). Once the twin is deleted, the original is served at a fresh
// directory and keeps its inbox.
func TestIncusImportTwinLosesTheSocket(t *testing.T) {
	e, old, conn := leadWithMessage(t, "before the import")
	backup := filepath.Join(t.TempDir(), "lead.tar")
	incusCmd(t, e, "export", "lead", backup, "--instance-only", "--compression", "none")
	incusCmd(t, e, "import", backup, "lead-twin")

	wait.For(t, "lead to lose its socket", func() bool { return e.b.SocketPath("lead") == "" })
	// The log line may follow the unserving by a moment.
	wait.For(t, "the conflict in the log", func() bool {
		return strings.Contains(e.logs.String(), `msg="several instances share the uuid of a sandbox (an import beside it?): none gets a socket until only one is left" sandbox=lead`)
	})
	waitSocketDirGone(t, e, old)
	if !conn.closed() {
		t.Fatal("a connection to the old socket survived the conflict")
	}
	for _, name := range []string{"lead", "lead-twin"} {
		wait.For(t, name+"'s device to go", func() bool {
			return !strings.Contains(incusDevices(t, e.incusProject, name), backend.SocketDeviceName)
		})
	}
	// Rounds pass: still no socket, and the child's is untouched.
	time.Sleep(3 * broker.RoundInterval)
	if e.b.SocketPath("lead") != "" {
		t.Fatal("lead got a socket while its twin exists")
	}
	e.client("kid")

	incusCmd(t, e, "delete", "--force", "lead-twin")
	wait.For(t, "lead's fresh socket", func() bool { return e.b.SocketPath("lead") != "" })
	if fresh := e.sock("lead"); filepath.Dir(fresh) == filepath.Dir(old) {
		t.Fatalf("served again at the old directory %s", fresh)
	}
	if !strings.Contains(incusDevices(t, e.incusProject, "lead"), backend.SocketDeviceName) {
		t.Fatal("lead's device was not attached again")
	}
	// From inside, as the agent: the client reaches the broker again, and
	// the inbox is kept.
	if got := e.insideInbox("lead"); got != "m-1" {
		t.Fatalf("lead's inbox from inside, on its fresh socket: %q", got)
	}
}

// leadWithMessage is an Incus env with an orchestrator "lead" holding a
// message m-1 (body) from its child "kid"; it returns lead's socket path
// and a connection to it.
func leadWithMessage(t *testing.T, body string) (*testEnv, string, *rawConn) {
	t.Helper()
	e := newIncusTestEnv(t)
	e.orchestrator("lead")
	e.child("kid", "lead")
	sendManifest(t, e.client("kid"), map[string]any{"id": "m-1", "type": "message", "body": body})
	return e, e.sock("lead"), e.raw("lead")
}

// waitSocketDirGone waits for the directory of the socket at old to be
// removed: a server that stops is unlisted first, then its connections
// are closed and its directory removed. A removal the broker logs as
// failed fails the test at once.
func waitSocketDirGone(t *testing.T, e *testEnv, old string) {
	t.Helper()
	wait.For(t, "the old socket directory to go", func() bool {
		if strings.Contains(e.logs.String(), "cannot remove socket dir") {
			t.Fatalf("the old socket directory was not removed:\n%s", e.logs)
		}
		_, err := os.Lstat(filepath.Dir(old))
		return os.IsNotExist(err)
	})
}

// incusCmd runs incus in the env's project.
func incusCmd(t *testing.T, e *testEnv, args ...string) {
	t.Helper()
	if out, err := exec.Command("incus", append([]string{"--project", e.incusProject}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("incus %v: %v: %s", args, err, out)
	}
}
