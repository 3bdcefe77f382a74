package local_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/local"
	"agentbox/internal/cgroup"
	"agentbox/internal/testutil/serve"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/wire"
)

// hangGuard bounds every wait of these tests: it catches a hang, it
// measures nothing.
const hangGuard = 30 * time.Second

// requireRoot skips a test that needs a root broker: per-sandbox host
// uids, cgroups, and reading other users' processes.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a root broker gives each sandbox its own host uid and cgroups")
	}
}

// fixture is a root broker's local backend whose Root the test knows, so
// it can look at sandboxes from the host.
type fixture struct {
	t    *testing.T
	b    *local.Backend
	root string
	uids map[int]bool
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	requireRoot(t)
	return newFixtureAt(t, filepath.Join(t.TempDir(), "sandboxes"))
}

func newFixtureAt(t *testing.T, root string) *fixture {
	t.Helper()
	return &fixture{t: t, b: openBackend(t, root), root: root, uids: map[int]bool{}}
}

func openBackend(t *testing.T, root string) *local.Backend {
	t.Helper()
	b, err := local.New(local.Options{Root: root, Binary: testbin.Jailbee(t)})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	return b
}

// box is one sandbox as the host sees it.
type box struct {
	name string
	uuid string
	uid  int    // host uid (and gid) it runs as
	dir  string // its directory under Root
}

func (x box) checkout() string { return filepath.Join(x.dir, "checkout") }
func (x box) home() string     { return filepath.Join(x.dir, "home") }

// freshUID is a host uid no other sandbox of this fixture has.
func (f *fixture) freshUID() int {
	for {
		uid := hostUID(f.t)
		if !f.uids[uid] {
			f.uids[uid] = true
			return uid
		}
	}
}

// create makes a stopped sandbox, destroyed when the test ends.
func (f *fixture) create(label string, limits backend.Limits) box {
	f.t.Helper()
	name := backendtest.Name(f.t, label)
	uid := f.freshUID()
	inst, err := f.b.Create(f.t.Context(), backend.CreateOptions{Name: name, HostUID: uid, Limits: limits})
	if err != nil {
		f.t.Fatalf("Create(%s): %v", name, err)
	}
	b := f.b
	f.t.Cleanup(func() {
		if err := b.Destroy(context.Background(), name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			f.t.Errorf("cleanup Destroy(%s): %v", name, err)
		}
	})
	return box{name: name, uuid: inst.UUID, uid: uid, dir: filepath.Join(f.root, name)}
}

// start makes a running sandbox.
func (f *fixture) start(label string, limits backend.Limits) box {
	f.t.Helper()
	x := f.create(label, limits)
	if err := f.b.Start(f.t.Context(), x.name); err != nil {
		f.t.Fatalf("Start(%s): %v", x.name, err)
	}
	return x
}

// run executes opts in the sandbox with output captured; a hang past
// hangGuard fails t, an error is returned.
func run(t *testing.T, b backend.Backend, name string, opts backend.ExecOptions) (backendtest.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	var stdout, stderr bytes.Buffer
	opts.Stdout, opts.Stderr = &stdout, &stderr
	code, err := b.Exec(ctx, name, opts)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("Exec(%s, %q) still running after %v", name, opts.Argv, hangGuard)
	}
	return backendtest.Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}, err
}

// sh runs a shell script as the agent; an Exec error fails t, any exit
// status is returned.
func sh(t *testing.T, b backend.Backend, name, script string) backendtest.Result {
	t.Helper()
	r, err := run(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatalf("sh -c %q in %s: %v (stderr %q)", script, name, err, r.Stderr)
	}
	return r
}

// mustSh is sh that also needs exit status 0; it returns trimmed stdout.
func mustSh(t *testing.T, b backend.Backend, name, script string) string {
	t.Helper()
	r := sh(t, b, name, script)
	if r.Code != 0 {
		t.Fatalf("sh -c %q in %s exited %d: %s", script, name, r.Code, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// hostMeta is what the host reads of a sandbox's meta.json.
type hostMeta struct {
	UUID string `json:"uuid"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	PID  int    `json:"pid"`
}

func readMeta(t *testing.T, dir string) hostMeta {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m hostMeta
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("meta.json: %v", err)
	}
	return m
}

// cgroupDirs are a sandbox's cgroup directories by controller (pids,
// memory, cpu, freezer when mounted; one directory on v2).
func cgroupDirs(t *testing.T, uuid string) map[string]string {
	t.Helper()
	h, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{}
	for _, c := range []string{"pids", "memory", "cpu", "freezer"} {
		if mp := h.Mountpoint(c); mp != "" {
			dirs[c] = filepath.Join(mp, cgroup.Parent, uuid)
		}
	}
	return dirs
}

// readTrim reads a small file, trimmed; a missing file fails t.
func readTrim(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// keyed returns the number after key in a "key N" per line file
// (pids.events, memory.oom_control, memory.events); -1 if absent.
func keyed(t *testing.T, path, key string) int64 {
	t.Helper()
	for _, line := range strings.Split(readTrim(t, path), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", path, line)
			}
			return n
		}
	}
	return -1
}

// oomKills is how many processes the OOM killer ended in the sandbox's
// memory cgroup.
func oomKills(t *testing.T, uuid string) int64 {
	t.Helper()
	dir := cgroupDirs(t, uuid)["memory"]
	if _, err := os.Stat(filepath.Join(dir, "memory.oom_control")); err == nil {
		return keyed(t, filepath.Join(dir, "memory.oom_control"), "oom_kill") // v1
	}
	return keyed(t, filepath.Join(dir, "memory.events"), "oom_kill") // v2
}

// cgroupPids lists the processes of the sandbox's pids cgroup.
func cgroupPids(t *testing.T, uuid string) []int {
	t.Helper()
	var pids []int
	for _, f := range strings.Fields(readTrim(t, filepath.Join(cgroupDirs(t, uuid)["pids"], "cgroup.procs"))) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	return pids
}

// procStatus is /proc/<pid>/status read on the host, by key; nil when the
// process is gone.
func procStatus(pid int) map[string]string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	st := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	return st
}

// idsAre reports whether a status Uid/Gid line ("real effective saved fs")
// has every field equal to id.
func idsAre(line string, id int) bool {
	f := strings.Fields(line)
	if len(f) != 4 {
		return false
	}
	for _, v := range f {
		if v != strconv.Itoa(id) {
			return false
		}
	}
	return true
}

// hostProcsOf lists the live (not zombie) host processes with uid among
// their ids.
func hostProcsOf(t *testing.T, uid int) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st := procStatus(pid)
		if st == nil || strings.HasPrefix(st["State"], "Z") {
			continue
		}
		for _, v := range strings.Fields(st["Uid"]) {
			if v == strconv.Itoa(uid) {
				out = append(out, fmt.Sprintf("%d (%s)", pid, st["Name"]))
				break
			}
		}
	}
	return out
}

// fakeReply is a valid answer to the inbox client's "list".
const fakeReply = `{"v":1,"ok":true,"result":{"items":[{"id":"msg-0001","type":"message","from":"lead","kind":"note","body":"hello from the fake broker"}],"read_ids":[],"more":false}}` + "\n"

// fakeItem is how `jailbee inbox ls` shows fakeReply's item.
const fakeItem = "hello from the fake broker"

// serveFakeBroker answers every connection on ln with fakeReply and
// reports each request's op on the returned channel.
func serveFakeBroker(t *testing.T, ln net.Listener) <-chan string {
	t.Helper()
	ops := make(chan string, 64)
	serve.Serve(t, ln, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(hangGuard))
		line, err := wire.ReadLine(bufio.NewReader(c), wire.MaxLineBytes)
		if err != nil {
			return
		}
		var req wire.Request
		if json.Unmarshal(line, &req) == nil {
			select {
			case ops <- req.Op:
			default:
			}
		}
		io.WriteString(c, fakeReply)
	})
	return ops
}

// fakeBrokerDir makes a private socket directory whose broker.sock is a
// fake broker (see serveFakeBroker).
func fakeBrokerDir(t *testing.T) (string, <-chan string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sock-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, local.SocketFile)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, serveFakeBroker(t, ln)
}

// worldDir is a fresh directory every user can enter (for copies of
// binaries run as other uids); removed when the test ends.
func worldDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "world-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyFile(t *testing.T, from, to string, perm os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, perm); err != nil {
		t.Fatal(err)
	}
}

func randomHex(t *testing.T) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// logExcerpt is the start and the end of a log file (a Go crash says why
// first and ends with goroutine stacks), or why it could not be read.
func logExcerpt(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) <= 2048 {
		return string(b)
	}
	return string(b[:1024]) + "\n...\n" + string(b[len(b)-1024:])
}
