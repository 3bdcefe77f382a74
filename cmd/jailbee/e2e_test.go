package main_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/backend/incus"
	"agentbox/internal/backend/incus/incustest"
	"agentbox/internal/backend/local"
	"agentbox/internal/term"
	"agentbox/internal/testutil/contain"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/testutil/wait"
)

// TestMain builds jailbee (static, as it is bound into sandboxes) while
// the build cache is writable, then runs the tests contained: as root,
// everything but a scratch dir (TMPDIR) is read-only to them, and to the
// brokers and sandboxes they start.
func TestMain(m *testing.M) { contain.Main(m, testbin.Prebuild, testbin.Cleanup) }

// Hang guards: how long a command or a condition may take before the test
// gives up on it. Never asserted as timings.
const (
	commandGuard = 3 * time.Minute
	waitGuard    = 60 * time.Second
)

func TestStaticBinary(t *testing.T) {
	f, err := elf.Open(testbin.Jailbee(t))
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

// hostEnv runs a real broker process (the built binary) on a temp state
// dir, with a host repository.
type hostEnv struct {
	t     *testing.T
	bin   string
	dir   string // the test's temp dir: state, repo, broker log
	state string
	repo  string
	env   []string

	broker     *exec.Cmd
	brokerDone chan struct{}
	// incusProject, under incustest.BackendEnv=incus: the broker's
	// sandboxes are Incus containers in this project.
	incusProject string
}

// newHostEnv starts a broker. Every sandbox the test makes is destroyed
// when it ends: sandboxes outlive the broker and the test process.
func newHostEnv(t *testing.T) *hostEnv {
	t.Helper()
	// Short: a sandbox's socket path is <state>/sock/<uuid>.<16 hex>/broker.sock.
	dir, err := os.MkdirTemp("", "e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &hostEnv{t: t, bin: testbin.Jailbee(t), dir: dir, state: filepath.Join(dir, "s"), repo: filepath.Join(dir, "repo")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "JAILBEE_") {
			h.env = append(h.env, kv)
		}
	}
	h.env = append(h.env, "JAILBEE_STATE_DIR="+h.state)
	h.incusProject = incustest.ProjectFromEnv(t)
	h.git("init", "-q", "-b", "main", h.repo)
	os.WriteFile(filepath.Join(h.repo, "README"), []byte("hello\n"), 0o644)
	h.git("-C", h.repo, "add", ".")
	h.git("-C", h.repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "init")

	// Runs after the broker is stopped (cleanups run last first): whatever
	// a failed test left running is destroyed through the backend itself.
	t.Cleanup(func() { h.destroyLeftovers() })
	h.startBroker()
	t.Cleanup(func() {
		h.stopBroker()
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "broker.log"))
			t.Logf("broker log:\n%s", log)
		}
	})
	return h
}

// startBroker starts `jailbee broker` and waits until it serves.
func (h *hostEnv) startBroker() {
	h.t.Helper()
	args := []string{"broker"}
	if h.incusProject != "" {
		args = append(args, "--backend", incus.Type, "--incus-project", h.incusProject)
		if pool := incustest.Pool(); pool != "" {
			args = append(args, "--incus-pool", pool)
		}
	}
	if os.Geteuid() != 0 {
		args = append(args, "--no-limits") // no cgroups for an unprivileged broker on v1
	}
	logf, err := os.OpenFile(filepath.Join(h.dir, "broker.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		h.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(h.bin, args...)
	cmd.Env = h.env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	h.broker, h.brokerDone = cmd, done
	// A killed broker leaves its admin.sock behind: wait until it answers.
	deadline := time.Now().Add(waitGuard)
	for {
		if c, err := net.Dial("unix", filepath.Join(h.state, "admin.sock")); err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(h.dir, "broker.log"))
			h.t.Fatalf("broker exited: %v\n%s", cmd.ProcessState, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			h.t.Fatal("broker did not start serving")
		}
	}
}

// stopBroker stops the broker as an interrupt does (sandboxes go on).
func (h *hostEnv) stopBroker() {
	if h.broker == nil {
		return
	}
	h.broker.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.brokerDone:
	case <-time.After(waitGuard):
		h.t.Errorf("broker did not stop on SIGTERM")
		h.broker.Process.Kill()
		<-h.brokerDone
	}
	h.broker = nil
}

// killBroker kills the broker with SIGKILL.
func (h *hostEnv) killBroker() {
	h.broker.Process.Kill()
	<-h.brokerDone
	h.broker = nil
}

// destroyLeftovers destroys every sandbox left under the state dir (on
// Incus, the test's project goes with everything in it).
func (h *hostEnv) destroyLeftovers() {
	root := filepath.Join(h.state, "sandboxes")
	if _, err := os.Stat(root); err != nil {
		return
	}
	be, err := local.New(local.Options{Root: root, Binary: h.bin, NoLimits: os.Geteuid() != 0})
	if err != nil {
		h.t.Errorf("open the backend to destroy leftovers: %v", err)
		return
	}
	insts, err := be.List(context.Background())
	if err != nil {
		h.t.Errorf("list leftovers: %v", err)
	}
	for _, in := range insts {
		if err := be.Destroy(context.Background(), in.Name); err != nil {
			h.t.Errorf("destroy leftover %s: %v", in.Name, err)
		}
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), commandGuard)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Env = h.env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		h.t.Fatalf("jailbee %v did not finish (hang guard)\n%s%s", args, out.String(), errb.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		h.t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

// jbOnTerminal starts jb with args in a new session whose controlling
// terminal is tty, as a user's shell would; exited gets its end.
func (h *hostEnv) jbOnTerminal(tty *os.File, termName string, args ...string) (*exec.Cmd, chan error) {
	h.t.Helper()
	cmd := exec.Command(h.bin, args...)
	cmd.Env = append(append([]string{}, h.env...), "TERM="+termName)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return cmd, exited
}

func (h *hostEnv) mustJB(args ...string) string {
	h.t.Helper()
	code, out, errs := h.jb("", args...)
	if code != 0 {
		h.t.Fatalf("jailbee %v: exit %d\n%s%s", args, code, out, errs)
	}
	return out
}

// newSandbox creates a sandbox with jb new and destroys it (--force) when
// the test ends, while the broker still runs.
func (h *hostEnv) newSandbox(args ...string) {
	h.t.Helper()
	h.mustJB(append([]string{"new"}, args...)...)
	name := args[0]
	h.t.Cleanup(func() {
		if h.broker != nil {
			h.jb("", "destroy", name, "--force")
		}
	})
}

// ls returns `jb ls --json` by name.
func (h *hostEnv) ls() map[string]map[string]any {
	h.t.Helper()
	var list []map[string]any
	if err := json.Unmarshal([]byte(h.mustJB("ls", "--json")), &list); err != nil {
		h.t.Fatal(err)
	}
	byName := map[string]map[string]any{}
	for _, s := range list {
		byName[s["name"].(string)] = s
	}
	return byName
}

// sandboxDir is a sandbox's directory on the host: gone with the sandbox.
func (h *hostEnv) sandboxDir(name string) string {
	if h.incusProject != "" {
		return filepath.Dir(incustest.RootFS(h.incusProject, name))
	}
	return filepath.Join(h.state, "sandboxes", name)
}

// hostPath is the host path of a sandbox's checkout (sub "checkout") or
// its agent's home ("home").
func (h *hostEnv) hostPath(name, sub string) string {
	if h.incusProject == "" {
		return filepath.Join(h.sandboxDir(name), sub)
	}
	inside := map[string]string{"checkout": incus.WorkspacePath, "home": incus.HomePath}[sub]
	return filepath.Join(incustest.RootFS(h.incusProject, name), inside)
}

// sandboxProcesses lists the host processes of sandbox name: those of its
// host uid on the local backend; on Incus, where every container shares
// one idmap, those in its container's cgroup.
func (h *hostEnv) sandboxProcesses(name string, uid int) []string {
	if h.incusProject == "" {
		return processesOf(uid)
	}
	var out []string
	for _, pid := range incustest.ContainerPIDs(h.incusProject, name) {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		out = append(out, strconv.Itoa(pid)+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return out
}

// hostUID is the host uid a sandbox's agent runs as: its checkout's owner
// on the local backend, the agent uid through the idmap on Incus (whose
// idmapped mounts leave files with the container's own ids on disk).
func (h *hostEnv) hostUID(name string) int {
	h.t.Helper()
	if h.incusProject != "" {
		return incustest.HostUID(h.t, h.incusProject, name, 1000)
	}
	fi, err := os.Stat(h.hostPath(name, "checkout"))
	if err != nil {
		h.t.Fatal(err)
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

// beat reads the counter the heartbeat loop writes, with jb exec.
func (h *hostEnv) beat(name string) int {
	h.t.Helper()
	out := h.mustJB("exec", name, "--", "cat", "/home/agent/beat")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		h.t.Fatalf("heartbeat of %s: %q", name, out)
	}
	return n
}

// startHeartbeat starts a loop in the background of a sandbox, with jb
// exec, that counts in /home/agent/beat; it returns once the loop counts.
func (h *hostEnv) startHeartbeat(name string) {
	h.t.Helper()
	h.mustJB("exec", name, "--", "sh", "-c",
		`nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /home/agent/beat.tmp; mv /home/agent/beat.tmp /home/agent/beat; sleep 0.1; done' >/dev/null 2>&1 &`)
	wait.For(h.t, "the heartbeat to start", func() bool {
		_, err := os.Stat(filepath.Join(h.hostPath(name, "home"), "beat"))
		return err == nil
	})
}

// waitBeatAdvances waits until the heartbeat counter passes its value now.
func (h *hostEnv) waitBeatAdvances(name string) {
	h.t.Helper()
	first := h.beat(name)
	wait.For(h.t, "the heartbeat of "+name+" to advance", func() bool { return h.beat(name) > first })
}

// processesOf lists the live host processes with uid as a real,
// effective, saved or filesystem uid (from /proc/<pid>/status: a
// non-dumpable process's /proc directory is root's). Zombies are left out:
// they run nothing, and the unit's bubblewrap stays one until the broker
// that started it reaps it, just after destroy.
func processesOf(uid int) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		status, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		if regexp.MustCompile(`(?m)^State:\s+[ZX]`).Match(status) {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ids, ok := strings.CutPrefix(line, "Uid:"); ok {
				for _, f := range strings.Fields(ids) {
					if f == strconv.Itoa(uid) {
						cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
						out = append(out, e.Name()+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
						break
					}
				}
			}
		}
	}
	return out
}

func TestHostCommandsAndInboxInsideSandboxes(t *testing.T) {
	h := newHostEnv(t)
	h.newSandbox("lead", "--repo", h.repo, "--orchestrator")
	h.newSandbox("fix-12", "--branch", "fix/issue-12", "--parent", "lead")

	var list []map[string]any
	if err := json.Unmarshal([]byte(h.mustJB("ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("ls --json = %v", list)
	}
	byName := map[string]map[string]any{}
	for _, s := range list {
		for _, k := range []string{"name", "role", "parent", "state", "running", "branch", "uuid", "socket"} {
			if _, ok := s[k]; !ok {
				t.Errorf("ls --json entry lacks %q: %v", k, s)
			}
		}
		byName[s["name"].(string)] = s
	}
	if l, c := byName["lead"], byName["fix-12"]; l["role"] != "orchestrator" || l["parent"] != nil || l["branch"] != "main" || l["running"] != true ||
		c["role"] != "child" || c["parent"] != "lead" || c["branch"] != "fix/issue-12" || c["state"] != "running" || c["running"] != true {
		t.Fatalf("ls --json = %v", list)
	}
	sock, _ := byName["lead"]["socket"].(string)
	if !strings.HasPrefix(sock, filepath.Join(h.state, "sock")+"/") {
		t.Errorf("socket %q is not under the state dir", sock)
	}
	table := h.mustJB("ls")
	if !regexp.MustCompile(`(?m)^NAME +ROLE +PARENT +STATE +UNIT +BRANCH +TOKENS +LAST STATUS$`).MatchString(table) ||
		!regexp.MustCompile(`(?m)^fix-12 +child +lead +running +up +fix/issue-12 +- +-$`).MatchString(table) {
		t.Errorf("ls:\n%s", table)
	}

	// Inside: non-root, the checkout, the socket, the client on PATH.
	out := h.mustJB("exec", "fix-12", "--", "sh", "-c", "id -u; pwd; cat README; git branch --show-current; git remote | wc -l; test -S /run/jailbee/orchestration/broker.sock && echo sock; command -v jailbee")
	client := "/run/jailbee/bin/jailbee"
	if h.incusProject != "" {
		client = incus.ClientPath
	}
	if out != "1000\n/workspace\nhello\nfix/issue-12\n0\nsock\n"+client+"\n" {
		t.Fatalf("inside the child: %q", out)
	}

	// A message round trip through the inbox client inside both sandboxes.
	if out := h.mustJB("exec", "lead", "--", "jailbee", "inbox", "send", "message", "--child", "fix-12", "--id", "reply-0004", "--text", "Use the existing parser.", "--wait"); out != "reply-0004\ndone: delivered to fix-12\n" {
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

	// A child cannot list children.
	if code, _, errs := h.jb("", "exec", "fix-12", "--", "jailbee", "inbox", "children"); code != 1 || !strings.Contains(errs, "for orchestrators") {
		t.Errorf("children from a child: %d %q", code, errs)
	}

	// Destroy: refused while the child's checkout is dirty, or while it has
	// commits never imported, and for an orchestrator with children.
	h.mustJB("exec", "fix-12", "--", "sh", "-c", "echo dirty > new-file")
	if code, _, errs := h.jb("", "destroy", "fix-12"); code != 1 || !strings.Contains(errs, "uncommitted changes") {
		t.Fatalf("destroy of a dirty child: %d %q", code, errs)
	}
	h.mustJB("exec", "fix-12", "--", "sh", "-c", "git add new-file && git -c user.name=a -c user.email=a@e commit -qm work")
	if code, _, errs := h.jb("", "destroy", "fix-12"); code != 1 || !strings.Contains(errs, "never imported") {
		t.Fatalf("destroy of a child with new commits: %d %q", code, errs)
	}
	if code, _, errs := h.jb("", "destroy", "lead"); code != 1 || !strings.Contains(errs, "children") {
		t.Fatalf("destroy of an orchestrator with children: %d %q", code, errs)
	}
	if got := h.mustJB("destroy", "lead", "--force"); got != "destroyed lead\n" {
		t.Errorf("destroy --force: %q", got)
	}
	if out := h.mustJB("ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("after destroy --force: %s", out)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind after destroy: %v", err)
	}
	for _, name := range []string{"lead", "fix-12"} {
		if _, err := os.Stat(h.sandboxDir(name)); !os.IsNotExist(err) {
			t.Errorf("%s's directory left behind: %v", name, err)
		}
	}
}

// TestExecStreamsExitStatusAndStoppedSandbox: jb exec passes stdin,
// stdout and stderr apart and the command's exit status; a missing
// command is 127; a stopped sandbox is refused (exit 1) until started.
func TestExecStreamsExitStatusAndStoppedSandbox(t *testing.T) {
	h := newHostEnv(t)
	h.newSandbox("box", "--repo", h.repo, "--orchestrator")

	code, out, errs := h.jb("line one\nline two\n", "exec", "box", "--", "sh", "-c", "cat; echo to-stderr >&2; exit 3")
	if code != 3 || out != "line one\nline two\n" || errs != "to-stderr\n" {
		t.Errorf("exec: exit %d stdout %q stderr %q", code, out, errs)
	}
	code, out, _ = h.jb("", "exec", "box", "--env", "GREETING=hi there", "--env", "EMPTY=", "--", "sh", "-c", `echo "$GREETING|${EMPTY-unset}|$(pwd)"`)
	if code != 0 || out != "hi there||/workspace\n" {
		t.Errorf("exec --env: exit %d %q", code, out)
	}
	// A large stdin and stdout go through whole.
	big := strings.Repeat("0123456789abcdef", 1<<16)
	code, out, _ = h.jb(big, "exec", "box", "--", "cat")
	if code != 0 || out != big {
		t.Errorf("exec cat of %d bytes: exit %d, %d bytes back", len(big), code, len(out))
	}
	for _, sig := range []string{"KILL", "TERM"} {
		n := map[string]int{"KILL": 9, "TERM": 15}[sig]
		if code, _, _ := h.jb("", "exec", "box", "--", "sh", "-c", "kill -"+sig+" $$"); code != 128+n {
			t.Errorf("exec of a command killed by SIG%s: exit %d, want %d", sig, code, 128+n)
		}
	}

	code, out, errs = h.jb("", "exec", "box", "--", "no-such-command", "arg")
	if code != 127 || out != "" || !strings.Contains(errs, "no-such-command: command not found") {
		t.Errorf("missing command: exit %d stdout %q stderr %q", code, out, errs)
	}
	if code, _, errs := h.jb("", "exec", "nobody-here", "--", "true"); code != 1 || !strings.Contains(errs, "no sandbox named nobody-here") {
		t.Errorf("exec in a missing sandbox: exit %d %q", code, errs)
	}

	h.mustJB("stop", "box")
	if s := h.ls()["box"]; s["state"] != "stopped" || s["running"] != false {
		t.Errorf("ls after stop: %v", s)
	}
	code, out, errs = h.jb("", "exec", "box", "--", "true")
	if code != 1 || out != "" || errs != "jailbee: sandbox `box` is not running (start it with 'jailbee start box')\n" {
		t.Errorf("exec in a stopped sandbox: exit %d stdout %q stderr %q", code, out, errs)
	}
	h.mustJB("start", "box")
	if s := h.ls()["box"]; s["state"] != "running" || s["running"] != true {
		t.Errorf("ls after start: %v", s)
	}
	if out := h.mustJB("exec", "box", "--", "cat", "README"); out != "hello\n" {
		t.Errorf("exec after start: %q", out)
	}
}

// TestExecTTYThroughARealTerminal drives `jb exec -t NAME -- sh` from a
// pseudo-terminal the test holds, as a user's shell would run it.
func TestExecTTYThroughARealTerminal(t *testing.T) {
	h := newHostEnv(t)
	h.newSandbox("tty", "--repo", h.repo, "--orchestrator")

	u := newUserTerminal(t)
	if err := unix.IoctlSetWinsize(int(u.slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 37, Col: 91}); err != nil {
		t.Fatal(err)
	}
	cmd, exited := u.jb(h, "exec", "-t", "tty", "--", "sh")
	// Type once jb has the terminal in raw mode (else the outer line
	// discipline would echo and cook the input).
	wait.For(t, "raw mode on the outer terminal", func() bool {
		tm, err := unix.IoctlGetTermios(int(u.slave.Fd()), unix.TCGETS)
		return err == nil && tm.Lflag&unix.ICANON == 0
	})
	u.master.Write([]byte(`[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo "I:terminal"; echo "S:$(stty size)"; echo "T:$(tty)"; echo "E:$TERM"; exit 5` + "\r"))
	u.waitExit(cmd, exited, 5)
	s := u.output()
	for _, want := range []string{`I:terminal\r\n`, `S:37 91\r\n`, `E:xterm-jbtest\r\n`} {
		if !regexp.MustCompile(want).MatchString(s) {
			t.Errorf("output lacks %s:\n%q", want, s)
		}
	}
	// The command's terminal is one of the sandbox's own devpts (the
	// in-sandbox relay makes it), so it has a name there.
	if !regexp.MustCompile(`T:/dev/pts/[0-9]+\r\n`).MatchString(s) {
		t.Errorf("tty did not name a /dev/pts terminal:\n%q", s)
	}
}

// TestExecTTYNotHeldBySandboxProcesses: what a terminal's command leaves
// running cannot hold `jb exec -t` open (the user's terminal raw, Ctrl-C
// dead): jb returns once the command has ended and restores the
// terminal. A background process keeps the command's terminal; another
// tries to take the host terminal from the command's parent, the
// supervisor that relays it, with pidfd_getfd and keep it, which the
// supervisor refuses (it is not dumpable).
func TestExecTTYNotHeldBySandboxProcesses(t *testing.T) {
	h := newHostEnv(t)
	if h.incusProject != "" {
		t.Skip("the pty relay is the local backend's")
	}
	h.newSandbox("held", "--repo", h.repo, "--orchestrator")
	if code, _, _ := h.jb("", "exec", "held", "--", "sh", "-c", "command -v perl"); code != 0 {
		t.Skip("no perl in the sandbox")
	}
	u := newUserTerminal(t)
	cmd, exited := u.jb(h, "exec", "-t", "held", "--", "sh", "-c", "trap '' HUP; sleep 600 & ls /proc/$PPID/fd >/dev/null 2>&1 || echo fd-closed; perl -e \"$1\" $PPID; exit 4", "sh", takeFD0)
	u.waitExit(cmd, exited, 4)
	if s := u.output(); !strings.Contains(s, "fd-closed\r\npidfd_getfd: errno 1\r\n") {
		t.Errorf("a sandbox process listed the supervisor's descriptors or took its terminal, want both refused (EPERM); output:\n%q", s)
	}
}

// TestExecTTYEscapeLeavesACommandThatIgnoresItsInput: a sandboxed
// command deaf to Ctrl-C (raw mode hands it to the command) and to hang-
// ups cannot keep the user's terminal: "~." typed after Enter ends jb,
// restores the terminal and ends the command; what was typed before it
// reached the command, and nothing after it did. A "~" inside a line and
// "~~" at a line's start reach the command as typed and as one "~".
func TestExecTTYEscapeLeavesACommandThatIgnoresItsInput(t *testing.T) {
	h := newHostEnv(t)
	h.newSandbox("esc", "--repo", h.repo, "--orchestrator")
	u := newUserTerminal(t)
	cmd, exited := u.jb(h, "exec", "-t", "esc", "--", "sh", "-c", "trap '' INT HUP TERM; stty raw -echo; echo ready; exec cat /dev/stdin >/tmp/typed-by-user")
	wait.For(t, "the command to start", func() bool { return strings.Contains(u.out.String(), "ready") })
	u.master.Write([]byte("a~b\x03\r~~c\r"))
	wait.For(t, "the typed line to reach the command", func() bool {
		code, out, _ := h.jb("", "exec", "esc", "--", "cat", "/tmp/typed-by-user")
		return code == 0 && out == "a~b\x03\r~c\r"
	})
	u.master.Write([]byte("~.never\r"))
	u.waitExit(cmd, exited, 1)
	if s := u.output(); !strings.Contains(s, "ended with ~.") {
		t.Errorf("jb did not say how it ended; output:\n%q", s)
	}
	h.waitNoProcess("esc", "cat /dev/stdin")
	if code, out, _ := h.jb("", "exec", "esc", "--", "cat", "/tmp/typed-by-user"); code != 0 || out != "a~b\x03\r~c\r" {
		t.Errorf("the command read %q (exit %d), want what was typed before ~.", out, code)
	}
}

// TestExecTTYSIGTERMRestoresTheTerminal: jb exec -t ended by SIGTERM (or
// SIGHUP, a closed window) restores the user's terminal and ends the
// command, which ignores both, instead of dying with the terminal raw.
func TestExecTTYSIGTERMRestoresTheTerminal(t *testing.T) {
	h := newHostEnv(t)
	h.newSandbox("sig", "--repo", h.repo, "--orchestrator")
	u := newUserTerminal(t)
	cmd, exited := u.jb(h, "exec", "-t", "sig", "--", "sh", "-c", "trap '' INT HUP TERM; echo ready; exec cat /dev/stdin")
	wait.For(t, "the command to start", func() bool { return strings.Contains(u.out.String(), "ready") })
	cmd.Process.Signal(syscall.SIGTERM)
	u.waitExit(cmd, exited, 1)
	if s := u.output(); !strings.Contains(s, "ended by a signal") {
		t.Errorf("jb did not say how it ended; output:\n%q", s)
	}
	h.waitNoProcess("sig", "cat /dev/stdin")
}

// waitNoProcess waits until no process of sandbox name has a command line
// holding cmdline (the listing itself, which names /proc/, must be seen).
func (h *hostEnv) waitNoProcess(name, cmdline string) {
	h.t.Helper()
	wait.For(h.t, "no "+cmdline+" in "+name, func() bool {
		code, out, _ := h.jb("", "exec", name, "--", "sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
		return code == 0 && !strings.Contains(out, cmdline) && strings.Contains(out, "/proc/")
	})
}

// takeFD0 (perl, pid as its argument) takes descriptor 0 of the process
// with pidfd_getfd and, if it got it, keeps it in a background process
// (deaf to the SIGHUP the end of the command's session sends).
const takeFD0 = `
$SIG{HUP} = "IGNORE";
my $pidfd = syscall(434, $ARGV[0] + 0, 0);
die "pidfd_open: $!\n" if $pidfd < 0;
my $fd = syscall(438, $pidfd, 0, 0);
if ($fd < 0) { printf "pidfd_getfd: errno %d\n", $! + 0; exit 0 }
print "pidfd_getfd: took descriptor $fd\n";
exit 0 if fork();
open STDIN, "<", "/dev/null"; open STDOUT, ">", "/dev/null"; open STDERR, ">", "/dev/null";
sleep 600;
`

// userTerminal is a pseudo-terminal the test holds as a user's: jb runs
// on its slave, the test reads what jb shows from its master.
type userTerminal struct {
	t             *testing.T
	master, slave *os.File
	before        *unix.Termios
	out           wait.Buffer
	readDone      chan struct{}
}

func newUserTerminal(t *testing.T) *userTerminal {
	t.Helper()
	master, slave, err := term.OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close(); slave.Close() })
	u := &userTerminal{t: t, master: master, slave: slave, readDone: make(chan struct{})}
	go func() {
		io.Copy(&u.out, master) // ends with EIO once no one holds the slave
		close(u.readDone)
	}()
	return u
}

// jb starts jb on the terminal, its mode noted first.
func (u *userTerminal) jb(h *hostEnv, args ...string) (*exec.Cmd, chan error) {
	u.t.Helper()
	before, err := unix.IoctlGetTermios(int(u.slave.Fd()), unix.TCGETS)
	if err != nil {
		u.t.Fatal(err)
	}
	u.before = before
	return h.jbOnTerminal(u.slave, "xterm-jbtest", args...)
}

// waitExit waits for jb to exit with code (a hang guard, never a timing)
// and checks that it restored the terminal's mode.
func (u *userTerminal) waitExit(cmd *exec.Cmd, exited chan error, code int) {
	u.t.Helper()
	select {
	case <-exited:
	case <-time.After(commandGuard):
		cmd.Process.Kill()
		<-exited
		u.t.Fatalf("jb %v did not end (hang guard); output:\n%s", cmd.Args[1:], u.out.String())
	}
	if got := cmd.ProcessState.ExitCode(); got != code {
		u.t.Errorf("exit %d, want %d", got, code)
	}
	after, err := unix.IoctlGetTermios(int(u.slave.Fd()), unix.TCGETS)
	if err != nil || *after != *u.before {
		u.t.Errorf("the outer terminal's mode was not restored:\n%+v\nwas\n%+v", after, u.before)
	}
}

// output closes the test's slave and returns all jb showed.
func (u *userTerminal) output() string {
	u.t.Helper()
	u.slave.Close()
	select {
	case <-u.readDone:
	case <-time.After(waitGuard):
		u.t.Fatal("the outer terminal's output did not end (hang guard)")
	}
	return u.out.String()
}

// TestBackgroundProcessOutlivesExecUntilDestroy: what jb exec leaves in
// the background keeps running after it returns, and destroy ends it (no
// host process of the sandbox's uid is left) and removes the sandbox.
func TestBackgroundProcessOutlivesExecUntilDestroy(t *testing.T) {
	h := newHostEnv(t)
	h.newSandbox("bg", "--repo", h.repo, "--orchestrator")
	uid := h.hostUID("bg")
	h.startHeartbeat("bg")
	h.waitBeatAdvances("bg")
	if os.Geteuid() == 0 {
		if uid == 0 {
			t.Fatal("a root broker's sandbox runs as root")
		}
		if len(h.sandboxProcesses("bg", uid)) == 0 {
			t.Fatalf("no host process of the sandbox (uid %d)", uid)
		}
	}
	h.mustJB("destroy", "bg", "--force")
	if os.Geteuid() == 0 {
		if ps := h.sandboxProcesses("bg", uid); len(ps) > 0 {
			t.Errorf("processes of the sandbox (uid %d) after destroy: %q", uid, ps)
		}
	}
	if _, err := os.Stat(h.sandboxDir("bg")); !os.IsNotExist(err) {
		t.Errorf("the sandbox's directory is still there: %v", err)
	}
	if _, ok := h.ls()["bg"]; ok {
		t.Error("ls still lists the destroyed sandbox")
	}
}

// TestBrokerKill9LeavesSandboxesRunning: killing the broker ends no
// sandbox; a new broker on the state dir serves them again, sockets and
// inboxes included.
func TestBrokerKill9LeavesSandboxesRunning(t *testing.T) {
	h := newHostEnv(t)
	h.newSandbox("lead", "--repo", h.repo, "--orchestrator")
	h.newSandbox("kid", "--branch", "k", "--parent", "lead")
	h.startHeartbeat("kid")
	h.waitBeatAdvances("kid")

	h.killBroker()
	// With no broker, the loop goes on (read from the host this time).
	beatFile := filepath.Join(h.hostPath("kid", "home"), "beat")
	readBeat := func() int {
		data, _ := os.ReadFile(beatFile)
		n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		return n
	}
	first := readBeat()
	wait.For(t, "the heartbeat to advance with no broker", func() bool { return readBeat() > first })
	if code, _, errs := h.jb("", "ls"); code != 4 || !strings.Contains(errs, "no broker is running for the state dir "+h.state) {
		t.Errorf("ls with the broker killed: exit %d %q", code, errs)
	}

	h.startBroker()
	for _, name := range []string{"lead", "kid"} {
		if s := h.ls()[name]; s["state"] != "running" || s["running"] != true {
			t.Errorf("ls after the restart: %v", s)
		}
	}
	h.waitBeatAdvances("kid")
	h.mustJB("exec", "kid", "--", "jailbee", "inbox", "ls")
	h.mustJB("exec", "lead", "--", "jailbee", "inbox", "send", "message", "--to", "kid", "--id", "after-kill", "--text", "still there?", "--wait")
	if out := h.mustJB("exec", "kid", "--", "jailbee", "inbox", "ls", "--json"); !strings.Contains(out, `"origin_id": "after-kill"`) {
		t.Errorf("kid's inbox after the restart: %s", out)
	}
}

// TestInboxOnHostSaysItRunsInASandbox: the inbox client on the host
// (no socket at the default path) says where it runs, exit 4.
func TestInboxOnHostSaysItRunsInASandbox(t *testing.T) {
	if _, err := os.Lstat("/run/jailbee/orchestration/broker.sock"); err == nil {
		t.Skip("this host has a broker socket at the in-sandbox path")
	}
	h := &hostEnv{t: t, bin: testbin.Jailbee(t)}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "JAILBEE_") {
			h.env = append(h.env, kv)
		}
	}
	code, out, errs := h.jb("", "inbox", "ls")
	want := "jailbee: jailbee inbox runs inside a sandbox: no broker socket at /run/jailbee/orchestration/broker.sock (from the host, run it in a sandbox: jb exec NAME -- jailbee inbox ...)\n"
	if code != 4 || out != "" || errs != want {
		t.Errorf("inbox ls on the host: exit %d stdout %q stderr %q, want exit 4 and %q", code, out, errs, want)
	}
}

func TestHostCommandsWithoutBroker(t *testing.T) {
	dir, _ := os.MkdirTemp("", "jbn")
	defer os.RemoveAll(dir)
	h := &hostEnv{t: t, bin: testbin.Jailbee(t), env: append(os.Environ(), "JAILBEE_STATE_DIR="+dir)}
	code, _, errs := h.jb("", "ls")
	if code != 4 || errs != fmt.Sprintf("jailbee: no broker is running for the state dir %s (start one with 'jailbee broker --state %s', or name another with --state or $JAILBEE_STATE_DIR)\n", dir, dir) {
		t.Fatalf("ls without a broker: %d %q", code, errs)
	}
	if code, _, _ := h.jb("", "new", "x", "--orchestrator", "--parent", "y", "--repo", "/"); code != 2 {
		t.Fatalf("new with both roles: exit %d, want 2", code)
	}
	if code, _, errs := h.jb("", "new", "x", "--orchestrator", "--repo", "/does/not/exist"); code != 1 || errs != "jailbee: no such directory: /does/not/exist\n" {
		t.Fatalf("new with a missing repo: exit %d %q", code, errs)
	}
}

func TestSecondBrokerProcessRefused(t *testing.T) {
	h := newHostEnv(t)
	code, _, errs := h.jb("", "broker")
	if code != 1 || !strings.Contains(errs, "another broker holds the state dir") {
		t.Fatalf("second broker: exit %d %q", code, errs)
	}
}

// everyHook is every hook git 2.39 runs (githooks(5)).
var everyHook = []string{
	"applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
	"prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge",
	"pre-push", "pre-receive", "update", "proc-receive", "post-receive", "post-update",
	"reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite", "sendemail-validate",
	"fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist", "p4-post-changelist", "p4-pre-submit",
	"post-index-change",
}

// octal is s as printf(1) octal escapes: a planted command names a host
// path without the path's text appearing in the sandbox's files.
func octal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, `\%03o`, s[i])
	}
	return b.String()
}

// shq quotes s for sh.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// hostileCmd is what every planted command runs: it records that it ran
// inside the sandbox (/home/agent/ran-LABEL) and touches MARKER, a host
// path in the test's temp dir that exists only in the host's mount
// namespace: the marker appears only if the command ran on the host. It
// uses double quotes only (it is single-quoted when planted) and ends in
// a command that takes any arguments git appends.
func (h *hostEnv) hostileCmd(label string) string {
	marker := filepath.Join(h.dir, "marker-"+label)
	return fmt.Sprintf(`touch /home/agent/ran-%s; touch "$(printf "%s")"; true`, label, octal(marker))
}

// plantHostileGit plants in the checkout of sandbox name every git setting
// and file that runs a command, in two variants of .git/config (the second
// also points core.worktree at victim, a host directory), and starts a
// loop that keeps swapping .git/config between them.
func (h *hostEnv) plantHostileGit(name, victim string) {
	h.t.Helper()
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format+"\n", args...) }
	cmd := func(what string) string { return shq(h.hostileCmd(name + "-" + what)) }
	w("set -e")
	w("cd /workspace")
	w("mkdir -p .git/evil-hooks .git/hooks .git/info")
	for _, dir := range []string{".git/evil-hooks", ".git/hooks"} {
		for _, hook := range everyHook {
			w("printf '#!/bin/sh\\n%%s\\n' %s > %s/%s", cmd(filepath.Base(dir)+"-"+hook), dir, hook)
			w("chmod +x %s/%s", dir, hook)
		}
	}
	w("printf '#!/bin/sh\\n%%s\\n' %s > .git/evil-hooks/url-ext", cmd("url-ext"))
	w("chmod +x .git/evil-hooks/url-ext")
	w("printf '%%s\\n' '* filter=evil diff=evil merge=evil' > .gitattributes")
	w("cp .gitattributes .git/info/attributes")
	// Quoted: ';' starts a comment in a git config value.
	w("printf '[core]\\n\\tfsmonitor = \"%%s\"\\n' %s > .git/evil-include", shq(strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(h.hostileCmd(name+"-include"))))
	w("cp .git/config .git/config.a")
	set := func(key, value string) { w("git config -f .git/config.a %s %s", shq(key), shq(value)) }
	add := func(key, value string) { w("git config -f .git/config.a --add %s %s", shq(key), shq(value)) }
	for _, key := range []string{"core.fsmonitor", "core.sshCommand", "core.pager", "core.editor", "core.askPass",
		"core.gitProxy", "sequence.editor", "diff.external", "diff.evil.textconv", "diff.evil.command",
		"merge.evil.driver", "filter.evil.clean", "filter.evil.smudge",
		"gpg.program", "gpg.ssh.program", "uploadpack.packObjectsHook", "remote.origin.uploadpack",
		"remote.origin.receivepack"} {
		set(key, h.hostileCmd(name+"-"+key))
	}
	set("core.hooksPath", ".git/evil-hooks")
	set("credential.helper", "!"+h.hostileCmd(name+"-credential"))
	set("alias.status", "!"+h.hostileCmd(name+"-alias-status"))
	set("alias.rev-parse", "!"+h.hostileCmd(name+"-alias-rev-parse"))
	set("pager.status", "true")
	set("commit.gpgSign", "true")
	set("protocol.allow", "always")
	set("remote.origin.url", "ext::sh .git/evil-hooks/url-ext")
	set("remote.origin.fetch", "+refs/*:refs/*")
	for _, prefix := range []string{"/", "file:", "ext::", "ssh://", "https://", "git@"} {
		add("url.ext::sh .git/evil-hooks/url-ext.insteadOf", prefix)
	}
	set("include.path", "evil-include")
	// The second variant adds what makes git stop early: a process filter
	// that does not speak its protocol, and a work tree on the host.
	w("cp .git/config.a .git/config.b")
	w("git config -f .git/config.b filter.evil.process %s", cmd("filter.evil.process"))
	w("git config -f .git/config.b core.worktree %s", shq(victim))
	w("cp .git/config.a .git/config")
	h.mustJB("exec", name, "--", "sh", "-c", sb.String())
	h.startConfigSwapper(name)
}

// startConfigSwapper starts, in the background of sandbox name, the loop
// that swaps .git/config between the two hostile variants.
func (h *hostEnv) startConfigSwapper(name string) {
	h.t.Helper()
	h.mustJB("exec", name, "--", "sh", "-c",
		`nohup sh -c 'cd /workspace/.git; while :; do cp config.a c.tmp; mv -f c.tmp config; sleep 0.02; cp config.b c.tmp; mv -f c.tmp config; sleep 0.02; done' >/dev/null 2>&1 &`)
}

// TestHostileGitNeverRunsOnTheHost: a sandbox plants every git setting
// and file that runs a command, and keeps swapping its git config, while
// every host command that touches a sandbox runs on it a few times. None
// of the planted commands may run on the host (their marker, a host path,
// never appears), and no host path (the test's temp dir, the state dir,
// the host repository) may reach the sandbox's files.
//
// The planted commands do run inside the sandboxes (the destroy guard's
// git status there runs the fsmonitor, filters and hooks): that is
// expected and harmless, so the in-sandbox /home/agent/ran-* files are
// allowed, only logged.
func TestHostileGitNeverRunsOnTheHost(t *testing.T) {
	h := newHostEnv(t)
	// core.worktree of one variant: a host directory that is none of the
	// paths looked for below.
	victim, err := os.MkdirTemp("", "v")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(victim)
	os.WriteFile(filepath.Join(victim, "canary"), []byte("canary\n"), 0o644)

	h.newSandbox("evil", "--repo", h.repo, "--orchestrator")
	h.newSandbox("evil-kid", "--branch", "kid", "--parent", "evil")
	for _, name := range []string{"evil", "evil-kid"} {
		h.plantHostileGit(name, victim)
	}
	noMarkers := func(when string) {
		t.Helper()
		if m, _ := filepath.Glob(filepath.Join(h.dir, "marker-*")); len(m) > 0 {
			t.Fatalf("%s: planted commands ran on the host: %v", when, m)
		}
		if entries, _ := os.ReadDir(victim); len(entries) != 1 {
			t.Fatalf("%s: the core.worktree directory on the host changed: %v", when, entries)
		}
	}
	noMarkers("after planting")

	for round := range 3 {
		when := fmt.Sprintf("round %d", round)
		h.mustJB("ls")
		h.mustJB("ls", "--json")
		for _, name := range []string{"evil", "evil-kid"} {
			h.mustJB("exec", name, "--", "true")
			// The guard runs git inside: the planted files are uncommitted
			// changes, or the config swapped in makes git fail; either way
			// a refusal.
			if code, _, errs := h.jb("", "destroy", name); code != 1 {
				t.Fatalf("%s: destroy %s without --force: exit %d %q", when, name, code, errs)
			}
		}
		child := fmt.Sprintf("child2-%d", round)
		h.mustJB("new", child, "--parent", "evil", "--branch", child)
		if out := h.mustJB("exec", child, "--", "cat", "README"); out != "hello\n" {
			t.Fatalf("%s: the new child's checkout: %q", when, out)
		}
		h.mustJB("destroy", child) // clean, nothing new: the guard lets it go
		for _, name := range []string{"evil-kid", "evil"} {
			h.mustJB("stop", name)
		}
		// Stopped by the broker: what it recorded at the stop counts (the
		// planted files, or a HEAD the swapped config kept git from reading).
		if code, _, errs := h.jb("", "destroy", "evil-kid"); code != 1 ||
			!(strings.Contains(errs, "uncommitted changes") || strings.Contains(errs, "was not recorded when it stopped")) {
			t.Fatalf("%s: destroy of a stopped sandbox: exit %d %q", when, code, errs)
		}
		for _, name := range []string{"evil", "evil-kid"} {
			h.mustJB("start", name)
			h.startConfigSwapper(name) // stop ended it
		}
		noMarkers(when)
	}

	// No host path reached the sandboxes' files.
	forbidden := []string{h.dir, h.state, h.repo}
	for _, name := range []string{"evil", "evil-kid"} {
		for _, sub := range []string{"checkout", "home"} {
			root := h.hostPath(name, sub)
			var ran []string
			filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return nil
				}
				if sub == "home" && strings.HasPrefix(d.Name(), "ran-") {
					ran = append(ran, strings.TrimPrefix(d.Name(), "ran-"))
				}
				// The sandbox owns these files: never follow a link, never
				// block on a fifo swapped in.
				f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
				if err != nil {
					return nil
				}
				defer f.Close()
				if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
					return nil
				}
				data, _ := io.ReadAll(io.LimitReader(f, 64<<20))
				for _, p := range forbidden {
					if bytes.Contains(data, []byte(p)) {
						t.Errorf("%s contains the host path %s", path, p)
					}
				}
				return nil
			})
			if sub == "home" {
				t.Logf("planted commands that ran inside %s (expected): %v", name, ran)
			}
		}
	}

	// With its child gone, the orchestrator's own guard runs git in it.
	h.mustJB("destroy", "evil-kid", "--force")
	if code, _, errs := h.jb("", "destroy", "evil"); code != 1 {
		t.Fatalf("destroy evil without --force: exit %d %q", code, errs)
	}
	noMarkers("after the orchestrator's guard")
	// Kept for the control below, copied once stop has ended the swapper.
	h.mustJB("stop", "evil")
	control := filepath.Join(h.dir, "control")
	if out, err := exec.Command("cp", "-r", h.hostPath("evil", "checkout"), control).CombinedOutput(); err != nil {
		t.Fatalf("copy the checkout: %v %s", err, out)
	}
	h.mustJB("destroy", "evil", "--force")
	noMarkers("after destroy --force")
	if out := h.mustJB("ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("after destroy --force: %s", out)
	}

	// Control: the plant is live, so the markers above would have shown a
	// planted command run on the host. Host git on the copy of the
	// checkout (first config variant) runs them, and their markers appear.
	// (Contained, as root: only the scratch dir is writable.)
	if out, err := exec.Command("cp", filepath.Join(control, ".git", "config.a"), filepath.Join(control, ".git", "config")).CombinedOutput(); err != nil {
		t.Fatalf("copy the config: %v %s", err, out)
	}
	for _, args := range [][]string{{"status"}, {"-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qam", "x"}} {
		c := exec.Command("git", args...)
		c.Dir = control
		c.Run() // may fail, after running planted commands
	}
	for _, label := range []string{"include", "filter.evil.clean", "evil-hooks-pre-commit"} {
		if _, err := os.Stat(filepath.Join(h.dir, "marker-evil-"+label)); err != nil {
			t.Errorf("control: host git did not run the planted %s: %v", label, err)
		}
	}
}

// TestSpawnLogsAndAttach: a spawned child's worker log through `jb logs`,
// and `jb attach` putting the user's terminal on the agent's tmux session
// (detached again with C-b d, the agent left running).
func TestSpawnLogsAndAttach(t *testing.T) {
	h := newHostEnv(t)
	script, err := os.ReadFile(filepath.Join("..", "..", "testdata", "agent", "agent.sh"))
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(h.repo, ".jailbee"), 0o755)
	os.WriteFile(filepath.Join(h.repo, ".jailbee", "agent.sh"), script, 0o755)
	os.WriteFile(filepath.Join(h.repo, ".jailbee", "config.yaml"), []byte("agents:\n  scripted:\n    command: \"sh .jailbee/agent.sh\"\n    prompt_args: [\"{prompt}\"]\ndefault_agent: scripted\n"), 0o644)
	h.git("-C", h.repo, "add", ".")
	h.git("-C", h.repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "agent")
	h.newSandbox("lead", "--repo", h.repo, "--orchestrator")
	h.mustJB("exec", "lead", "--", "jailbee", "inbox", "send", "spawn", "--branch", "kid", "--on-done", "keep", "--text", "work")
	// Its agent reports done at once; the spawn's status says ready after
	// two observations of it.
	doneRow := regexp.MustCompile("(?m)^kid +child +lead +done +up +kid +- +spawn-[0-9a-f]+ done: child `kid` is ready")
	wait.For(t, "ls to show the child done and its spawn's final status", func() bool { return doneRow.MatchString(h.mustJB("ls")) })

	if out := h.mustJB("logs", "kid"); !strings.Contains(out, "agent scripted ready") || !strings.HasPrefix(out, "== kid.") {
		t.Fatalf("jb logs kid:\n%s", out)
	}
	if code, _, errs := h.jb("", "logs", "lead"); code != 1 || !strings.Contains(errs, "no worker log for lead") {
		t.Fatalf("jb logs of a sandbox made on the host: exit %d %q", code, errs)
	}

	// The agent's pane, without a terminal; and followed: a new window's
	// output comes after.
	if out := h.mustJB("logs", "kid", "--agent"); !strings.HasPrefix(out, "== window scripted\n") || !strings.Contains(out, " agent: prompt: work\n") {
		t.Fatalf("jb logs kid --agent:\n%s", out)
	}
	if code, _, errs := h.jb("", "logs", "lead", "--agent"); code != 1 || !strings.Contains(errs, "no agent session in lead") {
		t.Fatalf("jb logs --agent of a sandbox with no agent session: exit %d %q", code, errs)
	}
	follow := exec.Command(h.bin, "logs", "kid", "--agent", "-f")
	follow.Env = h.env
	var followed wait.Buffer
	follow.Stdout = &followed
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { follow.Process.Kill(); follow.Wait() }()
	wait.For(t, "jb logs -f to print the agent's pane", func() bool { return strings.Contains(followed.String(), " agent: prompt: work\n") })
	h.mustJB("exec", "kid", "--", "tmux", "new-window", "-d", "-t", "jailbee:", "-n", "extra", "--", "sh", "-c", "echo a-new-line; exec sleep 600")
	wait.For(t, "jb logs -f to print the new window", func() bool {
		return strings.Contains(followed.String(), "== window extra\na-new-line\n")
	})
	h.mustJB("exec", "kid", "--", "tmux", "kill-window", "-t", "jailbee:extra")
	if code, _, errs := h.jb("", "attach", "kid"); code != 2 || !strings.Contains(errs, "attach needs a terminal") {
		t.Fatalf("jb attach without a terminal: exit %d %q", code, errs)
	}

	master, slave, err := term.OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	defer slave.Close()
	unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 30, Col: 100})
	cmd, exited := h.jbOnTerminal(slave, "xterm", "attach", "kid")
	var out wait.Buffer
	go io.Copy(&out, master)
	// The agent's window shows its output once tmux has drawn it.
	wait.For(t, "the agent's window on the terminal", func() bool { return strings.Contains(out.String(), "agent:") })
	master.Write([]byte{0x02, 'd'}) // C-b d: detach
	select {
	case <-exited:
	case <-time.After(commandGuard):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("jb attach did not end after a detach; output:\n%q", out.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("jb attach exited %d", code)
	}
	if got := h.mustJB("exec", "kid", "--", "tmux", "list-windows", "-t", "jailbee", "-F", "#{window_name}"); got != "scripted\n" {
		t.Fatalf("after the detach the agent's session has windows %q", got)
	}

	// Stopped and started again, the child runs no agent: start says so
	// and who starts one, and attach says it instead of tmux's bare "no
	// sessions".
	h.mustJB("stop", "kid")
	hint := "its orchestrator `lead` starts one with a restart (`jailbee inbox send restart --child kid --agent-only`; without --agent-only once it is stopped)"
	if out := h.mustJB("start", "kid"); out != "started kid\nkid: its agent was not started again: "+hint+"\n" {
		t.Fatalf("jb start of a spawned child:\n%s", out)
	}
	cmd, exited = h.jbOnTerminal(slave, "xterm", "attach", "kid")
	select {
	case <-exited:
	case <-time.After(commandGuard):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("jb attach to a child with no agent did not end; output:\n%q", out.String())
	}
	want := "jailbee: kid has no agent session: no agent runs in it. A spawned child's agent is started by its orchestrator with a restart (`jailbee inbox send restart --child kid --agent-only` while it runs); `jailbee start` starts none"
	wait.For(t, "attach's refusal on the terminal", func() bool { return strings.Contains(out.String(), want) })
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("jb attach to a child with no agent exited %d; output:\n%q", code, out.String())
	}
	// The restart the hint names gives it one.
	h.mustJB("exec", "lead", "--", "jailbee", "inbox", "send", "restart", "--child", "kid", "--agent-only", "--text", "again", "--wait")
	wait.For(t, "the restarted agent's session", func() bool {
		code, _, _ := h.jb("", "exec", "kid", "--", "tmux", "has-session", "-t", "jailbee")
		return code == 0
	})
}
