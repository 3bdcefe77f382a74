package broker_test

// Fork spawn against the bare work it needs, in one `go test -bench` run
// (scripts/bench-spawn.sh, docs/benchmarks.md), for repositories of 1,
// 100 and 10,000 files:
//
//	BenchmarkForkSpawn      send of a fork spawn -> the broker first sees the child's agent
//	                        (its worker log's stamp of that moment, so ms/op, not ns/op)
//	BenchmarkForkSpawnBare  a fresh sandbox created and started, the fork's clone inside
//	                        it (upload-pack in the orchestrator -> fetch in the sandbox,
//	                        checkout), one process started in it
//
// Each op's child or sandbox is destroyed, and the disk synced, outside
// the timer. Read the ms/op metric: the spawn's ns/op includes up to 20 ms
// of polling for its log.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/config"
	"agentbox/internal/gitx"
)

var benchRepoSizes = []int{1, 100, 10000}

// benchSpawnEnv is a broker whose repository holds files small files and
// the scripted agent, with an orchestrator "lead".
func benchSpawnEnv(b *testing.B, files int) *testEnv {
	e := newTestEnv(b)
	e.withAgent()
	dir := filepath.Join(e.repo, "src")
	for i := range files {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(sub, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%05d.txt", i)), []byte(fmt.Sprintf("file %d\n", i)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	hostGit(b, e.repo, "add", ".")
	hostGit(b, e.repo, "commit", "-q", "-m", fmt.Sprintf("%d files", files))
	e.orchestrator("lead")
	return e
}

func BenchmarkForkSpawn(b *testing.B) {
	for _, files := range benchRepoSizes {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			e := benchSpawnEnv(b, files)
			lead := e.client("lead")
			var total time.Duration
			n := 0
			for b.Loop() {
				n++
				name := fmt.Sprintf("b%d", n)
				id := "s-" + name
				log := filepath.Join(e.state, broker.LogDir, name+"."+id+".log")
				sent := time.Now()
				if st := spawn(b, lead, id, map[string]any{"branch": name, "prompt": "stay-busy", "on_done": "keep"}); st.State != "started" {
					b.Fatalf("spawn: %s %q", st.State, st.Detail)
				}
				total += logStamp(b, log, " agent seen: ").Sub(sent)
				b.StopTimer()
				statusOf(b, lead, id, "done", "failed")
				if st := sendManifest(b, lead, map[string]any{"id": "d-" + name, "type": "destroy", "child": name, "force": true}); st.State != "done" {
					b.Fatalf("destroy: %s %q", st.State, st.Detail)
				}
				syscall.Sync() // the removal's writeback lands outside the next op
				b.StartTimer()
			}
			b.ReportMetric(float64(total)/1e6/float64(n), "ms/op")
		})
	}
}

func BenchmarkForkSpawnBare(b *testing.B) {
	for _, files := range benchRepoSizes {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			e := benchSpawnEnv(b, files)
			ctx := context.Background()
			be := backendOf(b, e)
			src := gitx.SandboxRepo("lead", benchRunner(be, "lead"), backend.WorkspacePath)
			_, commit, err := gitx.Head(ctx, src)
			if err != nil {
				b.Fatal(err)
			}
			limits := backend.Limits{}
			if !noLimits() {
				l := config.DefaultBroker().Limits
				limits = backend.Limits{Pids: l.Pids, MemoryBytes: l.MemoryBytes, CPUWeight: l.CPUWeight}
			}
			var total time.Duration
			n := 0
			for b.Loop() {
				n++
				name := fmt.Sprintf("bare%d", n)
				start := time.Now()
				if _, err := be.Create(ctx, backend.CreateOptions{Name: name, HostUID: benchHostUID(), Limits: limits}); err != nil {
					b.Fatal(err)
				}
				if err := be.Start(ctx, name); err != nil {
					b.Fatal(err)
				}
				run := benchRunner(be, name)
				dst := gitx.SandboxRepo(name, run, backend.WorkspacePath)
				if err := gitx.Init(ctx, dst); err != nil {
					b.Fatal(err)
				}
				if err := gitx.Transfer(ctx, src, commit, dst, "refs/jailbee/start", gitx.TransferOptions{}); err != nil {
					b.Fatal(err)
				}
				if err := gitx.Checkout(ctx, dst, "bench", commit); err != nil {
					b.Fatal(err)
				}
				if code, err := run.Run(ctx, gitx.Cmd{Argv: []string{"sh", "-c", "exit 0"}}); err != nil || code != 0 {
					b.Fatalf("process in the sandbox: %d %v", code, err)
				}
				total += time.Since(start)
				b.StopTimer()
				if err := be.Destroy(ctx, name); err != nil {
					b.Fatal(err)
				}
				syscall.Sync()
				b.StartTimer()
			}
			b.ReportMetric(float64(total)/1e6/float64(n), "ms/op")
		})
	}
}

func benchRunner(be backend.Backend, name string) gitx.Runner {
	return gitx.RunnerFunc(func(ctx context.Context, c gitx.Cmd) (int, error) {
		return be.Exec(ctx, name, backend.ExecOptions{Argv: c.Argv, Dir: c.Dir, Env: c.Env,
			Stdin: c.Stdin, Stdout: c.Stdout, Stderr: c.Stderr, Started: c.Started})
	})
}

// benchHostUID is a random uid of the default sandbox range when run as
// root (as the broker would give), else 0 (the caller's own).
func benchHostUID() int {
	if os.Geteuid() != 0 {
		return 0
	}
	r := config.DefaultBroker().SandboxUIDs
	var buf [4]byte
	rand.Read(buf[:])
	return int(r.First + binary.LittleEndian.Uint32(buf[:])%r.Count)
}

// logStamp polls the worker log at path until a line contains marker and
// returns that line's time stamp: the broker's own clock says when, so the
// polling's period does not count.
func logStamp(b *testing.B, path, marker string) time.Time {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(path)
		for line := range strings.Lines(string(data)) {
			stamp, _, found := strings.Cut(line, marker)
			if !found {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, stamp)
			if err != nil {
				b.Fatalf("%s: a line without a time stamp: %q", path, line)
			}
			return at
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatalf("%s never said %q", path, marker)
	return time.Time{}
}
