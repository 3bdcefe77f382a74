package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"agentbox/internal/backend"
	"agentbox/internal/backend/local"
	"agentbox/internal/broker"
	"agentbox/internal/cli"
	"agentbox/internal/config"
	"agentbox/internal/inbox"
	"agentbox/internal/orchestrate"
	"agentbox/internal/testutil/serve"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/testutil/wait"
)

// run runs the jailbee command line in-process with the given stdin.
func run(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cli.Run(context.Background(), "jailbee", args, cli.Deps{
		OpenBackend: func(o cli.BackendOptions) (backend.Backend, error) {
			return local.New(local.Options{Root: filepath.Join(o.StateDir, "sandboxes"), Binary: testbin.Jailbee(t), NoLimits: o.NoLimits})
		},
		Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb,
	})
	return code, out.String(), errb.String()
}

func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "jbc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// serveUnix listens on a fresh socket and runs handle for every
// connection (which it then closes); it returns the socket's path.
func serveUnix(t *testing.T, handle func(c net.Conn, r *bufio.Reader)) string {
	t.Helper()
	path := filepath.Join(shortDir(t), "broker.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	serve.Serve(t, ln, func(c net.Conn) { handle(c, bufio.NewReader(c)) })
	return path
}

// fakeBroker serves a socket that answers every line with reply (or
// closes at once when reply is ""). For what a real broker cannot be made
// to do: speak another version, drop a connection mid-request.
func fakeBroker(t *testing.T, reply string) string {
	return serveUnix(t, func(c net.Conn, r *bufio.Reader) {
		if _, err := r.ReadString('\n'); err != nil || reply == "" {
			return
		}
		io.WriteString(c, reply+"\n")
	})
}

func TestInboxExitStatusesWithoutBroker(t *testing.T) {
	t.Setenv(inbox.SocketEnv, filepath.Join(shortDir(t), "missing.sock"))
	for _, args := range [][]string{
		{"inbox", "ls"},
		{"inbox", "read", "h-00000000"},
		{"inbox", "status"},
		{"inbox", "grant"},
		{"inbox", "children"},
		{"inbox", "wait", "--timeout", "30s"},
		{"inbox", "send", "message", "--to", "c", "--text", "x"},
	} {
		start := time.Now()
		code, stdout, _ := run(t, "", args...)
		if code != cli.ExitUnreachable || stdout != "" {
			t.Errorf("%v with no broker: exit %d stdout %q, want exit 4 and no output", args, code, stdout)
		}
		if args[1] == "wait" && time.Since(start) > 20*time.Second {
			t.Errorf("wait retried a first connection that failed")
		}
	}
}

func TestInboxExit4OnVersionMismatchAndDrop(t *testing.T) {
	for name, reply := range map[string]string{
		"version": `{"v":1,"ok":false,"error":{"code":"version","detail":"protocol version 2 required"}}`,
		"drop":    "",
		"busy":    `{"v":1,"ok":false,"error":{"code":"busy","detail":"too many connections"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(inbox.SocketEnv, fakeBroker(t, reply))
			code, _, stderr := run(t, "", "inbox", "ls")
			if code != cli.ExitUnreachable {
				t.Fatalf("exit %d (%s), want 4", code, stderr)
			}
		})
	}
}

func TestInboxUsageErrors(t *testing.T) {
	t.Setenv(inbox.SocketEnv, filepath.Join(shortDir(t), "missing.sock"))
	for _, args := range [][]string{
		{"inbox", "ls", "--bogus"},
		{"inbox", "read"},
		{"inbox", "wait", "--wake-on", "msg:"},
		{"inbox", "wait", "--wake-on", "status:bogus"},
		{"inbox", "wait", "--wake-on", "done"},
		{"inbox", "wait", "--timeout", "soon"},
		{"inbox", "wait", "--quiet-after", "-1s"},
		{"inbox", "send", "message", "--timeout", "0s", "--text", "x"},
	} {
		if code, _, stderr := run(t, "", args...); code != cli.ExitUsage {
			t.Errorf("%v: exit %d (%s), want 2", args, code, stderr)
		}
	}
}

// brokerConfig is the config `jailbee broker` runs with by default: the
// default limits, and (as root) a host uid of its own for each sandbox.
func brokerConfig(state string, be backend.Backend) broker.Config {
	def := config.DefaultBroker()
	sbs := orchestrate.Sandboxes{Limits: def.Limits}
	if os.Geteuid() == 0 {
		sbs.HostUIDs = &def.SandboxUIDs
	}
	return broker.Config{StateDir: state, Backend: be, Sandboxes: sbs,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// destroyAll destroys every sandbox of the backend: their units outlive
// the broker and the test process.
func destroyAll(t *testing.T, be backend.Backend) {
	t.Helper()
	ctx := context.Background()
	insts, err := be.List(ctx)
	if err != nil {
		t.Errorf("list sandboxes to destroy: %v", err)
		return
	}
	for _, in := range insts {
		if err := be.Destroy(ctx, in.Name); err != nil {
			t.Errorf("destroy sandbox %s: %v", in.Name, err)
		}
	}
}

// repoConfig gives the test repository a default agent, so spawns are
// admitted (the tests here never let one start).
const repoConfig = `agents:
  waiter:
    command: "sleep 600"
    prompt_args: ["{prompt}"]
default_agent: waiter
`

// realBroker starts a broker with an orchestrator "orch" and child "kid".
func realBroker(t *testing.T) *broker.Broker {
	t.Helper()
	state := filepath.Join(shortDir(t), "state")
	repo := filepath.Join(t.TempDir(), "repo")
	if err := os.MkdirAll(filepath.Join(repo, ".jailbee"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, ".jailbee", "config.yaml"), []byte(repoConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, a := range [][]string{{"init", "-q", "-b", "main", repo}, {"-C", repo, "add", "."},
		{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "i"}} {
		if out, err := exec.Command("git", a...).CombinedOutput(); err != nil {
			t.Fatalf("git: %v %s", err, out)
		}
	}
	be, err := local.New(local.Options{Root: filepath.Join(state, "sandboxes"), Binary: testbin.Jailbee(t)})
	if err != nil {
		t.Fatal(err)
	}
	// Sandboxes outlive the broker: destroy every one this test made
	// (registered before the broker's Close, so it runs after it).
	t.Cleanup(func() { destroyAll(t, be) })
	b, err := broker.Open(brokerConfig(state, be))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	t.Setenv(cli.StateDirEnv, state)
	if code, _, stderr := run(t, "", "new", "orch", "--repo", repo, "--orchestrator"); code != 0 {
		t.Fatalf("new orch: %s", stderr)
	}
	if code, _, stderr := run(t, "", "new", "kid", "--branch", "k", "--parent", "orch"); code != 0 {
		t.Fatalf("new kid: %s", stderr)
	}
	return b
}

func TestSendMessageOutputAndExitStatuses(t *testing.T) {
	b := realBroker(t)
	t.Setenv(inbox.SocketEnv, b.SocketPath("orch"))

	code, stdout, stderr := run(t, "", "inbox", "send", "message", "--to", "kid", "--id", "hello-1", "--text", "hi")
	if code != 0 || stdout != "hello-1\n" || stderr != "" {
		t.Fatalf("send: exit %d stdout %q stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = run(t, "", "inbox", "send", "message", "--to", "kid", "--id", "hello-2", "--text", "hi", "--wait")
	if code != 0 || stdout != "hello-2\ndone: delivered to kid\n" {
		t.Fatalf("send --wait: exit %d stdout %q", code, stdout)
	}
	code, stdout, stderr = run(t, "", "inbox", "send", "message", "--to", "stranger", "--id", "nope-1", "--text", "hi")
	if code != cli.ExitFailed || stdout != "nope-1\n" || !strings.Contains(stderr, "`stranger` is not a child of this orchestrator") {
		t.Fatalf("refused send: exit %d stdout %q stderr %q", code, stdout, stderr)
	}
	// Text from stdin travels as the request body.
	t.Setenv(inbox.SocketEnv, b.SocketPath("kid"))
	code, stdout, _ = run(t, "line one\nline two\n", "inbox", "send", "message", "--id", "up-1", "--kind", "question")
	if code != 0 || stdout != "up-1\n" {
		t.Fatalf("send from stdin: exit %d stdout %q", code, stdout)
	}
	t.Setenv(inbox.SocketEnv, b.SocketPath("orch"))
	code, stdout, _ = run(t, "", "inbox", "ls", "--json")
	if code != 0 || !strings.Contains(stdout, `"body": "line one\nline two\n"`) || !strings.Contains(stdout, `"origin_id": "up-1"`) {
		t.Fatalf("orchestrator inbox: exit %d %s", code, stdout)
	}
}

// TestSendSpawnWaitReturnsOnQueued: with both slots of the default grant
// held, send spawn --wait answers at once: the id, then the queued status
// naming its place and the children that hold the slots, exit 0.
func TestSendSpawnWaitReturnsOnQueued(t *testing.T) {
	b := realBroker(t)
	if code, _, stderr := run(t, "", "new", "kid2", "--branch", "k2", "--parent", "orch"); code != 0 {
		t.Fatalf("new kid2: %s", stderr)
	}
	t.Setenv(inbox.SocketEnv, b.SocketPath("orch"))
	code, stdout, stderr := run(t, "", "inbox", "send", "spawn", "--branch", "fix/q", "--id", "spawn-q", "--text", "fix q", "--wait", "--timeout", "60s")
	if code != 0 || stdout != "spawn-q\nqueued: queued at position 1: 2 of 2 slots are used by `kid`, `kid2`\n" {
		t.Fatalf("send spawn --wait: exit %d stdout %q stderr %q", code, stdout, stderr)
	}
	// Its child waits in the queue; destroying it ends the spawn.
	if code, _, stderr := run(t, "", "destroy", "fix-q"); code != 0 {
		t.Fatalf("destroy the queued child: %s", stderr)
	}
}

func TestWaitTimeoutAndWake(t *testing.T) {
	b := realBroker(t)
	t.Setenv(inbox.SocketEnv, b.SocketPath("kid"))
	if code, _, _ := run(t, "", "inbox", "wait", "--timeout", "200ms"); code != cli.ExitTimeout {
		t.Fatalf("wait on an empty inbox: exit %d, want 3", code)
	}
	code, stdout, _ := run(t, "", "inbox", "wait", "--quiet-after", "100ms", "--timeout", "10s")
	if code != 0 || !strings.HasPrefix(stdout, "quiet:") {
		t.Fatalf("quiet-after: exit %d %q", code, stdout)
	}
	t.Setenv(inbox.SocketEnv, b.SocketPath("orch"))
	run(t, "", "inbox", "send", "message", "--to", "kid", "--id", "n-1", "--text", "just a note")
	run(t, "", "inbox", "send", "message", "--to", "kid", "--id", "q-1", "--kind", "question", "--text", "a question")
	t.Setenv(inbox.SocketEnv, b.SocketPath("kid"))
	code, stdout, _ = run(t, "", "inbox", "wait", "--wake-on", "msg:question,blocked", "--timeout", "10s")
	if code != 0 || !strings.Contains(stdout, "question: a question") {
		t.Fatalf("wait --wake-on msg:question: exit %d %q", code, stdout)
	}
}

func TestWaitSurvivesBrokerRestart(t *testing.T) {
	b := realBroker(t)
	kidSock := b.SocketPath("kid")
	t.Setenv(inbox.SocketEnv, kidSock)
	done := make(chan string, 1)
	go func() {
		code, stdout, stderr := run(t, "", "inbox", "wait", "--timeout", "60s")
		done <- strings.Join([]string{string(rune('0' + code)), stdout, stderr}, "|")
	}()
	// The wait reads its socket from the environment (changed below) and
	// must be connected before the broker goes: a first connection that
	// fails exits 4.
	wait.For(t, "the wait to connect to kid's socket", func() bool { return unixConns(t, kidSock) > 0 })
	state := os.Getenv(cli.StateDirEnv)
	be := b.BackendForTest()
	b.Close()
	b2, err := broker.Open(brokerConfig(state, be))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if err := b2.Serve(); err != nil {
		t.Fatal(err)
	}
	if b2.SocketPath("kid") != kidSock {
		t.Fatalf("kid's socket moved")
	}
	t.Setenv(inbox.SocketEnv, b2.SocketPath("orch"))
	run(t, "", "inbox", "send", "message", "--to", "kid", "--id", "after-restart", "--text", "still there?")
	select {
	case res := <-done:
		if !strings.HasPrefix(res, "0|") || !strings.Contains(res, "still there?") {
			t.Fatalf("wait across a restart: %s", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("wait did not reconnect after the broker restarted")
	}
}

// unixConns counts the connections to the Unix socket at path that its
// listener (in this process's network namespace) has taken or queued: the
// kernel lists each under the socket's path, beside the listener itself.
func unixConns(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	n := -1 // the listener
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 8 && f[7] == path {
			n++
		}
	}
	return n
}

// TestInboxOnHostSaysItRunsInASandbox: without the override, a default
// socket path that does not exist (the host) gets a message naming the
// sandbox; a socket that exists but refuses connections, or an override,
// keeps the plain unreachable message. Exit 4 either way.
func TestInboxOnHostSaysItRunsInASandbox(t *testing.T) {
	dir := shortDir(t)
	missing := filepath.Join(dir, "run", "jailbee", "orchestration", "broker.sock")
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close() // the socket file stays; connecting to it is refused
	const plain = "jailbee: cannot reach the broker: broker unreachable: cannot connect to the broker socket\n"
	cases := []struct {
		name       string
		def, env   string // the default socket path, $JAILBEE_ORCHESTRATION_SOCKET ("" = unset)
		wantStderr string
	}{
		{"default missing", missing, "", "jailbee: jailbee inbox runs inside a sandbox: no broker socket at " + missing +
			" (from the host, run it in a sandbox: jb exec NAME -- jailbee inbox ...)\n"},
		{"default refuses", stale, "", plain},
		{"override missing", stale, missing, plain},
		{"override names the missing default", missing, missing, plain},
	}
	commands := [][]string{
		{"inbox", "ls"},
		{"inbox", "status"},
		{"inbox", "wait", "--timeout", "30s"},
		{"inbox", "send", "message", "--to", "c", "--text", "x"},
	}
	for _, tc := range cases {
		for _, args := range commands {
			t.Run(tc.name+"/"+args[1], func(t *testing.T) {
				defer cli.SetDefaultSocketForTest(tc.def)()
				t.Setenv(inbox.SocketEnv, tc.env)
				if tc.env == "" {
					os.Unsetenv(inbox.SocketEnv)
				}
				code, stdout, stderr := run(t, "", args...)
				if code != cli.ExitUnreachable || stdout != "" || stderr != tc.wantStderr {
					t.Errorf("exit %d stdout %q stderr %q, want exit 4, no stdout, stderr %q", code, stdout, stderr, tc.wantStderr)
				}
			})
		}
	}
}

// TestInboxJSONKeepsWholeDetails: ls and status cut a long detail to one
// short line in their tables; --json always carries it whole.
func TestInboxJSONKeepsWholeDetails(t *testing.T) {
	b := realBroker(t)
	t.Setenv(inbox.SocketEnv, b.SocketPath("orch"))
	name := strings.Repeat("n", 63)                                // the longest short name
	detail := "`" + name + "` is not a child of this orchestrator" // longer than a table's line
	if code, _, stderr := run(t, "", "inbox", "send", "message", "--child", name, "--id", "long-1", "--text", "hi"); code != cli.ExitFailed {
		t.Fatalf("send: exit %d (%s), want a refusal", code, stderr)
	}
	wantJSON := `"detail": "` + detail + `"`
	// status reads the snapshot of the broker's last round.
	wait.For(t, "the status in the snapshot", func() bool {
		_, out, _ := run(t, "", "inbox", "status")
		return strings.Contains(out, "long-1")
	})
	for _, args := range [][]string{{"inbox", "ls", "--all"}, {"inbox", "status"}} {
		_, table, _ := run(t, "", args...)
		if !strings.Contains(table, "long-1") || strings.Contains(table, detail) {
			t.Errorf("%v: the table should show long-1 with its detail cut:\n%s", args, table)
		}
		code, stdout, stderr := run(t, "", append(args, "--json")...)
		if code != 0 || !strings.Contains(stdout, wantJSON) {
			t.Errorf("%v --json: exit %d (%s), want the whole detail %q in:\n%s", args, code, stderr, detail, stdout)
		}
	}
	if _, stdout, _ := run(t, "", "inbox", "status", "long-1", "--json"); !strings.Contains(stdout, wantJSON) {
		t.Errorf("status long-1 --json: want the whole detail in:\n%s", stdout)
	}
}

// TestInboxOutputCarriesNoTerminalControls: a child's message body is
// its own text, read by its orchestrator in a terminal a user may be
// attached to. The list's one-line view blanks every character a terminal
// acts on; read --json escapes them (the same JSON, the body whole); read
// prints the body as sent.
func TestInboxOutputCarriesNoTerminalControls(t *testing.T) {
	b := realBroker(t)
	body := "a\x1b]0;t\x07 b\u009b2J c\u202ed\u200b e\n"
	t.Setenv(inbox.SocketEnv, b.SocketPath("kid"))
	if code, _, stderr := run(t, body, "inbox", "send", "message", "--id", "esc-1"); code != 0 {
		t.Fatalf("send: exit %d %s", code, stderr)
	}
	t.Setenv(inbox.SocketEnv, b.SocketPath("orch"))
	acts := func(r rune) bool {
		return r < 0x20 && r != '\n' || r >= 0x7f && r < 0xa0 || unicode.Is(unicode.Cf, r) || r == utf8.RuneError
	}
	code, list, stderr := run(t, "", "inbox", "ls")
	if code != 0 || !strings.Contains(list, "from kid") || strings.ContainsFunc(list, acts) {
		t.Fatalf("ls: exit %d (%s), printed %q", code, stderr, list)
	}
	id := strings.Fields(list)[0]
	code, js, stderr := run(t, "", "inbox", "read", id, "--json", "--keep")
	var it struct{ Body string }
	if code != 0 || strings.ContainsFunc(js, acts) || json.Unmarshal([]byte(js), &it) != nil || it.Body != body {
		t.Fatalf("read --json: exit %d (%s), printed %q", code, stderr, js)
	}
	if code, plain, _ := run(t, "", "inbox", "read", id); code != 0 || !strings.HasSuffix(plain, "\n"+body+"\n") {
		t.Fatalf("read: exit %d, printed %q, want the body as sent at its end", code, plain)
	}
}

// TestInboxTextFieldsArePrintable: besides a message's body (read prints
// it as sent, see above), every field the text views print is another
// sandbox's text or quotes it (a detail, an import error, an on_done
// reason, a name, a branch): each line of it is printed with every
// character a terminal acts on shown as a space, newlines kept.
func TestInboxTextFieldsArePrintable(t *testing.T) {
	const esc = `\u001b]0;t\u0007 \u009b2J \u202e`
	acts := func(r rune) bool {
		return r < 0x20 && r != '\n' || r >= 0x7f && r < 0xa0 || unicode.Is(unicode.Cf, r) || r == utf8.RuneError
	}
	msg := `{"version":1,"id":"m-1` + esc + `","type":"message","from":"kid` + esc + `","kind":"done` + esc + `",` +
		`"in_reply_to":"x` + esc + `","imported_ref":"refs/x` + esc + `","import_error":"bad` + esc + `\nnext` + esc + `",` +
		`"on_done":"keep` + esc + `","on_done_reason":"why` + esc + `","body":"plain"}`
	status := `{"version":1,"id":"s-1` + esc + `","type":"status","ref":"r-1` + esc + `","state":"failed` + esc + `","detail":"d` + esc + `\nline 2` + esc + `"}`
	for _, tc := range []struct {
		name   string
		result string
		args   []string
		want   []string // in stdout+stderr
	}{
		{"read", msg, []string{"inbox", "read", "m-1"}, []string{"import_error: bad ]0;t   2J  \nnext ]0;t   2J  \n", "on_done_reason: why ]0;t   2J  \n", "from: kid ]0;t   2J  \n", "\nplain\n"}},
		{"read status", status, []string{"inbox", "read", "s-1"}, []string{"detail: d ]0;t   2J  \nline 2 ]0;t   2J  \n"}},
		{"ls", `{"items":[` + msg + `,` + status + `]}`, []string{"inbox", "ls"}, []string{"from kid ]0;t   2J  ", "r-1 ]0;t   2J    failed ]0;t   2J  : d ]0;t   2J  "}},
		{"status ref", status, []string{"inbox", "status", "r-1"}, []string{"r-1 ]0;t   2J    failed ]0;t   2J  : d ]0;t   2J  \nline 2 ]0;t   2J  \n"}},
		{"status", `{"statuses":[` + status + `]}`, []string{"inbox", "status"}, []string{"r-1 ]0;t   2J    failed ]0;t   2J  : d ]0;t   2J  \n"}},
		{"children", `{"children":[{"name":"kid` + esc + `","branch":"b` + esc + `","state":"running` + esc + `","running":true}]}`, []string{"inbox", "children"}, []string{"kid ]0;t   2J    running ]0;t   2J    b ]0;t   2J  \n"}},
		{"send --wait", `{"version":1,"id":"s","type":"status","ref":"m","state":"failed","detail":"d` + esc + `\nline 2"}`, []string{"inbox", "send", "message", "--id", "m", "--text", "x", "--wait"}, []string{"failed: d ]0;t   2J  \nline 2\n"}},
		{"send refused", `{"version":1,"id":"s","type":"status","ref":"m","state":"refused","detail":"d` + esc + `\nline 2"}`, []string{"inbox", "send", "message", "--id", "m", "--text", "x"}, []string{"jailbee: refused: d ]0;t   2J  \nline 2\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(inbox.SocketEnv, fakeBroker(t, `{"v":1,"ok":true,"result":`+tc.result+`}`))
			_, stdout, stderr := run(t, "", tc.args...)
			all := stdout + stderr
			if strings.ContainsFunc(all, acts) {
				t.Errorf("printed %q", all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("printed %q, want %q in it", all, w)
				}
			}
		})
	}
}
