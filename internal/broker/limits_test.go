package broker_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

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
	yaml := "limits:\n  pids: 100\n  memory: 96MiB\n"
	if err := os.WriteFile(filepath.Join(e.repo, ".jailbee", "config.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	e.orchestrator("capped")

	h, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	limits := func(name string) cgroup.Limits {
		t.Helper()
		g, err := h.Open(e.row(name).UUID)
		if err != nil {
			t.Fatal(err)
		}
		l, err := g.Limits()
		if err != nil {
			t.Fatalf("limits of %s: %v", name, err)
		}
		return l
	}
	def := config.DefaultBroker().Limits
	if got, want := limits("plain"), (cgroup.Limits{Pids: def.Pids, MemoryBytes: def.MemoryBytes, CPUWeight: def.CPUWeight}); got != want {
		t.Errorf("plain: %+v, want the broker's defaults %+v", got, want)
	}
	if got, want := limits("capped"), (cgroup.Limits{Pids: 100, MemoryBytes: 96 << 20, CPUWeight: def.CPUWeight}); got != want {
		t.Errorf("capped: %+v, want the repository's pids and memory with the default weight %+v", got, want)
	}
	// The limit holds inside: the shell's fork fails at 100 tasks.
	res, err := e.execIn("capped", "", "sh", "-c", "i=0; while [ $i -lt 150 ]; do sleep 30 </dev/null >/dev/null 2>&1 & i=$((i+1)); done")
	if err != nil || res.exit == 0 {
		t.Fatalf("150 background tasks in a sandbox limited to 100: %v, exit %d, %s", err, res.exit, res.stderr)
	}
	cur, err := os.ReadFile(filepath.Join(h.Mountpoint("pids"), cgroup.Parent, e.row("capped").UUID, "pids.current"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(cur))); err != nil || n > 100 || n < 90 {
		t.Fatalf("pids.current of a sandbox limited to 100 tasks: %q", cur)
	}
}
