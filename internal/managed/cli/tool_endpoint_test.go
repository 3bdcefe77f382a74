package cli_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/managed/cli"
	"agentbox/internal/managed/endpoint"
	"agentbox/internal/managed/provider"
)

const toolFrame = `{"version":"1","run_id":"run-1","lease_id":"lease-1","consumer":"agent","request_id":"req-1","payload":{"tool":"payload-secret"}}`

// waitToolSocket waits until a socket exists at path, or serve ended.
func waitToolSocket(t *testing.T, path string, done <-chan result) {
	t.Helper()
	for range 1000 {
		if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
			return
		}
		select {
		case r := <-done:
			t.Fatalf("serve ended: %d %q", r.code, r.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("no socket at %s", path)
}

// serveInProcess runs `tool-endpoint serve` in-process on a fresh socket.
func serveInProcess(t *testing.T, args ...string) (string, <-chan result) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "tool.sock")
	done := make(chan result, 1)
	go func() {
		done <- runCLI(t, nil, append([]string{"tool-endpoint", "serve", "--socket", sock}, args...)...)
	}()
	waitToolSocket(t, sock, done)
	return sock, done
}

func TestToolEndpointServeAnswers(t *testing.T) {
	// The handler reads the frame and reports its environment.
	script := `frame=$(cat); case "$frame" in *payload-secret*) ;; *) exit 3;; esac; ` +
		`printf '{"ok": true, "id": "%s", "path": "%s", "home": "%s"}\n' "$BRANCHBOX_TOOL_REQUEST_ID" "$PATH" "${HOME-unset}"`
	sock, done := serveInProcess(t, "--handler", "/bin/sh", "--max-requests", "1", "--", "-c", script)
	resp, err := endpoint.Relay(context.Background(), sock, []byte(toolFrame))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":"1","run_id":"run-1","lease_id":"lease-1","consumer":"agent","request_id":"req-1","payload":{"ok":true,"id":"req-1","path":"` + provider.SafePATH + `","home":"unset"}}` + "\n"
	if string(resp) != want {
		t.Fatalf("response %q\nwant     %q", resp, want)
	}
	r := <-done
	if r.code != cli.ExitOK {
		t.Fatalf("exit %d: %q", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, `request "req-1": answered`) || strings.Contains(r.stderr, "payload-secret") {
		t.Fatalf("stderr %q", r.stderr)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the socket remains: %v", err)
	}
}

func TestToolEndpointServeExample(t *testing.T) {
	sock, done := serveInProcess(t, "--handler", "/bin/sh", "--max-requests", "1", "--", "-c", `cat >/dev/null; echo "{\"ok\":true}"`)
	resp, err := endpoint.Relay(context.Background(), sock, []byte(toolFrame))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(resp), `"request_id":"req-1","payload":{"ok":true}}`+"\n") {
		t.Fatalf("response %q", resp)
	}
	if r := <-done; r.code != cli.ExitOK {
		t.Fatalf("exit %d: %q", r.code, r.stderr)
	}
}

func TestToolEndpointServeHandlerFailures(t *testing.T) {
	// By request id: exit 1, invalid JSON, two values, over the limit,
	// killed by a signal; anything else answers.
	script := `cat >/dev/null; case "$BRANCHBOX_TOOL_REQUEST_ID" in
fail) echo '{"partial":"handler-secret"}'; exit 1;;
invalid) echo '{"handler-secret":';;
two) echo '1 2';;
empty) ;;
big) head -c 300000 /dev/zero | tr '\0' 7;;
killed) kill -9 $$;;
*) echo '"fine"';;
esac`
	sock, done := serveInProcess(t, "--handler", "sh", "--max-requests", "1", "--", "-c", script)
	for _, id := range []string{"fail", "invalid", "two", "empty", "big", "killed"} {
		frame := strings.Replace(toolFrame, `"req-1"`, `"`+id+`"`, 1)
		_, err := endpoint.Relay(context.Background(), sock, []byte(frame))
		var te *endpoint.TransportError
		if !errors.As(err, &te) {
			t.Fatalf("%s: err %v", id, err)
		}
	}
	if _, err := endpoint.Relay(context.Background(), sock, []byte(toolFrame)); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.code != cli.ExitOK {
		t.Fatalf("exit %d: %q", r.code, r.stderr)
	}
	for _, want := range []string{
		`request "fail": no response: the handler exited with status 1`,
		`request "invalid": no response: the handler's output is not one JSON value`,
		`request "two": no response: the handler's output is not one JSON value`,
		`request "empty": no response: the handler's output is not one JSON value`,
		`request "big": no response: the handler's output is over 262144 bytes`,
		`request "killed": no response: the handler was killed by a signal`,
		`request "req-1": answered`,
	} {
		if !strings.Contains(r.stderr, want+"\n") {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "secret") {
		t.Fatalf("stderr holds a payload:\n%s", r.stderr)
	}
}

func TestToolEndpointServeRefusals(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--socket", file, "--handler", "/bin/true"},
		{"--socket", filepath.Join(dir, "s.sock"), "--handler", filepath.Join(dir, "missing")},
		{"--socket", filepath.Join(dir, "s.sock"), "--handler", "no-such-handler-anywhere"},
		{"--socket", filepath.Join(dir, "s.sock"), "--handler", file}, // not executable
	} {
		r := runCLI(t, nil, append([]string{"tool-endpoint", "serve"}, args...)...)
		if r.code != cli.ExitRefused || !strings.HasPrefix(r.stderr, "branchbox: ") {
			t.Errorf("%q: exit %d %q", args, r.code, r.stderr)
		}
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep" {
		t.Fatalf("the regular file changed: %q %v", b, err)
	}
}

func TestToolEndpointUsage(t *testing.T) {
	for _, args := range [][]string{
		{"tool-endpoint"},
		{"tool-endpoint", "bogus"},
		{"tool-endpoint", "serve"},
		{"tool-endpoint", "serve", "--handler", "/bin/true"},
		{"tool-endpoint", "serve", "--socket", "/tmp/x.sock"},
		{"tool-endpoint", "serve", "--socket", "", "--handler", "/bin/true"},
		{"tool-endpoint", "serve", "--socket", "/tmp/x.sock", "--handler", "/bin/true", "stray"},
		{"tool-endpoint", "serve", "--socket", "/tmp/x.sock", "--handler", "/bin/true", "stray", "--", "a"},
		{"tool-endpoint", "serve", "--socket", "/tmp/x.sock", "--handler", "/bin/true", "--max-requests", "-1"},
		{"tool-endpoint", "serve", "--socket", "/tmp/x.sock", "--handler", "/bin/true", "--max-requests", "x"},
	} {
		r := runCLI(t, nil, args...)
		if r.code != cli.ExitUsage || !strings.Contains(r.stderr, "--help") {
			t.Errorf("%q: exit %d stderr %q", args, r.code, r.stderr)
		}
	}
	for _, args := range [][]string{{"tool-endpoint", "--help"}, {"tool-endpoint", "serve", "--help"}} {
		r := runCLI(t, nil, args...)
		if r.code != cli.ExitOK || !strings.Contains(r.stdout, "tool-endpoint serve --socket PATH") {
			t.Errorf("%q: exit %d %q", args, r.code, r.stdout)
		}
	}
	if r := runCLI(t, nil, "tool-endpoint", "serve", "--help"); !strings.Contains(r.stdout, "Exit status") || !strings.Contains(r.stdout, cli.ToolRequestIDEnv) {
		t.Errorf("help %q", r.stdout)
	}
}

// TestToolEndpointBinarySignal runs serve as a real process: it answers
// until SIGTERM, then exits 0 with its socket removed.
func TestToolEndpointBinarySignal(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go toolchain in PATH")
	}
	bin := filepath.Join(t.TempDir(), "branchbox")
	if out, err := exec.Command(gobin, "build", "-o", bin, "agentbox/cmd/branchbox").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		sock := filepath.Join(t.TempDir(), "tool.sock")
		cmd := exec.Command(bin, "tool-endpoint", "serve", "--socket", sock, "--handler", "/bin/sh", "--", "-c", `cat >/dev/null; echo '{"ok":true}'`)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		for i := 0; ; i++ {
			if fi, err := os.Lstat(sock); err == nil && fi.Mode().Type() == fs.ModeSocket {
				break
			}
			if i == 1000 {
				cmd.Process.Kill()
				t.Fatalf("no socket: %s", stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		for range 2 {
			resp, err := endpoint.Relay(context.Background(), sock, []byte(toolFrame))
			if err != nil || !strings.HasSuffix(string(resp), `"payload":{"ok":true}}`+"\n") {
				t.Fatalf("%q %v", resp, err)
			}
		}
		cmd.Process.Signal(sig)
		if err := <-waited; err != nil {
			t.Fatalf("%v: exit %v: %s", sig, err, stderr.String())
		}
		if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%v: the socket remains: %v", sig, err)
		}
		if n := strings.Count(stderr.String(), `request "req-1": answered`); n != 2 {
			t.Fatalf("stderr %q", stderr.String())
		}
	}
}
