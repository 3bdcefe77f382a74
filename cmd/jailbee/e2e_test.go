package main_test

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// jailbeeBin is a jailbee binary built once for these tests, statically
// (CGO_ENABLED=0), as it is bound into sandboxes.
var jailbeeBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jbbin")
	if err != nil {
		panic(err)
	}
	jailbeeBin = filepath.Join(dir, "jailbee")
	build := exec.Command("go", "build", "-o", jailbeeBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestStaticBinary(t *testing.T) {
	f, err := elf.Open(jailbeeBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the CGO_ENABLED=0 build needs a dynamic loader")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("the static build links %v", libs)
	}
}

// hostEnv runs a real broker process on a temp state dir.
type hostEnv struct {
	t     *testing.T
	state string
	repo  string
	env   []string
}

func newHostEnv(t *testing.T) *hostEnv {
	t.Helper()
	dir, err := os.MkdirTemp("", "jbe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &hostEnv{t: t, state: filepath.Join(dir, "s"), repo: filepath.Join(dir, "repo")}
	h.env = append(os.Environ(), "JAILBEE_STATE_DIR="+h.state)
	h.git("init", "-q", "-b", "main", h.repo)
	os.WriteFile(filepath.Join(h.repo, "README"), []byte("hello\n"), 0o644)
	h.git("-C", h.repo, "add", ".")
	h.git("-C", h.repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "init")

	broker := exec.Command(jailbeeBin, "broker")
	broker.Env = h.env
	var log bytes.Buffer
	broker.Stderr = &log
	if err := broker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		broker.Process.Signal(syscall.SIGTERM)
		broker.Wait()
		if t.Failed() {
			t.Logf("broker log:\n%s", log.String())
		}
	})
	for range 100 {
		if _, err := os.Stat(filepath.Join(h.state, "admin.sock")); err == nil {
			return h
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("broker did not start:\n%s", log.String())
	return nil
}

func (h *hostEnv) git(args ...string) {
	h.t.Helper()
	if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
		h.t.Fatalf("git %v: %v %s", args, err, out)
	}
}

// jb runs the jailbee binary on the host; returns exit code and output.
func (h *hostEnv) jb(stdin string, args ...string) (int, string, string) {
	h.t.Helper()
	cmd := exec.Command(jailbeeBin, args...)
	cmd.Env = h.env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		h.t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

func (h *hostEnv) mustJB(args ...string) string {
	h.t.Helper()
	code, out, errs := h.jb("", args...)
	if code != 0 {
		h.t.Fatalf("jailbee %v: exit %d\n%s%s", args, code, out, errs)
	}
	return out
}

func TestHostCommandsAndInboxInsideSandboxes(t *testing.T) {
	h := newHostEnv(t)
	h.mustJB("new", "lead", "--repo", h.repo, "--orchestrator")
	h.mustJB("new", "fix-12", "--branch", "fix/issue-12", "--parent", "lead")

	var list []map[string]any
	if err := json.Unmarshal([]byte(h.mustJB("ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("ls --json = %v", list)
	}
	byName := map[string]map[string]any{}
	for _, s := range list {
		for _, k := range []string{"name", "role", "parent", "state", "branch", "uuid", "socket"} {
			if _, ok := s[k]; !ok {
				t.Errorf("ls --json entry lacks %q: %v", k, s)
			}
		}
		byName[s["name"].(string)] = s
	}
	if l, c := byName["lead"], byName["fix-12"]; l["role"] != "orchestrator" || l["parent"] != nil || l["branch"] != "main" ||
		c["role"] != "child" || c["parent"] != "lead" || c["branch"] != "fix/issue-12" || c["state"] != "running" {
		t.Fatalf("ls --json = %v", list)
	}
	sock, _ := byName["lead"]["socket"].(string)
	if !strings.HasPrefix(sock, filepath.Join(h.state, "sock")+"/") {
		t.Errorf("socket %q is not under the state dir", sock)
	}

	// Inside: non-root, the checkout, the socket, the client on PATH.
	out := h.mustJB("exec", "fix-12", "--", "sh", "-c", "id -u; cat README; git branch --show-current; git remote | wc -l; test -S /run/jailbee/orchestration/broker.sock && echo sock; command -v jailbee")
	if out != "1000\nhello\nfix/issue-12\n0\nsock\n/run/jailbee/bin/jailbee\n" {
		t.Fatalf("inside the child: %q", out)
	}
	// Exit status and stdin pass through.
	if code, _, _ := h.jb("", "exec", "lead", "--", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exit status through exec: %d", code)
	}
	if code, out, _ := h.jb("piped in", "exec", "lead", "--", "cat"); code != 0 || out != "piped in" {
		t.Errorf("stdin through exec: %d %q", code, out)
	}

	// A message round trip through the inbox client inside both sandboxes.
	if out := h.mustJB("exec", "lead", "--", "jailbee", "inbox", "send", "message", "--to", "fix-12", "--id", "reply-0004", "--text", "Use the existing parser.", "--wait"); out != "reply-0004\ndone: delivered to fix-12\n" {
		t.Fatalf("send from the orchestrator: %q", out)
	}
	var items []map[string]any
	json.Unmarshal([]byte(h.mustJB("exec", "fix-12", "--", "jailbee", "inbox", "ls", "--json")), &items)
	if len(items) != 1 || items[0]["from"] != "lead" || items[0]["origin_id"] != "reply-0004" {
		t.Fatalf("child inbox: %v", items)
	}
	hid := items[0]["id"].(string)
	h.mustJB("exec", "fix-12", "--", "sh", "-c", "echo 'Which parser?' | jailbee inbox send message --kind question --reply-to "+hid+" --id msg-0002")
	json.Unmarshal([]byte(h.mustJB("exec", "lead", "--", "jailbee", "inbox", "ls", "--json")), &items)
	if len(items) != 1 || items[0]["in_reply_to"] != "reply-0004" || items[0]["kind"] != "question" || items[0]["origin_id"] != "msg-0002" {
		t.Fatalf("orchestrator inbox: %v", items)
	}

	// A child cannot message another orchestrator's child, nor list children.
	if code, _, errs := h.jb("", "exec", "fix-12", "--", "jailbee", "inbox", "children"); code != 1 || !strings.Contains(errs, "for orchestrators") {
		t.Errorf("children from a child: %d %q", code, errs)
	}

	// Destroy: refused while the child's checkout is dirty, then forced.
	h.mustJB("exec", "fix-12", "--", "sh", "-c", "echo dirty > new-file")
	if code, _, errs := h.jb("", "destroy", "fix-12"); code != 1 || !strings.Contains(errs, "uncommitted changes") {
		t.Fatalf("destroy of a dirty child: %d %q", code, errs)
	}
	if code, _, errs := h.jb("", "destroy", "lead"); code != 1 || !strings.Contains(errs, "children") {
		t.Fatalf("destroy of an orchestrator with children: %d %q", code, errs)
	}
	h.mustJB("destroy", "lead", "--force")
	if out := h.mustJB("ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("after destroy --force: %s", out)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind after destroy: %v", err)
	}
}

func TestHostCommandsWithoutBroker(t *testing.T) {
	dir, _ := os.MkdirTemp("", "jbn")
	defer os.RemoveAll(dir)
	h := &hostEnv{t: t, env: append(os.Environ(), "JAILBEE_STATE_DIR="+dir)}
	code, _, errs := h.jb("", "ls")
	if code != 4 || !strings.Contains(errs, "no broker is running") {
		t.Fatalf("ls without a broker: %d %q", code, errs)
	}
	if code, _, _ := h.jb("", "new", "x", "--orchestrator", "--parent", "y", "--repo", "/"); code != 2 {
		t.Fatalf("new with both roles: exit %d, want 2", code)
	}
}

func TestSecondBrokerProcessRefused(t *testing.T) {
	h := newHostEnv(t)
	code, _, errs := h.jb("", "broker")
	if code != 1 || !strings.Contains(errs, "another broker holds the state dir") {
		t.Fatalf("second broker: exit %d %q", code, errs)
	}
}
