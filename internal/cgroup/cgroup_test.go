package cgroup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests run against the real kernel (this host: cgroup v1, hybrid),
// except the TestV2* ones, which check the v2 writing logic against a fake
// tree in a temp directory: this host cannot enable v2 controllers.

// Helper processes are this test binary re-executed with helperEnv set.
const (
	helperEnv   = "AGENTBOX_CGROUP_TEST_HELPER"
	joinEnv     = "AGENTBOX_CGROUP_TEST_JOIN"    // newline-separated cgroup.procs files to write "0" into
	hogEnv      = "AGENTBOX_CGROUP_TEST_HOG"     // bytes to allocate and touch
	v2RootEnv   = "AGENTBOX_CGROUP_TEST_V2ROOT"  // fake v2 tree for the usable-v2 helper
	selfCgEnv   = "AGENTBOX_CGROUP_TEST_SELF_CG" // fake /proc/self/cgroup for the usable-v2 helper
	nobodyUID   = 65534                          // the unprivileged uid helpers run as
	hangGuard   = 2 * time.Minute                // bounds any wait; never an assertion
	pollEvery   = 5 * time.Millisecond
	hogLimit    = 64 << 20  // memory limit of the OOM test's group
	hogBytes    = 256 << 20 // what the OOM test's helper touches: 4x the limit
	touchStride = 4096      // one write per page is enough to fault it in
)

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "hog":
		helperHog()
	case "usable":
		h, err := Detect()
		if err == nil {
			err = h.Usable()
		}
		fmt.Print(errString(err))
	case "usable-v2":
		h := v2HierarchyForTest(os.Getenv(v2RootEnv), nil)
		h.selfCgroup = os.Getenv(selfCgEnv)
		fmt.Print(errString(h.Usable()))
	default:
		fmt.Fprintln(os.Stderr, "unknown helper")
		os.Exit(2)
	}
	os.Exit(0)
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// helperHog joins the group the way a launcher does (writing "0" into each
// procs file), then touches hogEnv bytes.
func helperHog() {
	for f := range strings.SplitSeq(os.Getenv(joinEnv), "\n") {
		if f == "" {
			continue
		}
		if err := os.WriteFile(f, []byte("0"), 0); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
	}
	n, _ := strconv.Atoi(os.Getenv(hogEnv))
	b := make([]byte, n)
	for i := 0; i < n; i += touchStride {
		b[i] = 1
	}
	fmt.Print("survived")
}

// v2HierarchyForTest is a v2 Hierarchy over a fake tree at root. onMkdir
// plays the kernel's part for new directories (see fakeV2).
func v2HierarchyForTest(root string, onMkdir func(string) error) *Hierarchy {
	return &Hierarchy{version: 2, v2Mount: root, v2MountRoot: "/", onMkdir: onMkdir}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creating cgroups and moving processes into them is root-only on cgroup v1 (and needs a delegated subtree on v2)")
	}
}

func randomName(t *testing.T) string {
	b := make([]byte, 6)
	rand.Read(b)
	return "test-" + hex.EncodeToString(b)
}

func realHierarchy(t *testing.T) *Hierarchy {
	t.Helper()
	needRoot(t)
	h, err := Detect()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Usable(); err != nil {
		t.Fatal(err)
	}
	return h
}

// cleanupGroup kills and removes the group at test end, pass or fail.
func cleanupGroup(t *testing.T, h *Hierarchy, name string) {
	t.Cleanup(func() {
		g, err := h.Open(name)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		if err := g.Kill(ctx); err != nil {
			t.Errorf("cleanup kill: %v", err)
		}
		if err := g.Remove(); err != nil {
			t.Errorf("cleanup remove: %v", err)
		}
	})
}

func create(t *testing.T, h *Hierarchy, l Limits) *Group {
	t.Helper()
	name := randomName(t)
	cleanupGroup(t, h, name)
	g, err := h.Create(name, l)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// --- Detect ---

const hybridMountinfo = `22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

func detectText(t *testing.T, mountinfo string, controllers map[string]string) (*Hierarchy, error) {
	t.Helper()
	mounts, err := parseMountinfo([]byte(mountinfo))
	if err != nil {
		t.Fatal(err)
	}
	return detect(mounts, func(dir string) ([]string, error) {
		c, ok := controllers[dir]
		if !ok {
			return nil, fs.ErrNotExist
		}
		return strings.Fields(c), nil
	})
}

func TestDetectHybridPicksV1(t *testing.T) {
	h, err := detectText(t, hybridMountinfo, map[string]string{"/sys/fs/cgroup/unified": "hugetlb"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Version() != 1 {
		t.Fatalf("version %d, want 1: the unified mount has no controllers", h.Version())
	}
	for c, want := range map[string]string{"pids": "/sys/fs/cgroup/pids", "memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu", "freezer": "/sys/fs/cgroup/freezer"} {
		if got := h.Mountpoint(c); got != want {
			t.Errorf("%s at %q, want %q", c, got, want)
		}
	}
}

func TestDetectPureV2(t *testing.T) {
	mi := "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
	h, err := detectText(t, mi, map[string]string{"/sys/fs/cgroup": "cpuset cpu io memory hugetlb pids rdma misc"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Version() != 2 || h.Mountpoint("memory") != "/sys/fs/cgroup" {
		t.Fatalf("got v%d at %q, want v2 at /sys/fs/cgroup", h.Version(), h.Mountpoint("memory"))
	}
}

func TestDetectV2WithoutCPUFallsBackToV1(t *testing.T) {
	// A v2 tree lacking one needed controller is not chosen.
	h, err := detectText(t, hybridMountinfo, map[string]string{"/sys/fs/cgroup/unified": "memory pids"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Version() != 1 {
		t.Fatalf("version %d, want 1", h.Version())
	}
}

func TestDetectCoMountedCPU(t *testing.T) {
	mi := `32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
`
	h, err := detectText(t, mi, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Mountpoint("cpu"); got != "/sys/fs/cgroup/cpu,cpuacct" {
		t.Errorf("cpu at %q", got)
	}
	if got := h.Mountpoint("freezer"); got != "" {
		t.Errorf("freezer at %q, want none", got)
	}
	g, err := h.Open("x")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/sys/fs/cgroup/pids/jailbee/x/cgroup.procs", "/sys/fs/cgroup/memory/jailbee/x/cgroup.procs", "/sys/fs/cgroup/cpu,cpuacct/jailbee/x/cgroup.procs"}
	if got := g.ProcsFiles(); !slices.Equal(got, want) {
		t.Errorf("procs files %q, want %q", got, want)
	}
}

func TestDetectMissingController(t *testing.T) {
	mi := `32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
`
	_, err := detectText(t, mi, map[string]string{"/sys/fs/cgroup/unified": ""})
	if err == nil || !strings.Contains(err.Error(), "no pids controller") || !strings.Contains(err.Error(), "/sys/fs/cgroup/unified") {
		t.Fatalf("err = %v, want one naming the missing pids controller and the unified mount", err)
	}
}

func TestDetectEscapedMountpoint(t *testing.T) {
	mi := `32 31 0:29 / /cg/cpu\040x rw - cgroup cgroup rw,cpu
35 31 0:32 / /cg/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /cg/pids rw - cgroup cgroup rw,pids
`
	h, err := detectText(t, mi, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Mountpoint("cpu"); got != "/cg/cpu x" {
		t.Errorf("cpu at %q, want %q", got, "/cg/cpu x")
	}
}

// TestDetectHere checks Detect on this host against /proc/self/cgroup:
// a controller listed there with a hierarchy id other than 0 is a v1
// controller, so its presence means Detect must pick v1.
func TestDetectHere(t *testing.T) {
	h, err := Detect()
	if err != nil {
		t.Fatal(err)
	}
	v1Listed := false
	for line := range strings.Lines(readFile(t, "/proc/self/cgroup")) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) == 3 && f[0] != "0" && slices.Contains(strings.Split(f[1], ","), "pids") {
			v1Listed = true
		}
	}
	if want := map[bool]int{true: 1, false: 2}[v1Listed]; h.Version() != want {
		t.Fatalf("version %d, want %d", h.Version(), want)
	}
	for _, c := range []string{"pids", "memory", "cpu", "freezer"} {
		mp := h.Mountpoint(c)
		t.Logf("%s: %s", c, mp)
		if mp == "" {
			if c == "freezer" {
				continue
			}
			t.Fatalf("%s not found", c)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(mp, &st); err != nil {
			t.Fatal(err)
		}
		want := map[int]int64{1: unix.CGROUP_SUPER_MAGIC, 2: unix.CGROUP2_SUPER_MAGIC}[h.Version()]
		if st.Type != want {
			t.Errorf("%s: file system type %#x, want %#x", mp, st.Type, want)
		}
	}
}

// --- Usable ---

func TestUsableAsRoot(t *testing.T) {
	realHierarchy(t) // fails the test if Usable reports an error
}

// runHelper runs this test binary as helper mode, as uid (or root when uid
// is 0), from a copy every user can execute.
func runHelper(t *testing.T, mode string, uid int, env ...string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := self
	if uid != 0 {
		dir := worldDir(t)
		bin = filepath.Join(dir, "cgroup.test")
		copyFile(t, self, bin, 0o755)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), append(env, helperEnv+"="+mode)...)
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper %s: %v", mode, err)
	}
	return string(out)
}

// worldDir is a fresh directory every user can read and enter.
func worldDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cgroup-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestUsableNotRoot(t *testing.T) {
	h := realHierarchy(t)
	got := runHelper(t, "usable", nobodyUID)
	t.Logf("as uid %d: %s", nobodyUID, got)
	if got == "ok" {
		t.Fatal("Usable accepted an unprivileged process")
	}
	if h.Version() == 1 && (!strings.Contains(got, "need root") || !strings.Contains(got, strconv.Itoa(nobodyUID))) {
		t.Errorf("v1 reason %q should say root is needed and name the uid", got)
	}
}

// --- Limits ---

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "A.b_c-9", "0", strings.Repeat("x", MaxNameLen)} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", ".hidden", "-x", "_x", "a/b", "a b", "a\x00", strings.Repeat("x", MaxNameLen+1), "é"} {
		if err := ValidateName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
		h := &Hierarchy{version: 2, v2Mount: t.TempDir()}
		if _, err := h.Create(bad, Limits{}); err == nil {
			t.Errorf("Create(%q) accepted", bad)
		}
	}
}

func TestV1SharesRoundTrip(t *testing.T) {
	if got := v1Shares(0); got != v1SharesPerDefaultWeight {
		t.Errorf("default weight -> %d shares, want 1024", got)
	}
	for w := MinCPUWeight; w <= MaxCPUWeight; w++ {
		s := v1Shares(w)
		if s < v1MinShares || s != max(v1MinShares, int64(w)*1024/100) {
			t.Fatalf("weight %d -> shares %d", w, s)
		}
		if back := v1Weight(s); back != w {
			t.Fatalf("weight %d -> shares %d -> weight %d", w, s, back)
		}
	}
}

// checkFiles compares the group's real control files with l.
func checkFiles(t *testing.T, h *Hierarchy, g *Group, l Limits) {
	t.Helper()
	pids, mem, weight := "max", "max", l.CPUWeight
	if l.Pids != 0 {
		pids = strconv.FormatInt(l.Pids, 10)
	}
	if l.MemoryBytes != 0 {
		mem = strconv.FormatInt(l.MemoryBytes, 10)
	}
	if weight == 0 {
		weight = DefaultCPUWeight
	}
	want := map[string]string{filepath.Join(g.dirs["pids"], "pids.max"): pids}
	if h.Version() == 2 {
		want[filepath.Join(g.dirs["memory"], "memory.max")] = mem
		want[filepath.Join(g.dirs["cpu"], "cpu.weight")] = strconv.Itoa(weight)
		if exists(filepath.Join(g.dirs["memory"], "memory.swap.max")) {
			want[filepath.Join(g.dirs["memory"], "memory.swap.max")] = map[bool]string{true: "max", false: "0"}[l.MemoryBytes == 0]
		}
	} else {
		if l.MemoryBytes == 0 {
			mem = strconv.FormatInt(v1MemoryUnlimited(), 10)
		}
		want[filepath.Join(g.dirs["memory"], "memory.limit_in_bytes")] = mem
		if exists(filepath.Join(g.dirs["memory"], "memory.memsw.limit_in_bytes")) {
			want[filepath.Join(g.dirs["memory"], "memory.memsw.limit_in_bytes")] = mem
		}
		want[filepath.Join(g.dirs["cpu"], "cpu.shares")] = strconv.FormatInt(v1Shares(l.CPUWeight), 10)
	}
	for f, w := range want {
		if got := readFile(t, f); got != w {
			t.Errorf("%s = %q, want %q", f, got, w)
		}
	}
	got, err := g.Limits()
	if err != nil {
		t.Fatal(err)
	}
	if back := (Limits{Pids: l.Pids, MemoryBytes: l.MemoryBytes, CPUWeight: weight}); got != back {
		t.Errorf("Limits() = %+v, want %+v", got, back)
	}
}

func TestCreateWritesLimitsAndReuseRewrites(t *testing.T) {
	h := realHierarchy(t)
	l := Limits{Pids: 100, MemoryBytes: 64 << 20, CPUWeight: 250}
	g := create(t, h, l)
	for _, d := range g.uniqueDirs() {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			t.Fatalf("group directory %s: %v", d, err)
		}
		if filepath.Base(filepath.Dir(d)) != Parent {
			t.Errorf("%s is not under %s", d, Parent)
		}
	}
	if h.Version() == 1 {
		if got := len(g.ProcsFiles()); got != 4 {
			t.Errorf("%d procs files, want 4 (pids, memory, cpu, freezer): %q", got, g.ProcsFiles())
		}
	}
	checkFiles(t, h, g, l)
	// Rewrites on reuse: raise memory (v1: memsw must be raised first),
	// cut it (limit first), then clear everything.
	for _, l := range []Limits{
		{Pids: 200, MemoryBytes: 512 << 20, CPUWeight: 1},
		{Pids: 50, MemoryBytes: 32 << 20, CPUWeight: 10000},
		{},
		{MemoryBytes: 48 << 20},
	} {
		g2, err := h.Create(g.Name(), l)
		if err != nil {
			t.Fatalf("reuse with %+v: %v", l, err)
		}
		checkFiles(t, h, g2, l)
	}
}

func TestLimitBounds(t *testing.T) {
	h := realHierarchy(t)
	ok := []Limits{
		{Pids: MinPids}, {Pids: MaxPids},
		{MemoryBytes: MinMemoryBytes}, {MemoryBytes: MaxMemoryBytes},
		{CPUWeight: MinCPUWeight}, {CPUWeight: MaxCPUWeight},
		{Pids: MaxPids, MemoryBytes: MaxMemoryBytes, CPUWeight: MaxCPUWeight},
	}
	for _, l := range ok {
		g := create(t, h, l)
		checkFiles(t, h, g, l)
	}
	bad := []Limits{
		{Pids: MinPids - 1}, {Pids: MaxPids + 1}, {Pids: -1},
		{MemoryBytes: MinMemoryBytes - 1}, {MemoryBytes: MaxMemoryBytes + 1}, {MemoryBytes: -1},
		{CPUWeight: -1}, {CPUWeight: MaxCPUWeight + 1}, // MinCPUWeight-1 is 0: unset
	}
	for _, l := range bad {
		name := randomName(t)
		cleanupGroup(t, h, name)
		if _, err := h.Create(name, l); err == nil {
			t.Errorf("%+v accepted", l)
		}
		g, _ := h.Open(name)
		for _, d := range g.uniqueDirs() {
			if exists(d) {
				t.Errorf("%+v refused but %s was created", l, d)
			}
		}
	}
}

// --- Processes ---

func startSleep(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

func TestJoinAndPids(t *testing.T) {
	h := realHierarchy(t)
	g := create(t, h, Limits{Pids: 64})
	a, b := startSleep(t), startSleep(t)
	for _, c := range []*exec.Cmd{a, b} {
		if err := g.Join(c.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	pids, err := g.Pids()
	if err != nil {
		t.Fatal(err)
	}
	want := []int{a.Process.Pid, b.Process.Pid}
	slices.Sort(want)
	if !slices.Equal(pids, want) {
		t.Fatalf("Pids() = %v, want %v", pids, want)
	}
	// The kernel agrees: every controller's line names the group.
	own := readFile(t, fmt.Sprintf("/proc/%d/cgroup", a.Process.Pid))
	for _, c := range []string{"pids", "memory", "cpu"} {
		found := false
		for line := range strings.Lines(own) {
			f := strings.SplitN(strings.TrimSpace(line), ":", 3)
			if len(f) == 3 && (slices.Contains(strings.Split(f[1], ","), c) || h.Version() == 2 && f[0] == "0") {
				found = strings.HasSuffix(f[2], "/"+Parent+"/"+g.Name())
			}
		}
		if !found {
			t.Errorf("%s: /proc/pid/cgroup does not name the group:\n%s", c, own)
		}
	}
	if err := g.Join(-1); err == nil {
		t.Error("Join(-1) accepted")
	}
	if n, err := g.Tasks(); err != nil || n != 2 {
		t.Errorf("Tasks() = %d, %v; want the 2 sleeps", n, err)
	}
}

// TestSetPids: the task limit alone changes, down to the tasks the group
// holds (which stay), and bad values are refused.
func TestSetPids(t *testing.T) {
	h := realHierarchy(t)
	g := create(t, h, Limits{Pids: 64, MemoryBytes: 64 << 20})
	for _, n := range []int64{MinPids, MaxPids, 0, 100} {
		if err := g.SetPids(n); err != nil {
			t.Fatalf("SetPids(%d): %v", n, err)
		}
		l, err := g.Limits()
		if err != nil || l.Pids != n || l.MemoryBytes != 64<<20 {
			t.Fatalf("after SetPids(%d): %+v, %v", n, l, err)
		}
	}
	for _, n := range []int64{-1, MinPids - 1, MaxPids + 1} {
		if err := g.SetPids(n); err == nil {
			t.Errorf("SetPids(%d) accepted", n)
		}
	}
}

// startForkLoop starts a shell that, once joined to g, forks sleeps
// forever; its stderr goes to the returned file.
func startForkLoop(t *testing.T, g *Group) (*exec.Cmd, *os.File) {
	t.Helper()
	errf, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "read go; while :; do sleep 1000 & done")
	cmd.Stderr = errf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if err := g.Join(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	return cmd, errf
}

func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(pollEvery)
	}
}

func TestPidsLimitStopsForkLoop(t *testing.T) {
	h := realHierarchy(t)
	g := create(t, h, Limits{Pids: MinPids})
	current := filepath.Join(g.dirs["pids"], "pids.current")
	_, errf := startForkLoop(t, g)
	peak := int64(0)
	until(t, "the fork loop to fail a fork", func() bool {
		n, err := readInt(current)
		if err != nil {
			t.Fatal(err)
		}
		peak = max(peak, n)
		b, _ := os.ReadFile(errf.Name())
		s := strings.ToLower(string(b))
		return strings.Contains(s, "cannot fork") || strings.Contains(s, "resource temporarily unavailable")
	})
	for range 100 { // keep sampling: the count must never pass the limit
		n, err := readInt(current)
		if err != nil {
			t.Fatal(err)
		}
		peak = max(peak, n)
	}
	if peak > MinPids {
		t.Errorf("pids.current reached %d, over pids.max %d", peak, MinPids)
	}
	pids, err := g.Pids()
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(pids)) > MinPids {
		t.Errorf("%d processes in the group, over the limit %d", len(pids), MinPids)
	}
	b, _ := os.ReadFile(errf.Name())
	t.Logf("peak pids.current %d; shell said: %.200s", peak, b)
	// The rest of the machine still forks.
	if out, err := exec.Command("sh", "-c", "echo outside").Output(); err != nil || strings.TrimSpace(string(out)) != "outside" {
		t.Errorf("a process outside the group could not run: %v %q", err, out)
	}
}

func hogCmd(t *testing.T, join []string) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"=hog", joinEnv+"="+strings.Join(join, "\n"), hogEnv+"="+strconv.Itoa(hogBytes))
	return cmd
}

func TestMemoryLimitOOMKills(t *testing.T) {
	h := realHierarchy(t)
	g := create(t, h, Limits{MemoryBytes: hogLimit, Pids: 256})
	out, err := hogCmd(t, g.ProcsFiles()).Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("hog in a %d MiB group: err %v, output %q; want it killed", hogLimit>>20, err, out)
	}
	ws := exit.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("hog in the group ended with %v (stderr %q), want SIGKILL from the OOM killer", exit, exit.Stderr)
	}
	if h.Version() == 1 {
		t.Logf("memory.oom_control:\n%s", readFile(t, filepath.Join(g.dirs["memory"], "memory.oom_control")))
	}
	// The same allocation outside the group survives.
	out, err = hogCmd(t, nil).Output()
	if err != nil || string(out) != "survived" {
		t.Fatalf("hog outside the group: %v %q", err, out)
	}
}

func testKillForkLoop(t *testing.T, h, killer *Hierarchy) {
	g := create(t, h, Limits{Pids: 512})
	cmd, _ := startForkLoop(t, g)
	until(t, "the fork loop to get going", func() bool {
		pids, err := g.Pids()
		if err != nil {
			t.Fatal(err)
		}
		return len(pids) >= 32
	})
	kg, err := killer.Open(g.Name())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := kg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if pids, err := g.Pids(); err != nil || len(pids) != 0 {
		t.Fatalf("after Kill: %v %v", pids, err)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("the fork loop's shell exited cleanly")
	}
	if h.Version() == 1 {
		if s := readFile(t, filepath.Join(g.dirs[freezer], "freezer.state")); s != "THAWED" {
			t.Errorf("freezer left %s", s)
		}
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
}

func TestKillForkLoop(t *testing.T) {
	h := realHierarchy(t)
	testKillForkLoop(t, h, h)
}

// TestKillForkLoopWithoutFreezer kills through a Hierarchy that does not
// know the freezer: the kill-and-repeat path hosts without it take.
func TestKillForkLoopWithoutFreezer(t *testing.T) {
	h := realHierarchy(t)
	if h.Version() != 1 {
		t.Skip("the freezer-less path is v1's")
	}
	noFreezer := &Hierarchy{version: 1, v1: map[string]string{}}
	for _, c := range needed {
		noFreezer.v1[c] = h.v1[c]
	}
	testKillForkLoop(t, h, noFreezer)
}

func TestKillAndRemoveMissingGroup(t *testing.T) {
	h := realHierarchy(t)
	g, err := h.Open(randomName(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Kill(context.Background()); err != nil {
		t.Errorf("Kill of a missing group: %v", err)
	}
	if err := g.Remove(); err != nil {
		t.Errorf("Remove of a missing group: %v", err)
	}
	if _, err := g.Pids(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Pids of a missing group: %v, want ErrNotExist", err)
	}
}

func TestRemove(t *testing.T) {
	h := realHierarchy(t)
	g := create(t, h, Limits{Pids: 64})
	s := startSleep(t)
	if err := g.Join(s.Process.Pid); err != nil {
		t.Fatal(err)
	}
	// The kernel refuses to remove a group with a process in it.
	if err := g.Remove(); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("Remove of an occupied group: %v, want EBUSY", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.uniqueDirs() {
		if exists(d) {
			t.Errorf("%s still there", d)
		}
		if !exists(filepath.Dir(d)) {
			t.Errorf("the shared parent %s was removed", filepath.Dir(d))
		}
	}
}

func TestKillEndsWithContext(t *testing.T) {
	h := realHierarchy(t)
	g := create(t, h, Limits{Pids: 64})
	s := startSleep(t)
	if err := g.Join(s.Process.Pid); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Kill(ctx); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "1 processes left") {
		t.Fatalf("Kill with an ended context: %v, want context.Canceled and a count", err)
	}
}
