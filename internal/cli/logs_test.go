package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/cli"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// runUntil runs the command line in-process until it returns or ctx is
// cancelled by the test, with a hang guard.
func runUntil(t *testing.T, ctx context.Context, stdout io.Writer, args ...string) (chan int, func() int) {
	t.Helper()
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, "jailbee", args, cli.Deps{Stdin: strings.NewReader(""), Stdout: stdout, Stderr: io.Discard})
	}()
	return done, func() int {
		select {
		case code := <-done:
			return code
		case <-time.After(time.Minute):
			t.Fatalf("%v did not return (hang guard)", args)
			return -1
		}
	}
}

// TestLogsAgentPrintsAndFollowsThePanes: logs --agent asks the broker to
// run the pane capture (no terminal) and prints each window's lines,
// control characters dropped; -f prints only what changed since: lines
// added, a redrawn line, and nothing for lines the history dropped.
func TestLogsAgentPrintsAndFollowsThePanes(t *testing.T) {
	captures := []string{
		"\x00claude\nline 1\nline 2\n\n\n",
		"\x00claude\nline 1\nline 2\nline 3\x1b\n",
		"\x00claude\nline 2\nline 3\nline 4\n",
		"\x00claude\nline 2\nline 3\nline 4 redrawn\n",
		"\x00claude\nline 2\nline 3\nline 4 redrawn\n",
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var argvs [][]string
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		var a wire.ExecArgs
		json.Unmarshal(r.Args, &a)
		mu.Lock()
		n := len(argvs)
		argvs = append(argvs, a.Argv)
		mu.Unlock()
		if r.Op != "exec" || a.TTY || len(r.Files) != 3 {
			return okReply(wire.ExecResult{Exit: 1})
		}
		r.Files[1].Write([]byte(captures[min(n, len(captures)-1)]))
		if n == len(captures)-1 {
			cancel()
		}
		return okReply(wire.ExecResult{})
	})
	var out wait.Buffer
	_, result := runUntil(t, ctx, &out, "logs", "--state", f.state, "kid", "--agent", "-f")
	if code := result(); code != 0 {
		t.Errorf("logs --agent -f: exit %d", code)
	}
	want := "== window claude\nline 1\nline 2\nline 3\nline 4\nline 4 redrawn\n"
	if got := out.String(); got != want {
		t.Errorf("logs --agent -f printed\n%q\nwant\n%q", got, want)
	}
	for _, argv := range argvs {
		if !slices.Equal(argv, agent.CaptureAllArgv()) {
			t.Fatalf("the broker ran %q, want the pane capture", argv)
		}
	}

	// Without -f: one capture; a capture that fails means no session.
	g := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		r.Files[1].Write([]byte("\x00one\nfirst\n\x00two\nsecond\n"))
		return okReply(wire.ExecResult{})
	})
	var once bytes.Buffer
	if code := runWith(t, strings.NewReader(""), &once, io.Discard, "logs", "--state", g.state, "kid", "--agent"); code != 0 || once.String() != "== window one\nfirst\n== window two\nsecond\n" {
		t.Errorf("logs --agent: exit %d %q", code, once.String())
	}
	none := newFakeAdmin(t, func(adminRequest) *wire.Response { return okReply(wire.ExecResult{Exit: 1}) })
	var errb bytes.Buffer
	if code := runWith(t, strings.NewReader(""), io.Discard, &errb, "logs", "--state", none.state, "kid", "--agent"); code != 1 || !strings.Contains(errb.String(), "no agent session in kid") {
		t.Errorf("logs --agent with no session: exit %d %q", code, errb.String())
	}
}

// TestLogsFollowsTheWorkerLogs: logs -f prints the worker logs, then
// what is added to them and a new spawn's log, until interrupted.
func TestLogsFollowsTheWorkerLogs(t *testing.T) {
	state := shortDir(t)
	dir := filepath.Join(state, "logs")
	os.Mkdir(dir, 0o700)
	first := filepath.Join(dir, "kid.a.log")
	os.WriteFile(first, []byte("first\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "other.a.log"), []byte("not kid's\n"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out wait.Buffer
	_, result := runUntil(t, ctx, &out, "logs", "--state", state, "kid", "-f")
	wait.For(t, "the log printed", func() bool { return out.String() == "== kid.a.log\nfirst\n" })
	f, err := os.OpenFile(first, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("more\n")
	f.Close()
	wait.For(t, "the added line printed", func() bool { return out.String() == "== kid.a.log\nfirst\nmore\n" })
	os.WriteFile(filepath.Join(dir, "kid.b.log"), []byte("second spawn\n"), 0o600)
	wait.For(t, "the new log printed", func() bool { return strings.HasSuffix(out.String(), "more\n== kid.b.log\nsecond spawn\n") })
	cancel()
	if code := result(); code != 0 {
		t.Errorf("logs -f: exit %d", code)
	}
}

// TestAttachNeedsATerminal: attach without a terminal says so (and how to
// see the agent's pane without one) and sends nothing.
func TestAttachNeedsATerminal(t *testing.T) {
	f := newFakeAdmin(t, nil)
	var errb bytes.Buffer
	code := runWith(t, strings.NewReader(""), io.Discard, &errb, "attach", "--state", f.state, "kid")
	if code != cli.ExitUsage || !strings.Contains(errb.String(), "attach needs a terminal") || strings.Contains(errb.String(), "-t") {
		t.Errorf("attach without a terminal: exit %d %q", code, errb.String())
	}
	if len(f.requests()) != 0 {
		t.Error("attach without a terminal sent a request")
	}
}
