package cgroup

// The v2 tests below are the only part of this package NOT run against a
// real kernel: this host is cgroup v1 (hybrid, with no controller in its
// unified tree), so they check the v2 writing logic against a fake tree in
// a temp directory. fakeV2's onMkdir plays the kernel's part: a new
// directory gets the control files of the controllers its parent enables
// in cgroup.subtree_control. What the fake cannot show (the kernel parsing
// the values, the no-internal-process rule, delegation checks on move,
// cgroup.kill killing) is covered by reading the kernel docs, not here.

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

type fakeV2Opts struct {
	rootControllers string // the root's cgroup.controllers
	rootEnabled     string // the root's cgroup.subtree_control
	noSwap          bool   // no memory.swap.max (no swap accounting)
}

func writeFakeFiles(t testing.TB, dir string, files map[string]string) {
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func fakeV2(t *testing.T, o fakeV2Opts) *Hierarchy {
	t.Helper()
	root := t.TempDir()
	writeFakeFiles(t, root, map[string]string{
		"cgroup.controllers":     o.rootControllers + "\n",
		"cgroup.subtree_control": o.rootEnabled + "\n",
		"cgroup.procs":           "1\n",
	})
	return v2HierarchyForTest(root, func(dir string) error {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"))
		if err != nil {
			return err
		}
		var on []string
		for _, tok := range strings.Fields(string(b)) {
			on = append(on, strings.TrimPrefix(tok, "+")) // as written: "+pids ..."
		}
		files := map[string]string{
			"cgroup.controllers":     strings.Join(on, " ") + "\n",
			"cgroup.subtree_control": "\n",
			"cgroup.procs":           "",
			"cgroup.events":          "populated 0\nfrozen 0\n",
			"cgroup.kill":            "",
			"cgroup.freeze":          "0\n",
		}
		if slices.Contains(on, "pids") {
			files["pids.max"], files["pids.current"] = "max\n", "0\n"
		}
		if slices.Contains(on, "memory") {
			files["memory.max"], files["memory.current"] = "max\n", "0\n"
			if !o.noSwap {
				files["memory.swap.max"] = "max\n"
			}
		}
		if slices.Contains(on, "cpu") {
			files["cpu.weight"] = "100\n"
		}
		writeFakeFiles(t, dir, files)
		return nil
	})
}

const allControllers = "cpuset cpu io memory hugetlb pids rdma misc"

func TestV2CreateEnablesControllersAndWritesLimits(t *testing.T) {
	h := fakeV2(t, fakeV2Opts{rootControllers: allControllers})
	l := Limits{Pids: 300, MemoryBytes: 256 << 20, CPUWeight: 700}
	g, err := h.Create("box1", l)
	if err != nil {
		t.Fatal(err)
	}
	root := h.Mountpoint("pids")
	parent := filepath.Join(root, Parent)
	for _, f := range []string{filepath.Join(root, "cgroup.subtree_control"), filepath.Join(parent, "cgroup.subtree_control")} {
		if got := readFile(t, f); got != "+pids +memory +cpu" {
			t.Errorf("%s = %q, want +pids +memory +cpu", f, got)
		}
	}
	dir := filepath.Join(parent, "box1")
	for f, want := range map[string]string{"pids.max": "300", "memory.max": "268435456", "memory.swap.max": "0", "cpu.weight": "700"} {
		if got := readFile(t, filepath.Join(dir, f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	checkFiles(t, h, g, l)
	if got, want := g.ProcsFiles(), []string{filepath.Join(dir, "cgroup.procs")}; !slices.Equal(got, want) {
		t.Errorf("ProcsFiles() = %q, want %q", got, want)
	}
	if err := g.Join(4242); err != nil {
		t.Fatal(err)
	}
	if pids, err := g.Pids(); err != nil || !slices.Equal(pids, []int{4242}) {
		t.Errorf("Pids() = %v, %v", pids, err)
	}
}

func TestV2ReuseRewritesAndZeroClears(t *testing.T) {
	h := fakeV2(t, fakeV2Opts{rootControllers: allControllers})
	if _, err := h.Create("box", Limits{Pids: 20, MemoryBytes: 64 << 20, CPUWeight: 5}); err != nil {
		t.Fatal(err)
	}
	for _, l := range []Limits{{Pids: 4000, MemoryBytes: 1 << 30, CPUWeight: 10000}, {}} {
		g, err := h.Create("box", l)
		if err != nil {
			t.Fatal(err)
		}
		checkFiles(t, h, g, l)
	}
	dir := filepath.Join(h.Mountpoint("pids"), Parent, "box")
	for f, want := range map[string]string{"pids.max": "max", "memory.max": "max", "memory.swap.max": "max", "cpu.weight": "100"} {
		if got := readFile(t, filepath.Join(dir, f)); got != want {
			t.Errorf("after clearing: %s = %q, want %q", f, got, want)
		}
	}
}

func TestV2EnabledControllersNotRewritten(t *testing.T) {
	// An administrator's parent already set up (a delegated subtree): its
	// subtree_control files are left untouched.
	h := fakeV2(t, fakeV2Opts{rootControllers: allControllers, rootEnabled: "cpu io memory pids"})
	parent := filepath.Join(h.Mountpoint("pids"), Parent)
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFakeFiles(t, parent, map[string]string{"cgroup.controllers": "cpu io memory pids\n", "cgroup.subtree_control": "memory pids cpu\n"})
	if _, err := h.Create("box", Limits{Pids: 64}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(h.Mountpoint("pids"), "cgroup.subtree_control")); got != "cpu io memory pids" {
		t.Errorf("root subtree_control rewritten: %q", got)
	}
	if got := readFile(t, filepath.Join(parent, "cgroup.subtree_control")); got != "memory pids cpu" {
		t.Errorf("parent subtree_control rewritten: %q", got)
	}
}

func TestV2PartlyEnabledIsCompleted(t *testing.T) {
	h := fakeV2(t, fakeV2Opts{rootControllers: allControllers, rootEnabled: "memory io"})
	if _, err := h.Create("box", Limits{}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(h.Mountpoint("pids"), "cgroup.subtree_control")); got != "+pids +memory +cpu" {
		t.Errorf("root subtree_control = %q, want +pids +memory +cpu", got)
	}
}

func TestV2NoSwapFile(t *testing.T) {
	h := fakeV2(t, fakeV2Opts{rootControllers: allControllers, noSwap: true})
	g, err := h.Create("box", Limits{MemoryBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if exists(filepath.Join(h.Mountpoint("memory"), Parent, "box", "memory.swap.max")) {
		t.Error("memory.swap.max was created")
	}
	checkFiles(t, h, g, Limits{MemoryBytes: 64 << 20})
}

func TestV2ControllerUnavailable(t *testing.T) {
	h := fakeV2(t, fakeV2Opts{rootControllers: "memory pids io"})
	_, err := h.Create("box", Limits{})
	if err == nil || !strings.Contains(err.Error(), "controller cpu is not available") {
		t.Fatalf("err = %v, want one naming the missing cpu controller", err)
	}
}

func TestV2KillWritesCgroupKill(t *testing.T) {
	h := fakeV2(t, fakeV2Opts{rootControllers: allControllers})
	g, err := h.Create("box", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Join(4242); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.Mountpoint("pids"), Parent, "box")
	// The fake kernel empties the group once cgroup.kill is written.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.kill")); string(b) == "1" {
				os.WriteFile(filepath.Join(dir, "cgroup.procs"), nil, 0o644)
				return
			}
			time.Sleep(pollEvery)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
}

func TestV2KillFreezesWithoutCgroupKill(t *testing.T) {
	// A pre-5.14 kernel: no cgroup.kill, so Kill freezes through
	// cgroup.freeze and thaws again.
	h := fakeV2(t, fakeV2Opts{rootControllers: allControllers})
	g, err := h.Create("box", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.Mountpoint("pids"), Parent, "box")
	os.Remove(filepath.Join(dir, "cgroup.kill"))
	s := startSleep(t)
	if err := g.Join(s.Process.Pid); err != nil {
		t.Fatal(err)
	}
	// The fake kernel drops the pid from the group once the process is dead.
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Wait()
		os.WriteFile(filepath.Join(dir, "cgroup.procs"), nil, 0o644)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := g.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if ws := s.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("sleep ended with %v, want killed", s.ProcessState)
	}
	if got := readFile(t, filepath.Join(dir, "cgroup.freeze")); got != "0" {
		t.Errorf("cgroup.freeze left %q", got)
	}
}

// usableV2As runs Usable on the fake tree as uid, in a helper process.
func usableV2As(t *testing.T, h *Hierarchy, uid int, selfCgroup string) string {
	t.Helper()
	f := filepath.Join(worldDir(t), "cgroup")
	if err := os.WriteFile(f, []byte(selfCgroup), 0o644); err != nil {
		t.Fatal(err)
	}
	return runHelper(t, "usable-v2", uid, v2RootEnv+"="+h.v2Mount, selfCgEnv+"="+f)
}

func TestV2Usable(t *testing.T) {
	needRoot(t) // to run the helper as another uid
	h := fakeV2(t, fakeV2Opts{rootControllers: allControllers, rootEnabled: "cpu memory pids"})
	root := h.v2Mount
	for d := root; d != "/"; d = filepath.Dir(d) {
		if strings.HasPrefix(d, os.TempDir()+"/") {
			os.Chmod(d, 0o755) // let the helper reach the fake tree
		}
	}
	parent := filepath.Join(root, Parent)
	uid := strconv.Itoa(nobodyUID)
	check := func(what, got string, want ...string) {
		t.Helper()
		t.Logf("%s: %s", what, got)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q does not contain %q", what, got, w)
			}
		}
	}
	check("root", usableV2As(t, h, 0, "0::/\n"), "ok")
	check("no parent", usableV2As(t, h, nobodyUID, "0::/\n"), parent+" does not exist", "uid "+uid, "mkdir "+parent, "chown "+uid)

	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFakeFiles(t, parent, map[string]string{"cgroup.controllers": "cpu memory pids", "cgroup.subtree_control": "", "cgroup.procs": "", "cgroup.threads": ""})
	check("parent not delegated", usableV2As(t, h, nobodyUID, "0::/\n"), parent+" is not delegated to uid "+uid, "chown "+uid+" "+parent)

	for _, p := range []string{parent, filepath.Join(parent, "cgroup.procs"), filepath.Join(parent, "cgroup.subtree_control"), filepath.Join(parent, "cgroup.threads")} {
		if err := os.Chown(p, nobodyUID, nobodyUID); err != nil {
			t.Fatal(err)
		}
	}
	check("broker outside the subtree", usableV2As(t, h, nobodyUID, "0::/user.slice\n"), "outside "+parent, parent+"/.broker")
	check("broker inside the subtree", usableV2As(t, h, nobodyUID, "0::/"+Parent+"/.broker\n"), "ok")

	writeFakeFiles(t, root, map[string]string{"cgroup.subtree_control": "io\n"})
	check("controllers not enabled", usableV2As(t, h, nobodyUID, "0::/"+Parent+"/.broker\n"), "not enabled below "+root, "+pids +memory +cpu")
}

func TestV2OwnCgroupAndCommonAncestor(t *testing.T) {
	for _, c := range []struct{ mountRoot, self, own, common string }{
		{"/", "0::/\n", "/", "/"},
		{"/", "0::/.broker\n", "/.broker", "/"},
		{"/", "0::/jailbee/.broker\n", "/jailbee/.broker", "/jailbee"},
		{"/", "12:pids:/x\n0::/user.slice/u.service\n", "/user.slice/u.service", "/"},
		{"/ns", "0::/ns/jailbee/.broker\n", "/jailbee/.broker", "/jailbee"},
		{"/ns", "0::/other\n", "", ""},
	} {
		f := filepath.Join(t.TempDir(), "cgroup")
		if err := os.WriteFile(f, []byte(c.self), 0o644); err != nil {
			t.Fatal(err)
		}
		h := &Hierarchy{version: 2, v2Mount: "/sys/fs/cgroup", v2MountRoot: c.mountRoot, selfCgroup: f}
		own, err := h.ownCgroupV2()
		if c.own == "" {
			if err == nil {
				t.Errorf("%q under mount root %s: got %q, want an error", c.self, c.mountRoot, own)
			}
			continue
		}
		if err != nil || own != c.own {
			t.Errorf("%q under mount root %s: %q %v, want %q", c.self, c.mountRoot, own, err, c.own)
		}
		if got := commonAncestor(own, "/"+Parent+"/x"); got != c.common {
			t.Errorf("common ancestor of %s and /jailbee/x: %q, want %q", own, got, c.common)
		}
	}
}
