package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"agentbox/internal/cli"
	"agentbox/internal/term"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// adminRequest is one request a fakeAdmin received.
type adminRequest struct {
	Op    string
	Args  json.RawMessage
	Files []*os.File // closed once the handler returns
}

// fakeAdmin is a broker admin socket at <state>/admin.sock that records
// every request and answers it with handle. What is under test is the
// host commands' side: what they check before asking, what they ask, and
// what they make of the answer.
type fakeAdmin struct {
	state  string
	handle func(adminRequest) *wire.Response

	mu    sync.Mutex
	reqs  []adminRequest
	conns int
}

// newFakeAdmin serves a fake admin socket in a new state dir; handle nil
// answers every request with an empty success.
func newFakeAdmin(t *testing.T, handle func(adminRequest) *wire.Response) *fakeAdmin {
	t.Helper()
	if handle == nil {
		handle = func(adminRequest) *wire.Response { return okReply(map[string]any{}) }
	}
	f := &fakeAdmin{state: shortDir(t), handle: handle}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(f.state, "admin.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				f.serve(c)
			}()
		}
	}()
	return f
}

func (f *fakeAdmin) serve(c *net.UnixConn) {
	f.mu.Lock()
	f.conns++
	f.mu.Unlock()
	// A hang guard: a client that never sends must not hold the test.
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, files, err := readLineWithRights(c)
	if err != nil {
		closeFiles(files)
		return
	}
	var req wire.Request
	if err := json.Unmarshal(line, &req); err != nil {
		closeFiles(files)
		return
	}
	r := adminRequest{Op: req.Op, Args: req.Args, Files: files}
	f.mu.Lock()
	f.reqs = append(f.reqs, r)
	f.mu.Unlock()
	resp := f.handle(r)
	closeFiles(files)
	out, _ := wire.AppendResponse(nil, resp)
	c.Write(out)
}

// readLineWithRights reads one request line and the descriptors sent
// with it (SCM_RIGHTS).
func readLineWithRights(c *net.UnixConn) ([]byte, []*os.File, error) {
	var line []byte
	var files []*os.File
	buf := make([]byte, 64<<10)
	oob := make([]byte, syscall.CmsgSpace(8*4))
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			msgs, _ := syscall.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				fds, _ := syscall.ParseUnixRights(&m)
				for _, fd := range fds {
					// Non-blocking, so reads and writes take deadlines
					// (the hang guards of the handlers).
					unix.SetNonblock(fd, true)
					files = append(files, os.NewFile(uintptr(fd), "passed"))
				}
			}
		}
		if n > 0 {
			line = append(line, buf[:n]...)
		}
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			return line[:i], files, nil
		}
		if err != nil {
			return nil, files, err
		}
		if n == 0 {
			return nil, files, io.EOF
		}
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// requests returns what the fake received so far.
func (f *fakeAdmin) requests() []adminRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]adminRequest(nil), f.reqs...)
}

func okReply(result any) *wire.Response {
	r, err := wire.OK(result)
	if err != nil {
		panic(err)
	}
	return r
}

func errReply(code wire.Code, detail string) *wire.Response {
	return wire.Fail(&wire.Error{Code: code, Detail: detail})
}

// runWith runs the command line in-process with the given streams.
func runWith(t *testing.T, stdin io.Reader, stdout, stderr io.Writer, args ...string) int {
	t.Helper()
	return cli.Run(context.Background(), "jailbee", args, cli.Deps{
		OpenBackend: nil, // host commands never open a backend
		Stdin:       stdin, Stdout: stdout, Stderr: stderr,
	})
}

// TestHostUsageErrors: usage errors exit 2 with a message and send no
// request, even with a broker listening.
func TestHostUsageErrors(t *testing.T) {
	f := newFakeAdmin(t, nil)
	t.Setenv(cli.StateDirEnv, f.state)
	repo := shortDir(t)
	grant := filepath.Join(shortDir(t), "grant.json")
	os.WriteFile(grant, []byte(`{}`), 0o600)
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"exec", "sb", "true"}, "usage: exec NAME [-t] -- CMD..."},
		{[]string{"exec", "sb", "sh", "--", "true"}, "usage: exec NAME [-t] -- CMD..."},
		{[]string{"exec", "sb", "--"}, "requires at least 2 arg(s)"},
		{[]string{"exec", "--env", "FOO", "sb", "--", "true"}, `--env needs K=V, not "FOO"`},
		{[]string{"exec", "--env", "=v", "sb", "--", "true"}, `--env needs K=V, not "=v"`},
		{[]string{"exec", "-t", "sb", "--", "sh"}, "-t needs a terminal on stdin"},
		{[]string{"exec", "--bogus", "sb", "--", "sh"}, "unknown flag: --bogus"},
		{[]string{"new", "x", "--repo", repo, "--orchestrator", "--parent", "y"}, "give exactly one of --orchestrator and --parent"},
		{[]string{"new", "x", "--repo", repo}, "give exactly one of --orchestrator and --parent"},
		{[]string{"new", "x", "--parent", "y", "--grant", grant}, "--grant is only for --orchestrator"},
		{[]string{"new", "x", "--orchestrator"}, "--repo is required with --orchestrator"},
		{[]string{"new", "--orchestrator", "--repo", repo}, "accepts 1 arg(s)"},
		{[]string{"ls", "extra"}, "unknown command"},
		{[]string{"ls", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"destroy"}, "accepts 1 arg(s)"},
		{[]string{"fetch"}, "accepts 1 arg(s)"},
		{[]string{"start", "a", "b"}, "accepts 1 arg(s)"},
		{[]string{"stop"}, "accepts 1 arg(s)"},
		{[]string{"usage", "a", "b"}, "accepts at most 1 arg(s)"},
		{[]string{"usage", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"rights"}, "accepts 1 arg(s)"},
		{[]string{"rights", "x", "--add-bogus", "y"}, "unknown flag: --add-bogus"},
	} {
		var out, errb bytes.Buffer
		code := runWith(t, strings.NewReader(""), &out, &errb, tc.args...)
		if code != cli.ExitUsage || !strings.Contains(errb.String(), tc.want) || out.Len() != 0 {
			t.Errorf("%v: exit %d stdout %q stderr %q, want exit 2 and %q", tc.args, code, out.String(), errb.String(), tc.want)
		}
	}
	if reqs := f.requests(); len(reqs) != 0 {
		t.Errorf("usage errors sent %d requests to the broker, first %q", len(reqs), reqs[0].Op)
	}
}

// TestRunErrorsArePrintable: an error line Run prints quotes its
// argument as given (a flag name here), but never with a character a
// terminal acts on.
func TestRunErrorsArePrintable(t *testing.T) {
	f := newFakeAdmin(t, nil)
	t.Setenv(cli.StateDirEnv, f.state)
	for _, args := range [][]string{
		{"ls", "--bogus\x1b]0;pwned\a"},
		{"ls", "-\x1b"},
		{"usage", "--x\u202e\x9b2J"},
	} {
		var out, errb bytes.Buffer
		code := runWith(t, strings.NewReader(""), &out, &errb, args...)
		msg := strings.TrimSuffix(errb.String(), "\n")
		if code != cli.ExitUsage || msg == "" || strings.ContainsFunc(msg, func(r rune) bool {
			return r == utf8.RuneError || !unicode.IsPrint(r)
		}) {
			t.Errorf("%q: exit %d stderr %q, want exit 2 and one printable line", args, code, errb.String())
		}
	}
}

// TestExecTTYNeedsATerminalOnStdin: -t refuses stdin that is a file or a
// pipe, not only a reader.
func TestExecTTYNeedsATerminalOnStdin(t *testing.T) {
	f := newFakeAdmin(t, nil)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	for _, stdin := range []*os.File{r, devnull} {
		var errb bytes.Buffer
		code := runWith(t, stdin, io.Discard, &errb, "exec", "--state", f.state, "-t", "sb", "--", "sh")
		if code != cli.ExitUsage || errb.String() != "jailbee: -t needs a terminal on stdin\n" {
			t.Errorf("-t with stdin %s: exit %d %q", stdin.Name(), code, errb.String())
		}
	}
	if len(f.requests()) != 0 {
		t.Errorf("exec -t without a terminal sent a request")
	}
}

// TestHostCommandsWithoutBrokerNameTheStateDir: every host command exits
// 4 with a message naming the state dir it looked in (absolute) and how
// to start a broker there.
func TestHostCommandsWithoutBrokerNameTheStateDir(t *testing.T) {
	dir := shortDir(t)
	repo := shortDir(t)
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	os.Mkdir(filepath.Join(dir, "rel"), 0o700)
	for _, tc := range []struct {
		env, flag string // $JAILBEE_STATE_DIR, --state
		want      string // the state dir named
	}{
		{env: filepath.Join(dir, "from-env")},
		{env: filepath.Join(dir, "from-env"), flag: filepath.Join(dir, "from-flag"), want: filepath.Join(dir, "from-flag")},
		{flag: "rel", want: filepath.Join(dir, "rel")},
	} {
		if tc.want == "" {
			tc.want = tc.env
		}
		t.Setenv(cli.StateDirEnv, tc.env)
		msg := fmt.Sprintf("jailbee: no broker is running for the state dir %s (start one with 'jailbee broker --state %s', or name another with --state or $JAILBEE_STATE_DIR)\n", tc.want, tc.want)
		for _, args := range [][]string{
			{"ls"},
			{"ls", "--json"},
			{"usage"},
			{"usage", "x", "--json"},
			{"rights", "x", "--json"},
			{"rights", "x", "--add-mount", "data"},
			{"new", "x", "--repo", repo, "--orchestrator"},
			{"new", "x", "--parent", "y"},
			{"exec", "x", "--", "true"},
			{"exec", "x", "--env", "A=b", "--", "true"},
			{"start", "x"},
			{"stop", "x"},
			{"destroy", "x"},
			{"destroy", "x", "--force"},
		} {
			if tc.flag != "" {
				args = append(args[:1:1], append([]string{"--state", tc.flag}, args[1:]...)...)
			}
			var out, errb bytes.Buffer
			code := runWith(t, strings.NewReader(""), &out, &errb, args...)
			if code != cli.ExitUnreachable || out.Len() != 0 || errb.String() != msg {
				t.Errorf("%v (env %q): exit %d stdout %q stderr %q, want exit 4 and %q", args, tc.env, code, out.String(), errb.String(), msg)
			}
		}
	}
}

// TestNewRepoCheckedBeforeTheBroker: a --repo that is missing or not a
// directory fails (exit 1) before any request; a relative one is sent
// absolute.
func TestNewRepoCheckedBeforeTheBroker(t *testing.T) {
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		var a wire.NewArgs
		json.Unmarshal(r.Args, &a)
		return okReply(wire.NewResult{Name: a.Name, UUID: "u", Branch: "main"})
	})
	t.Setenv(cli.StateDirEnv, f.state)
	file := filepath.Join(shortDir(t), "file")
	os.WriteFile(file, nil, 0o600)
	for _, tc := range []struct{ repo, want string }{
		{"/does/not/exist", "jailbee: no such directory: /does/not/exist\n"},
		{file, "jailbee: not a directory: " + file + "\n"},
	} {
		for _, role := range [][]string{{"--orchestrator"}, {"--parent", "lead"}} {
			var out, errb bytes.Buffer
			code := runWith(t, strings.NewReader(""), &out, &errb, append([]string{"new", "x", "--repo", tc.repo}, role...)...)
			if code != cli.ExitFailed || errb.String() != tc.want || out.Len() != 0 {
				t.Errorf("new --repo %s %v: exit %d stdout %q stderr %q, want exit 1 and %q", tc.repo, role, code, out.String(), errb.String(), tc.want)
			}
		}
	}
	if reqs := f.requests(); len(reqs) != 0 {
		t.Fatalf("a missing --repo reached the broker: %d requests", len(reqs))
	}

	parent := shortDir(t)
	os.Mkdir(filepath.Join(parent, "repo"), 0o700)
	wd, _ := os.Getwd()
	os.Chdir(parent)
	defer os.Chdir(wd)
	var out bytes.Buffer
	if code := runWith(t, strings.NewReader(""), &out, io.Discard, "new", "x", "--repo", "repo", "--orchestrator"); code != 0 {
		t.Fatalf("new with a relative --repo: exit %d", code)
	}
	reqs := f.requests()
	var a wire.NewArgs
	if len(reqs) != 1 || json.Unmarshal(reqs[0].Args, &a) != nil || a.Repo != filepath.Join(parent, "repo") {
		t.Fatalf("new with a relative --repo sent %v", reqs)
	}
}

// TestNewGrantFileErrors: a --grant file that is missing, not JSON or
// larger than 64 KiB fails (exit 1) before any request; one of exactly
// 64 KiB is sent as it is.
func TestNewGrantFileErrors(t *testing.T) {
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		return okReply(wire.NewResult{Name: "lead", UUID: "u", Branch: "main"})
	})
	t.Setenv(cli.StateDirEnv, f.state)
	repo := shortDir(t)
	dir := shortDir(t)
	const limit = 64 << 10
	// A JSON document of exactly n bytes.
	doc := func(n int) []byte {
		return []byte(`{"pad":"` + strings.Repeat("a", n-len(`{"pad":""}`)) + `"}`)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "missing.json")
	for _, tc := range []struct {
		path, want string
	}{
		{missing, "jailbee: cannot read the grant file " + missing + ": no such file or directory\n"},
		{write("yaml.json", []byte("mounts: [aws]\n")), "jailbee: the grant file " + filepath.Join(dir, "yaml.json") + " is not JSON (docs/grants.md)\n"},
		{write("empty.json", nil), "jailbee: the grant file " + filepath.Join(dir, "empty.json") + " is not JSON (docs/grants.md)\n"},
		{write("cut.json", doc(limit + 10)[:limit]), "jailbee: the grant file " + filepath.Join(dir, "cut.json") + " is not JSON (docs/grants.md)\n"},
		{write("big.json", doc(limit+1)), fmt.Sprintf("jailbee: the grant file %s is larger than %d bytes\n", filepath.Join(dir, "big.json"), limit)},
		{write("huge.json", doc(4*limit)), fmt.Sprintf("jailbee: the grant file %s is larger than %d bytes\n", filepath.Join(dir, "huge.json"), limit)},
		{dir, "jailbee: the grant file " + dir + " is not JSON (docs/grants.md)\n"},
	} {
		var out, errb bytes.Buffer
		code := runWith(t, strings.NewReader(""), &out, &errb, "new", "lead", "--repo", repo, "--orchestrator", "--grant", tc.path)
		if code != cli.ExitFailed || errb.String() != tc.want || out.Len() != 0 {
			t.Errorf("--grant %s: exit %d stdout %q stderr %q, want exit 1 and %q", tc.path, code, out.String(), errb.String(), tc.want)
		}
	}
	if reqs := f.requests(); len(reqs) != 0 {
		t.Fatalf("a bad --grant reached the broker: %d requests", len(reqs))
	}

	exact := doc(limit)
	var out bytes.Buffer
	if code := runWith(t, strings.NewReader(""), &out, io.Discard, "new", "lead", "--repo", repo, "--orchestrator", "--grant", write("exact.json", exact)); code != 0 || out.String() != "created lead (branch main)\n" {
		t.Fatalf("a 64 KiB grant: exit %d %q", code, out.String())
	}
	reqs := f.requests()
	var a wire.NewArgs
	if len(reqs) != 1 || json.Unmarshal(reqs[0].Args, &a) != nil || !bytes.Equal(a.Grant, exact) {
		t.Fatalf("the 64 KiB grant was not sent as it is")
	}
}

// TestHostCommandsSendTheirRequests: the ops and arguments each host
// command sends, and what it prints of the answer.
func TestHostCommandsSendTheirRequests(t *testing.T) {
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		switch r.Op {
		case "new":
			var a wire.NewArgs
			json.Unmarshal(r.Args, &a)
			return okReply(wire.NewResult{Name: a.Name, UUID: "u-1", Branch: "b-" + a.Name})
		case "destroy":
			return okReply(wire.DestroyResult{Destroyed: 2})
		case "fetch":
			return okReply(wire.FetchResult{Ref: "refs/jailbee/sandboxes/kid/main", SHA: strings.Repeat("a", 40)})
		}
		return okReply(map[string]any{})
	})
	repo := shortDir(t)
	grant := filepath.Join(shortDir(t), "g.json")
	os.WriteFile(grant, []byte(`{"mounts": ["aws"]}`), 0o600)
	for _, tc := range []struct {
		args     []string
		op, want string // the request's op and args
		out      string
	}{
		{[]string{"new", "lead", "--repo", repo, "--orchestrator"}, "new", `{"name":"lead","repo":"` + repo + `","role":"orchestrator"}`, "created lead (branch b-lead)\n"},
		{[]string{"new", "lead", "--repo", repo, "--branch", "dev", "--orchestrator", "--grant", grant}, "new", `{"name":"lead","repo":"` + repo + `","branch":"dev","role":"orchestrator","grant":{"mounts":["aws"]}}`, "created lead (branch b-lead)\n"},
		{[]string{"new", "kid", "--parent", "lead", "--branch", "fix/x"}, "new", `{"name":"kid","branch":"fix/x","role":"child","parent":"lead"}`, "created kid (branch b-kid)\n"},
		{[]string{"new", "kid", "--parent", "lead", "--repo", repo}, "new", `{"name":"kid","repo":"` + repo + `","role":"child","parent":"lead"}`, "created kid (branch b-kid)\n"},
		{[]string{"destroy", "kid"}, "destroy", `{"name":"kid","force":false}`, "destroyed kid\n"},
		{[]string{"destroy", "lead", "--force"}, "destroy", `{"name":"lead","force":true}`, "destroyed lead\n"},
		{[]string{"start", "kid"}, "start", `{"name":"kid"}`, "started kid\n"},
		{[]string{"stop", "kid"}, "stop", `{"name":"kid"}`, "stopped kid\n"},
		{[]string{"fetch", "kid"}, "fetch", `{"name":"kid"}`, "refs/jailbee/sandboxes/kid/main " + strings.Repeat("a", 40) + "\n"},
		{[]string{"fetch", "kid", "--repo", repo, "--branch", "fix/x"}, "fetch", `{"name":"kid","repo":"` + repo + `","branch":"fix/x"}`, "refs/jailbee/sandboxes/kid/main " + strings.Repeat("a", 40) + "\n"},
	} {
		before := len(f.requests())
		var out, errb bytes.Buffer
		code := runWith(t, strings.NewReader(""), &out, &errb, append(tc.args, "--state", f.state)...)
		reqs := f.requests()[before:]
		if code != 0 || out.String() != tc.out || errb.Len() != 0 {
			t.Errorf("%v: exit %d stdout %q stderr %q, want %q", tc.args, code, out.String(), errb.String(), tc.out)
		}
		if len(reqs) != 1 || reqs[0].Op != tc.op || string(reqs[0].Args) != tc.want || len(reqs[0].Files) != 0 {
			t.Errorf("%v sent %v, want one %s %s", tc.args, reqs, tc.op, tc.want)
		}
	}
}

// TestHostCommandsReportRefusals: the broker's refusals go to stderr with
// exit 1; a version mismatch or a busy broker is exit 4.
func TestHostCommandsReportRefusals(t *testing.T) {
	// Set between commands; atomic because the race detector does not see
	// the socket order between the test and the fake.
	var reply atomic.Pointer[wire.Response]
	f := newFakeAdmin(t, func(adminRequest) *wire.Response { return reply.Load() })
	t.Setenv(cli.StateDirEnv, f.state)
	for _, tc := range []struct {
		reply *wire.Response
		code  int
		want  string
	}{
		{errReply(wire.CodeBadRequest, "`kid` has uncommitted changes: commit them, or use --force"), 1, "jailbee: `kid` has uncommitted changes: commit them, or use --force\n"},
		{errReply(wire.CodeNotFound, "no sandbox named kid"), 1, "jailbee: no sandbox named kid\n"},
		{errReply(wire.CodeInternal, "destroy failed: boom"), 1, "jailbee: destroy failed: boom\n"},
		{errReply(wire.CodeVersion, "protocol version 2 required"), 4, "jailbee: protocol version 2 required (jb apply / restart the broker to align versions)\n"},
		{errReply(wire.CodeBusy, "too many connections"), 4, "jailbee: broker busy: too many connections\n"},
		// A detail may quote sandbox- or repository-controlled text: no
		// escape, control or format character of it reaches the terminal,
		// and each of its lines is filtered with the newlines kept.
		{errReply(wire.CodeBadRequest, "unknown key \"\x1b]0;pwned\a\u202ex\"\nline\x9b2\r"), 1, "jailbee: unknown key \" ]0;pwned  x\"\nline 2 \n"},
		{errReply(wire.CodeVersion, "v\x1b[2J"), 4, "jailbee: v [2J (jb apply / restart the broker to align versions)\n"},
		{errReply(wire.CodeBusy, "b\x1b[2J"), 4, "jailbee: broker busy: b [2J\n"},
	} {
		reply.Store(tc.reply)
		for _, args := range [][]string{{"destroy", "kid"}, {"start", "kid"}, {"ls"}, {"usage", "kid"}, {"exec", "kid", "--", "true"}} {
			var out, errb bytes.Buffer
			code := runWith(t, strings.NewReader(""), &out, &errb, args...)
			if code != tc.code || errb.String() != tc.want || out.Len() != 0 {
				t.Errorf("%v answered %s: exit %d stdout %q stderr %q, want exit %d and %q", args, tc.reply.Error.Code, code, out.String(), errb.String(), tc.code, tc.want)
			}
		}
	}
}

// TestLsTableAndJSON: the table has a UNIT column from `running` and a
// TOKENS column from `tokens`; --json prints every field.
func TestLsTableAndJSON(t *testing.T) {
	lead, sock := "lead", "/s/sock/u1.r/broker.sock"
	list := []wire.SandboxInfo{
		{Name: "lead", Role: "orchestrator", State: "running", Running: true, Branch: "main", UUID: "u1", Socket: &sock, Tokens: 12345},
		{Name: "fix-12", Role: "child", Parent: &lead, State: "stopped", Running: false, Branch: "fix/issue-12", UUID: "u2"},
	}
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response { return okReply(list) })
	t.Setenv(cli.StateDirEnv, f.state)
	var out bytes.Buffer
	if code := runWith(t, strings.NewReader(""), &out, io.Discard, "ls"); code != 0 {
		t.Fatalf("ls: exit %d", code)
	}
	want := "NAME    ROLE          PARENT  STATE    UNIT  BRANCH        TOKENS  LAST STATUS\n" +
		"lead    orchestrator  -       running  up    main          12.3k   -\n" +
		"fix-12  child         lead    stopped  down  fix/issue-12  -       -\n"
	if out.String() != want {
		t.Errorf("ls:\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	if code := runWith(t, strings.NewReader(""), &out, io.Discard, "ls", "--json"); code != 0 {
		t.Fatalf("ls --json: exit %d", code)
	}
	var got []map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, out.String())
	}
	if len(got) != 2 || got[0]["running"] != true || got[1]["running"] != false || got[1]["parent"] != "lead" ||
		got[0]["parent"] != nil || got[0]["socket"] != sock || got[1]["socket"] != nil || got[1]["state"] != "stopped" ||
		got[0]["tokens"] != 12345.0 || got[1]["tokens"] != 0.0 {
		t.Errorf("ls --json: %s", out.String())
	}
	reqs := f.requests()
	if len(reqs) != 2 || reqs[0].Op != "ls" || reqs[1].Op != "ls" || len(reqs[0].Args) != 0 {
		t.Errorf("ls sent %v", reqs)
	}
}

// TestExecPassesStreamsAndExitStatus: exec hands the broker three new
// pipes (never its own descriptors) and copies them to and from its
// streams; the exit status is the command's.
func TestExecPassesStreamsAndExitStatus(t *testing.T) {
	type seen struct {
		args  wire.ExecArgs
		nfds  int
		stdin string
	}
	got := make(chan seen, 8)
	var exit atomic.Int64
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		var s seen
		json.Unmarshal(r.Args, &s.args)
		s.nfds = len(r.Files)
		if len(r.Files) != 3 {
			got <- s
			return errReply(wire.CodeBadRequest, "want 3 descriptors")
		}
		for _, f := range r.Files {
			var st unix.Stat_t
			if unix.Fstat(int(f.Fd()), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
				got <- s
				return errReply(wire.CodeBadRequest, "not a pipe")
			}
		}
		in, _ := io.ReadAll(r.Files[0])
		s.stdin = string(in)
		fmt.Fprintf(r.Files[1], "out:%s", in)
		fmt.Fprintf(r.Files[2], "err:%d", len(in))
		got <- s
		return okReply(wire.ExecResult{Exit: int(exit.Load())})
	})
	t.Setenv(cli.StateDirEnv, f.state)
	for _, tc := range []struct {
		exit  int
		stdin string
		args  []string
		want  wire.ExecArgs
	}{
		{0, "", []string{"exec", "kid", "--", "true"}, wire.ExecArgs{Name: "kid", Argv: []string{"true"}}},
		{7, "piped in\n", []string{"exec", "kid", "--env", "A=b", "--env", "C=d=e", "--env", "E=", "--user", "root", "--", "sh", "-c", "exit 7", "--", "x"},
			wire.ExecArgs{Name: "kid", Argv: []string{"sh", "-c", "exit 7", "--", "x"}, User: "root", Env: map[string]string{"A": "b", "C": "d=e", "E": ""}}},
		{127, "", []string{"exec", "kid", "--", "nope"}, wire.ExecArgs{Name: "kid", Argv: []string{"nope"}}},
	} {
		exit.Store(int64(tc.exit))
		var out, errb bytes.Buffer
		code := runWith(t, strings.NewReader(tc.stdin), &out, &errb, tc.args...)
		s := <-got
		if code != tc.exit || out.String() != "out:"+tc.stdin || errb.String() != fmt.Sprintf("err:%d", len(tc.stdin)) {
			t.Errorf("%v: exit %d stdout %q stderr %q", tc.args, code, out.String(), errb.String())
		}
		wantJSON, _ := json.Marshal(tc.want)
		gotJSON, _ := json.Marshal(s.args)
		if s.nfds != 3 || s.stdin != tc.stdin || string(gotJSON) != string(wantJSON) {
			t.Errorf("%v: the broker got %s with %d descriptors and stdin %q, want %s", tc.args, gotJSON, s.nfds, s.stdin, wantJSON)
		}
	}
}

// TestExecTTYGivesANewTerminal: exec -t hands the broker a new terminal
// (not the user's) sized like the user's, passes TERM, keeps the size in
// step on SIGWINCH, copies both ways with the user's terminal in raw mode,
// and restores the user's terminal mode afterwards.
func TestExecTTYGivesANewTerminal(t *testing.T) {
	userMaster, userTTY, err := term.OpenPTY()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer userMaster.Close()
	defer userTTY.Close()
	if err := unix.IoctlSetWinsize(int(userTTY.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 33, Col: 101}); err != nil {
		t.Fatal(err)
	}
	before, err := unix.IoctlGetTermios(int(userTTY.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("TERM", "xterm-jbtest")
	var userRdev uint64
	var st unix.Stat_t
	unix.Fstat(int(userTTY.Fd()), &st)
	userRdev = st.Rdev

	problems := make(chan string, 16)
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		defer close(problems)
		var a wire.ExecArgs
		json.Unmarshal(r.Args, &a)
		if !a.TTY || a.Env["TERM"] != "xterm-jbtest" {
			problems <- fmt.Sprintf("args %+v", a)
		}
		if len(r.Files) != 3 {
			problems <- fmt.Sprintf("%d descriptors", len(r.Files))
			return okReply(wire.ExecResult{Exit: 1})
		}
		var rdev [3]uint64
		for i, f := range r.Files {
			var st unix.Stat_t
			if !term.IsTerminal(f) || unix.Fstat(int(f.Fd()), &st) != nil {
				problems <- fmt.Sprintf("stream %d is not a terminal", i)
			}
			rdev[i] = st.Rdev
		}
		if rdev[0] != rdev[1] || rdev[0] != rdev[2] || rdev[0] == userRdev {
			problems <- fmt.Sprintf("streams are terminals %v (the user's: %d)", rdev, userRdev)
		}
		tty := r.Files[0]
		if ws, err := unix.IoctlGetWinsize(int(tty.Fd()), unix.TIOCGWINSZ); err != nil || ws.Row != 33 || ws.Col != 101 {
			problems <- fmt.Sprintf("size %+v %v, want 33x101", ws, err)
		}
		if tm, err := unix.IoctlGetTermios(int(userTTY.Fd()), unix.TCGETS); err != nil || tm.Lflag&(unix.ICANON|unix.ECHO) != 0 {
			problems <- "the user's terminal is not in raw mode while the command runs"
		}
		// A resize of the user's terminal reaches the command's.
		unix.IoctlSetWinsize(int(userTTY.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 40, Col: 120})
		syscall.Kill(os.Getpid(), syscall.SIGWINCH)
		if !waitFor(10*time.Second, func() bool {
			ws, err := unix.IoctlGetWinsize(int(tty.Fd()), unix.TIOCGWINSZ)
			return err == nil && ws.Row == 40 && ws.Col == 120
		}) {
			problems <- "SIGWINCH did not resize the command's terminal"
		}
		// Input typed on the user's terminal reaches the command.
		userMaster.Write([]byte("typed\r"))
		line := make([]byte, 64)
		tty.SetReadDeadline(time.Now().Add(10 * time.Second)) // hang guard; ignored if not pollable
		n, _ := tty.Read(line)
		if string(line[:n]) != "typed\n" {
			problems <- fmt.Sprintf("the command read %q, want %q", line[:n], "typed\n")
		}
		tty.Write([]byte("from the command\n"))
		return okReply(wire.ExecResult{Exit: 5})
	})
	var out wait.Buffer
	code := runWith(t, userTTY, &out, io.Discard, "exec", "--state", f.state, "-t", "kid", "--", "sh")
	for p := range problems {
		t.Error(p)
	}
	if code != 5 {
		t.Errorf("exit %d, want 5", code)
	}
	if s := out.String(); !strings.Contains(s, "from the command\r\n") {
		t.Errorf("output %q", s)
	}
	after, err := unix.IoctlGetTermios(int(userTTY.Fd()), unix.TCGETS)
	if err != nil || *after != *before {
		t.Errorf("the user's terminal mode was not restored: %+v, was %+v", after, before)
	}
	// exec's copy from the user's terminal is still reading it: a byte ends it.
	userMaster.Write([]byte{'\n'})
}

// TestExecTTYReturnsWhileTheTerminalIsHeld: a process that keeps a copy
// of the command's terminal (here the broker's side keeps one, as a
// sandbox process that took it would) cannot hold exec -t open: once the
// command has ended it returns, with the user's terminal mode restored.
func TestExecTTYReturnsWhileTheTerminalIsHeld(t *testing.T) {
	userMaster, userTTY, err := term.OpenPTY()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer userMaster.Close()
	defer userTTY.Close()
	before, err := unix.IoctlGetTermios(int(userTTY.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan int, 1)
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		if len(r.Files) != 3 {
			return okReply(wire.ExecResult{Exit: 1})
		}
		fd, err := unix.FcntlInt(r.Files[0].Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err == nil {
			held <- fd
		}
		r.Files[1].Write([]byte("before the end\n"))
		return okReply(wire.ExecResult{Exit: 3})
	})
	var out wait.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runWith(t, userTTY, &out, io.Discard, "exec", "--state", f.state, "-t", "kid", "--", "sh")
	}()
	select {
	case code := <-done:
		if code != 3 {
			t.Errorf("exit %d, want 3", code)
		}
	case <-time.After(time.Minute):
		t.Fatal("exec -t did not return while a copy of its terminal was held (hang guard)")
	}
	select {
	case fd := <-held:
		defer unix.Close(fd)
	default:
		t.Fatal("the broker's side kept no copy of the terminal")
	}
	after, err := unix.IoctlGetTermios(int(userTTY.Fd()), unix.TCGETS)
	if err != nil || *after != *before {
		t.Errorf("the user's terminal mode was not restored: %+v, was %+v", after, before)
	}
	if s := out.String(); !strings.Contains(s, "before the end\r\n") {
		t.Errorf("output %q", s)
	}
	// exec's copy from the user's terminal is still reading it: a byte ends it.
	userMaster.Write([]byte{'\n'})
}

// waitFor polls cond until it holds or limit passes (a hang guard).
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// TestExecOutputToATerminalIsPrintable: without -t, what the sandboxed
// command writes reaches the user's terminal with nothing in it a
// terminal acts on (an OSC 52 clipboard write, a screen clear, a carriage
// return rewriting a line), newlines kept; --raw passes it byte for byte;
// output to a pipe or file is always byte for byte.
func TestExecOutputToATerminalIsPrintable(t *testing.T) {
	const hostile = "\x1b]52;c;SGVsbG8=\x07copied\n\x1b[2Jcleared\rfake\n"
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		if len(r.Files) == 3 {
			r.Files[1].Write([]byte(hostile))
			r.Files[2].Write([]byte(hostile))
		}
		return okReply(wire.ExecResult{Exit: 0})
	})
	onTerminal := func(args ...string) string {
		t.Helper()
		master, tty, err := term.OpenPTY()
		if err != nil {
			t.Skipf("no pty: %v", err)
		}
		defer master.Close()
		var shown wait.Buffer
		done := make(chan struct{})
		go func() { io.Copy(&shown, master); close(done) }()
		if code := runWith(t, strings.NewReader(""), tty, tty, append([]string{"exec", "--state", f.state}, args...)...); code != 0 {
			t.Fatalf("exec %v: exit %d", args, code)
		}
		tty.Close()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("the terminal's output did not end (hang guard)")
		}
		return shown.String()
	}
	got := onTerminal("sb", "--", "cat")
	if strings.ContainsAny(got, "\x1b\x07") || strings.Count(got, "copied") != 2 || strings.Count(got, "cleared fake") != 2 {
		t.Errorf("exec to a terminal showed %q", got)
	}
	if got := onTerminal("--raw", "sb", "--", "cat"); strings.Count(got, "\x1b]52;c;") != 2 {
		t.Errorf("exec --raw to a terminal showed %q", got)
	}
	var out bytes.Buffer
	if code := runWith(t, strings.NewReader(""), &out, io.Discard, "exec", "--state", f.state, "sb", "--", "cat"); code != 0 || out.String() != hostile {
		t.Errorf("exec to a pipe: exit %d, %q", code, out.String())
	}
}
