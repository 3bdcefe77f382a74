package broker_test

// A host command's cost against the number of sandboxes, in one `go test
// -bench` run (scripts/bench-host.sh, docs/benchmarks.md): BenchmarkHostNew
// times `new` over the admin socket of a `jailbee broker` process that
// serves 1 and then 1,000 sandboxes, each holding MaxConnsPerSandbox idle
// connections, and reads the broker's VmRSS.
//
// 1,000 running bubblewrap sandboxes are too heavy for a small machine, so
// the sandboxes are built from what one costs the broker: a real local
// backend instance (created, not started: no unit), its broker.db record
// (state stopped, host uid claimed), and, once the broker has started and
// served it, its socket, egress socket and listeners, with the idle
// connections. The `new` each op times is a real one: a bubblewrap unit
// started and its checkout filled. Read the custom metrics, not ns/op.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/grant"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// hostBenchSizes are the sandbox counts BenchmarkHostNew compares.
var hostBenchSizes = []int{1, 1000}

// hostBenchFamily is the size of one tree of the built sandboxes: an
// orchestrator and hostBenchFamily-1 children.
const hostBenchFamily = 10

// BenchmarkHostNew reports new-ms/op (the mean of the timed `new`s, each
// sandbox destroyed and the disk synced untimed before the next) and
// rss-MiB (the broker's VmRSS with every idle connection held, after the
// ops).
func BenchmarkHostNew(b *testing.B) {
	for _, n := range hostBenchSizes {
		b.Run(fmt.Sprintf("sandboxes=%d", n), func(b *testing.B) {
			bin, state, repo := jailbeeBin(b), shortTempDir(b), makeRepo(b)
			buildSandboxes(b, state, repo, n)
			p := startProcBroker(b, bin, state)
			holdIdleConns(b, p, n)
			var total time.Duration
			ops := 0
			for b.Loop() {
				ops++
				name := fmt.Sprintf("bench%d", ops)
				start := time.Now()
				p.newSandbox(wire.NewArgs{Name: name, Repo: repo, Role: wire.RoleOrchestrator})
				total += time.Since(start)
				if err := p.adminCall("destroy", wire.DestroyArgs{Name: name, Force: true}, nil); err != nil {
					b.Fatalf("destroy %s: %v", name, err)
				}
				syscall.Sync() // the removal's writeback lands outside the next op
			}
			time.Sleep(2 * time.Second) // a round or two, as the memory test waits
			rss, _ := vmRSS(b, p.pid())
			b.ReportMetric(float64(total)/1e6/float64(ops), "new-ms/op")
			b.ReportMetric(float64(rss)/1024, "rss-MiB")
		})
	}
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
