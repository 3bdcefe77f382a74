package broker_test

// The admin socket's exec: a command run in a sandbox through the broker
// with the caller's descriptors as its streams.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/inbox"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

func TestAdminExecStatusAndStreams(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")

	res, err := e.execIn("orch", "hello\nworld\n", "sh", "-c", "cat; echo to-stderr >&2; exit 7")
	if err != nil || res.exit != 7 || res.stdout != "hello\nworld\n" || res.stderr != "to-stderr\n" {
		t.Fatalf("cat/exit 7: %+v, %v", res, err)
	}
	// The agent user, in the checkout, with the sandbox's own environment.
	res, err = e.execIn("orch", "", "sh", "-c", `id -u; pwd; echo "$HOME"`)
	if err != nil || res.exit != 0 || res.stdout != "1000\n/workspace\n/home/agent\n" || res.stderr != "" {
		t.Fatalf("id/pwd: %+v, %v", res, err)
	}
	// A signal's status is 128+n.
	res, err = e.execIn("orch", "", "sh", "-c", "kill -TERM $$")
	if err != nil || res.exit != 128+15 {
		t.Fatalf("killed by SIGTERM: %+v, %v", res, err)
	}
	res, err = e.execIn("orch", "", "no-such-command-here")
	if err != nil || res.exit != 127 || !strings.Contains(res.stderr, "no-such-command-here: command not found") {
		t.Fatalf("missing command: %+v, %v", res, err)
	}
	// More than a pipe buffer each way.
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	res, err = e.execIn("orch", big, "sh", "-c", "cat; cat >&2 </dev/null; head -c 1048576 /dev/zero | tr '\\0' x >&2")
	if err != nil || res.exit != 0 || res.stdout != big || res.stderr != strings.Repeat("x", 1<<20) {
		t.Fatalf("1 MiB through the pipes: exit %d, %d bytes out, %d bytes err, %v", res.exit, len(res.stdout), len(res.stderr), err)
	}
}

func TestAdminExecRefusals(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	_, err := e.execIn("nope", "", "true")
	wantWireError(t, "exec in a missing sandbox", err, wire.CodeNotFound, "no sandbox named nope")
	_, err = adminExecArgs(t, e.adminPath(), wire.ExecArgs{Name: "orch"})
	wantWireError(t, "exec without a command", err, wire.CodeBadRequest, "exec needs a command")
	// Root inside: Incus containers have it, local sandboxes do not.
	res, err := adminExecArgs(t, e.adminPath(), wire.ExecArgs{Name: "orch", Argv: []string{"id", "-u"}, User: "root"})
	if onIncus() {
		if err != nil || res.exit != 0 || res.stdout != "0\n" {
			t.Fatalf("exec as root on Incus: %+v, %v", res, err)
		}
	} else {
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.CodeBadRequest || !strings.Contains(we.Detail, "runs every command as the agent user") {
			t.Fatalf("exec as root: %v", err)
		}
	}

	// A stopped sandbox.
	if err := e.admin("stop", wire.NameArgs{Name: "orch"}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = e.execIn("orch", "", "true")
	wantWireError(t, "exec in a stopped sandbox", err, wire.CodeBadRequest, "sandbox `orch` is not running (start it with 'jailbee start orch')")
	if err := e.admin("start", wire.NameArgs{Name: "orch"}, nil); err != nil {
		t.Fatal(err)
	}
	if out := e.mustExec("orch", "echo", "back"); out != "back" {
		t.Fatalf("exec after start: %q", out)
	}
}

// adminExecArgs is adminExec with the arguments as given.
func adminExecArgs(t testing.TB, sock string, a wire.ExecArgs) (execResult, error) {
	t.Helper()
	c, err := inbox.Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := newExecPipes(t, "")
	var res wire.ExecResult
	err = c.CallFiles(context.Background(), "exec", a, p.child(), &res)
	out, errOut := p.finish()
	return execResult{exit: res.Exit, stdout: out, stderr: errOut}, err
}

// openFDs counts this process's open descriptors (the broker's are among
// them).
func openFDs(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// writeWithFDs writes line with files attached as SCM_RIGHTS.
func writeWithFDs(t testing.TB, c *rawConn, line string, files []*os.File) {
	t.Helper()
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	if _, _, err := c.Conn.(*net.UnixConn).WriteMsgUnix([]byte(line), oob, nil); err != nil {
		t.Fatal(err)
	}
}

// devNulls opens n descriptors to pass.
func devNulls(t testing.TB, n int) []*os.File {
	t.Helper()
	var out []*os.File
	for range n {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

const execNeeds = "exec needs the command's stdin, stdout and stderr as 3 descriptors"

func TestAdminExecDescriptorCount(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	execLine := `{"v":1,"op":"exec","args":{"name":"orch","argv":["true"]}}` + "\n"
	round := func(c *rawConn) {
		for _, n := range []int{0, 1, 2, 4, 5, 16} {
			files := devNulls(t, n)
			writeWithFDs(t, c, execLine, files)
			closeAll(files)
			r := c.reply(t)
			want := fmt.Sprintf("%s (got %d)", execNeeds, n)
			if n > 3 {
				// More than an exec carries: all closed at once, none kept.
				want = execNeeds + " (got 0)"
			}
			if r.OK || r.Error.Code != wire.CodeBadRequest || r.Error.Detail != want {
				t.Fatalf("exec with %d descriptors: %+v, want bad_request %q", n, r.Error, want)
			}
		}
		// Descriptors sent with another admin op, and with a sandbox's
		// request (a sandbox socket takes none), are closed too.
		files := devNulls(t, 3)
		writeWithFDs(t, c, `{"v":1,"op":"ping"}`+"\n", files)
		closeAll(files)
		if r := c.reply(t); !r.OK {
			t.Fatalf("ping with descriptors: %+v", r.Error)
		}
		s := e.raw("orch")
		files = devNulls(t, 3)
		writeWithFDs(t, s, `{"v":1,"op":"list"}`+"\n", files)
		closeAll(files)
		if r := s.reply(t); !r.OK {
			t.Fatalf("list with descriptors: %+v", r.Error)
		}
		s.Close()
		// The connection is still good for a real exec: nothing of the
		// refused requests' descriptors was kept for it.
		p := newExecPipes(t, "in")
		writeWithFDs(t, c, `{"v":1,"op":"exec","args":{"name":"orch","argv":["sh","-c","cat; echo out"]}}`+"\n", p.child())
		out, _ := p.finish()
		var res wire.ExecResult
		if r := c.reply(t); !r.OK || json.Unmarshal(r.Result, &res) != nil || res.Exit != 0 || out != "inout\n" {
			t.Fatalf("exec after the refusals: %+v %s, output %q", r.Error, r.Result, out)
		}
	}
	// Warm up (pooled store connections, lazily opened files), then count.
	warm := dialRaw(t, e.adminPath())
	round(warm)
	warm.Close()
	before := openFDs(t)
	for range 20 {
		c := dialRaw(t, e.adminPath())
		round(c)
		c.Close()
	}
	// The broker closes its ends of our connections once it sees them go.
	deadline := time.Now().Add(30 * time.Second)
	for {
		now := openFDs(t)
		if now <= before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open after 20 rounds of refused execs, %d before", now, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAdminExecBadLineDropsItsDescriptors: descriptors sent with a line
// that is not a request belong to no request: the next request on the
// connection does not get them.
func TestAdminExecBadLineDropsItsDescriptors(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	c := dialRaw(t, e.adminPath())
	for _, bad := range []string{"not json", `{"v":2,"op":"exec"}`, `{"v":1}`} {
		p := newExecPipes(t, "")
		writeWithFDs(t, c, bad+"\n", p.child())
		if r := c.reply(t); r.OK {
			t.Fatalf("%s: answered ok", bad)
		}
		fmt.Fprintln(c, `{"v":1,"op":"exec","args":{"name":"orch","argv":["echo","stale"]}}`)
		r := c.reply(t)
		if r.OK || r.Error.Code != wire.CodeBadRequest || r.Error.Detail != execNeeds+" (got 0)" {
			t.Fatalf("exec without descriptors after %s with some: %+v %s", bad, r.Error, r.Result)
		}
		// The broker holds no copy of them: our pipes end.
		if out, _ := p.finish(); out != "" {
			t.Fatalf("%s: output %q", bad, out)
		}
	}
}

func TestAdminExecHangupKillsCommand(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	uid := e.hostUID("orch")
	marker := randomMarker(t)
	hb := e.homeFile("orch", "hb")

	c, err := inbox.Dial(context.Background(), e.adminPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := newExecPipes(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.CallFiles(ctx, "exec", wire.ExecArgs{Name: "orch", Argv: heartbeatLoop(marker)}, p.child(), nil)
	}()
	wait.For(t, "the command to run", func() bool { return len(processesOf(uid, marker)) > 0 })
	waitHeartbeat(t, hb)

	// The client hangs up: the broker ends the command.
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("exec after the client hung up: %v", err)
	}
	p.finish() // returns once the command's copies of the pipes are gone
	wait.For(t, "the command to end", func() bool { return len(processesOf(uid, marker)) == 0 })
	assertNoHeartbeat(t, hb)
	// The sandbox itself runs on.
	if out := e.mustExec("orch", "echo", "alive"); out != "alive" {
		t.Fatalf("exec after the hangup: %q", out)
	}
}

// randomMarker is a word to find a test's commands by on the host.
func randomMarker(t testing.TB) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "jbtest-" + hex.EncodeToString(b[:])
}

// heartbeatLoop is a command that writes the time to ~/hb every 20 ms
// forever; marker is its $0, so its shell is found by it on the host.
func heartbeatLoop(marker string) []string {
	return []string{"sh", "-c", `while :; do date +%s%N > "$HOME/hb.tmp"; mv "$HOME/hb.tmp" "$HOME/hb"; sleep 0.02; done`, marker}
}

// backgroundHeartbeat starts heartbeatLoop in the background of a command
// that returns at once.
func backgroundHeartbeat(marker string) []string {
	return []string{"sh", "-c", `sh -c "$1" "$2" </dev/null >/dev/null 2>&1 &`, "sh", heartbeatLoop(marker)[2], marker}
}

// readHeartbeat reads a heartbeat file ("" if it is not there).
func readHeartbeat(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// waitHeartbeat waits until the heartbeat file changes.
func waitHeartbeat(t testing.TB, path string) {
	t.Helper()
	first := readHeartbeat(path)
	wait.For(t, "the heartbeat "+path+" to change", func() bool {
		now := readHeartbeat(path)
		return now != "" && now != first
	})
}

// assertNoHeartbeat checks that the heartbeat file stays as it is for far
// longer than the loop's period.
func assertNoHeartbeat(t testing.TB, path string) {
	t.Helper()
	before := readHeartbeat(path)
	time.Sleep(300 * time.Millisecond)
	if after := readHeartbeat(path); after != before {
		t.Fatalf("the heartbeat %s still changes: %q -> %q", path, before, after)
	}
}

// TestAdminExecManyQuickCommands: commands that end at once, many at a
// time, each get their status (the supervisor must not lose a command
// that ended before it looked for it).
func TestAdminExecManyQuickCommands(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	const workers, each = 4, 150
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				c, err := inbox.Dial(ctx, e.adminPath())
				if err != nil {
					cancel()
					errs <- err
					return
				}
				null, err := os.Open(os.DevNull)
				if err != nil {
					cancel()
					errs <- err
					return
				}
				var res wire.ExecResult
				err = c.CallFiles(ctx, "exec", wire.ExecArgs{Name: "orch", Argv: []string{"sh", "-c", "exit " + fmt.Sprint(i%3)}}, []*os.File{null, null, null}, &res)
				null.Close()
				c.Close()
				cancel()
				if err == nil && res.Exit != i%3 {
					err = fmt.Errorf("exit %d, want %d", res.Exit, i%3)
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d, command %d: %w", w, i, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
