package broker_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/cgroup"
	"agentbox/internal/config"
)

// TestRepoLimitsOverrideBrokerDefaults: a sandbox's cgroups get the
// broker's default limits, with each key the repository's
// .jailbee/config.yaml sets in its place.
func TestRepoLimitsOverrideBrokerDefaults(t *testing.T) {
	if noLimits() {
		t.Skip("no cgroups here: sandboxes run without limits")
	}
	e := newTestEnv(t)
	e.orchestrator("plain")

	if err := os.MkdirAll(filepath.Join(e.repo, ".jailbee"), 0o755); err != nil {
		t.Fatal(err)
	}
	yaml := "limits:\n  pids: 100\n  memory: 96MiB\n  disk: 1GiB\n"
	if err := os.WriteFile(filepath.Join(e.repo, ".jailbee", "config.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	e.orchestrator("capped")

	def := config.DefaultBroker().Limits
	// The disk limit is the root disk's size on Incus; the local backend
	// has no disk of its own to size.
	disk := func(d int64) int64 {
		if e.incusProject == "" {
			return 0
		}
		return d
	}
	if got, want := e.limits("plain"), (backend.Limits{Pids: def.Pids, MemoryBytes: def.MemoryBytes, CPUWeight: def.CPUWeight, DiskBytes: disk(def.DiskBytes)}); got != want {
		t.Errorf("plain: %+v, want the broker's defaults %+v", got, want)
	}
	if got, want := e.limits("capped"), (backend.Limits{Pids: 100, MemoryBytes: 96 << 20, CPUWeight: def.CPUWeight, DiskBytes: disk(1 << 30)}); got != want {
		t.Errorf("capped: %+v, want the repository's pids, memory and disk with the default weight %+v", got, want)
	}
	// The limit holds inside: the shell's fork fails at 100 tasks.
	res, err := e.execIn("capped", "", "sh", "-c", "i=0; while [ $i -lt 150 ]; do sleep 30 </dev/null >/dev/null 2>&1 & i=$((i+1)); done")
	if err != nil || res.exit == 0 {
		t.Fatalf("150 background tasks in a sandbox limited to 100: %v, exit %d, %s", err, res.exit, res.stderr)
	}
	if n := e.tasks("capped"); n > 100 || n < 90 {
		t.Fatalf("tasks in a sandbox limited to 100: %d", n)
	}
}

// limits reads a sandbox's limits where its backend keeps them: the local
// backend's cgroups, or the Incus container's limits.* config (whose CPU
// allowance, a percentage capped at 100, reads back as a weight) and its
// root disk's size.
func (e *testEnv) limits(name string) backend.Limits {
	e.t.Helper()
	if e.incusProject != "" {
		get := func(key string) string {
			out, err := exec.Command("incus", "config", "get", "--project", e.incusProject, name, key).Output()
			if err != nil {
				e.t.Fatalf("incus config get %s %s: %v", name, key, err)
			}
			return strings.TrimSpace(string(out))
		}
		pids, err1 := strconv.ParseInt(get("limits.processes"), 10, 64)
		mem, err2 := strconv.ParseInt(strings.TrimSuffix(get("limits.memory"), "B"), 10, 64)
		cpu, err3 := strconv.Atoi(strings.TrimSuffix(get("limits.cpu.allowance"), "%"))
		out, err4 := exec.Command("incus", "config", "device", "get", "--project", e.incusProject, name, "root", "size").Output()
		disk, err5 := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(out)), "B"), 10, 64)
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			e.t.Fatalf("limits of %s: %v", name, err)
		}
		return backend.Limits{Pids: pids, MemoryBytes: mem, CPUWeight: cpu, DiskBytes: disk}
	}
	h, err := cgroup.Detect()
	if err != nil {
		e.t.Fatal(err)
	}
	g, err := h.Open(e.row(name).UUID)
	if err != nil {
		e.t.Fatal(err)
	}
	l, err := g.Limits()
	if err != nil {
		e.t.Fatalf("limits of %s: %v", name, err)
	}
	// pids.max holds the unit's own tasks on top of the sandbox's limit.
	return backend.Limits{Pids: l.Pids - e.unitTasks(name), MemoryBytes: l.MemoryBytes, CPUWeight: l.CPUWeight}
}

// unitTasks counts the local unit's own tasks in its sandbox's pids
// cgroup: bubblewrap's monitor and the supervisor's threads.
func (e *testEnv) unitTasks(name string) int64 {
	e.t.Helper()
	threads, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", e.supervisorPID(name)))
	if err != nil {
		e.t.Fatalf("the supervisor of %s: %v", name, err)
	}
	return 1 + int64(len(threads))
}

// supervisorPID is the host pid of a local sandbox's supervisor, as its
// meta.json records it.
func (e *testEnv) supervisorPID(name string) int {
	e.t.Helper()
	var meta struct{ PID int }
	if err := json.Unmarshal([]byte(readFile(e.t, filepath.Join(e.state, "sandboxes", name, "meta.json"))), &meta); err != nil || meta.PID <= 0 {
		e.t.Fatalf("the supervisor of %s: %v %+v", name, err, meta)
	}
	return meta.PID
}

// tasks counts a sandbox's tasks: its pids cgroup's less its unit's, or
// on Incus its container's processes.
func (e *testEnv) tasks(name string) int {
	e.t.Helper()
	if e.incusProject != "" {
		out, err := exec.Command("incus", "query", "/1.0/instances/"+name+"/state?project="+e.incusProject).Output()
		if err != nil {
			e.t.Fatalf("incus state of %s: %v", name, err)
		}
		var st struct {
			Processes int `json:"processes"`
		}
		if err := json.Unmarshal(out, &st); err != nil {
			e.t.Fatal(err)
		}
		return st.Processes
	}
	h, err := cgroup.Detect()
	if err != nil {
		e.t.Fatal(err)
	}
	cur, err := os.ReadFile(filepath.Join(h.Mountpoint("pids"), cgroup.Parent, e.row(name).UUID, "pids.current"))
	if err != nil {
		e.t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(cur)))
	if err != nil {
		e.t.Fatalf("pids.current of %s: %q", name, cur)
	}
	return n - int(e.unitTasks(name))
}

// TestUnitEndedIsRecordedStopped: a child whose supervisor is killed (as
// the OOM killer does to it in a sandbox whose memory fills with tmpfs
// pages, which belong to no process) ends with every process in it. The
// broker's round sees the unit down: the child is recorded stopped, and
// its orchestrator is told, kind blocked, instead of the agent's end
// with "the child keeps running".
func TestUnitEndedIsRecordedStopped(t *testing.T) {
	e := newTestEnv(t)
	if e.incusProject != "" {
		t.Skip("the local backend's unit supervisor")
	}
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "fill", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `fill` is ready")
	if err := syscall.Kill(e.supervisorPID("fill"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	blocked := messageFrom(t, lead, "fill", "blocked")
	if want := "`fill` stopped on its own (its sandbox's supervisor ended: out of memory?), with every process in it, before it reported done: it is recorded stopped; restart, import or destroy it"; blocked.Body != want {
		t.Fatalf("blocked message: %q, want %q", blocked.Body, want)
	}
	if info := e.info("fill"); info.State != "stopped" || info.Running {
		t.Fatalf("the child whose unit ended: %+v", info)
	}
	// It restarts like any stopped child.
	wantStatus(t, sendManifest(t, lead, restart("r-1", "fill", "after the kill", nil)), "started", "restart of child `fill` started")
	if done := messageFrom(t, lead, "fill", "done"); done.Body != "done: after the kill" {
		t.Fatalf("done after the restart: %+v", done)
	}
}
