package broker_test

// A host command's cost against the number of sandboxes, in one `go test
// -bench` run (scripts/bench-host.sh, docs/benchmarks.md): BenchmarkHostNew
// times `new` over the admin sockets of two `jailbee broker` processes,
// one serving 1 sandbox and one 1,000, each sandbox holding
// MaxConnsPerSandbox idle connections, and reads the brokers' VmRSS.
//
// 1,000 running bubblewrap sandboxes are too heavy for a small machine, so
// the sandboxes are built from what one costs the broker: a real local
// backend instance (created, not started: no unit), its broker.db record
// (state stopped, host uid claimed), and, once the broker has started and
// served it, its socket, egress socket and listeners, with the idle
// connections. The `new` each op times is a real one: a bubblewrap unit
// started and its checkout filled. Read the custom metrics, not ns/op.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/grant"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// hostBenchFamily is the size of one tree of the built sandboxes: an
// orchestrator and hostBenchFamily-1 children.
const hostBenchFamily = 10

// hostBench is one broker process of BenchmarkHostNew with its sandboxes.
type hostBench struct {
	p    *procBroker
	repo string
	wall time.Duration // the timed news
	cpu  int64         // the broker's CPU time over the ops, in clock ticks
}

func newHostBench(b *testing.B, bin string, n int) *hostBench {
	state, repo := shortTempDir(b), makeRepo(b)
	buildSandboxes(b, state, repo, n)
	h := &hostBench{p: startProcBroker(b, bin, state), repo: repo}
	holdIdleConns(b, h.p, n)
	return h
}

// op times one new, then destroys the sandbox and syncs the disk, untimed.
func (h *hostBench) op(b *testing.B, name string) {
	start := time.Now()
	h.p.newSandbox(wire.NewArgs{Name: name, Repo: h.repo, Role: wire.RoleOrchestrator})
	h.wall += time.Since(start)
	if err := h.p.adminCall("destroy", wire.DestroyArgs{Name: name, Force: true}, nil); err != nil {
		b.Fatalf("destroy %s: %v", name, err)
	}
	syscall.Sync() // the removal's writeback lands outside the next op
}

// BenchmarkHostNew runs two brokers, one serving 1 sandbox and one serving
// 1,000, and alternates one `new` on each per op, so drift in the shared
// machine's load hits both alike. It reports each one's mean wall time
// (new1-ms/op, new1000-ms/op) and their ratio (new1000/new1), each
// broker's own CPU time per op (cpu1-ms/op, cpu1000-ms/op: its rounds
// included), and each broker's VmRSS with every idle connection held,
// after the ops (rss1-MiB, rss1000-MiB).
func BenchmarkHostNew(b *testing.B) {
	bin := jailbeeBin(b)
	one, many := newHostBench(b, bin, 1), newHostBench(b, bin, 1000)
	syscall.Sync() // the setup's writeback lands before the first op
	cpu0, cpu1 := procCPU(b, one.p.pid()), procCPU(b, many.p.pid())
	ops := 0
	for b.Loop() {
		ops++
		one.op(b, fmt.Sprintf("bench%d", ops))
		many.op(b, fmt.Sprintf("bench%d", ops))
	}
	one.cpu, many.cpu = procCPU(b, one.p.pid())-cpu0, procCPU(b, many.p.pid())-cpu1
	time.Sleep(2 * time.Second) // a round or two, as the memory test waits
	rss1, _ := vmRSS(b, one.p.pid())
	rss1000, _ := vmRSS(b, many.p.pid())
	perOp := func(d time.Duration) float64 { return float64(d) / 1e6 / float64(ops) }
	b.ReportMetric(perOp(one.wall), "new1-ms/op")
	b.ReportMetric(perOp(many.wall), "new1000-ms/op")
	b.ReportMetric(float64(many.wall)/float64(one.wall), "new1000/new1")
	b.ReportMetric(float64(one.cpu)*10/float64(ops), "cpu1-ms/op") // 100 ticks a second
	b.ReportMetric(float64(many.cpu)*10/float64(ops), "cpu1000-ms/op")
	b.ReportMetric(float64(rss1)/1024, "rss1-MiB")
	b.ReportMetric(float64(rss1000)/1024, "rss1000-MiB")
}

// procCPU is a process's user and system CPU time, in clock ticks
// (/proc/PID/stat fields 14 and 15).
func procCPU(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which ends with the last ')'.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return utime + stime
}

// buildSandboxes gives the state dir n sandboxes before a broker starts
// on it: trees of an orchestrator and its children, each a local backend
// instance (not started) with its record, recorded stopped.
func buildSandboxes(b *testing.B, state, repo string, n int) {
	ctx := context.Background()
	be := localBackend(b, state)
	st, err := store.Open(filepath.Join(state, broker.DBFile))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	commit := hostGit(b, repo, "rev-parse", "HEAD")
	g, err := json.Marshal(grant.Default())
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		tree, member := i/hostBenchFamily, i%hostBenchFamily
		sb := store.Sandbox{Name: fmt.Sprintf("t%03d", tree), Role: wire.RoleOrchestrator, Branch: "main", Grant: string(g)}
		if member > 0 {
			sb = store.Sandbox{Name: fmt.Sprintf("t%03d-c%d", tree, member), Role: wire.RoleChild,
				Parent: fmt.Sprintf("t%03d", tree), Branch: fmt.Sprintf("work/c%d", member)}
		}
		sb.Repo, sb.Imported, sb.State = repo, commit, store.StateStopped
		for {
			sb.HostUID = benchHostUID()
			if err := st.ClaimHostUID(ctx, sb.HostUID); err == nil {
				break
			}
		}
		inst, err := be.Create(ctx, backend.CreateOptions{Name: sb.Name, HostUID: sb.HostUID})
		if err != nil {
			b.Fatal(err)
		}
		sb.UUID = inst.UUID
		if err := st.CreateSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
	}
}

// holdIdleConns opens MaxConnsPerSandbox connections to each of the n
// sandboxes' sockets and holds them until the benchmark ends.
func holdIdleConns(b *testing.B, p *procBroker, n int) {
	var list []wire.SandboxInfo
	if err := p.adminCall("ls", nil, &list); err != nil {
		b.Fatal(err)
	}
	if len(list) != n {
		b.Fatalf("ls shows %d sandboxes, want %d", len(list), n)
	}
	for _, sb := range list {
		if sb.Socket == nil {
			b.Fatalf("sandbox %s has no socket", sb.Name)
		}
		for range broker.MaxConnsPerSandbox {
			c, err := net.Dial("unix", *sb.Socket)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
		}
	}
}
