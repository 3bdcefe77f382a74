package broker_test

// Fork spawn against the bare work it needs, in one `go test -bench` run
// (scripts/bench-spawn.sh, docs/benchmarks.md), for repositories of 1,
// 100 and 10,000 files. Each op of BenchmarkForkSpawn does both, one after
// the other:
//
//	spawn  send of a fork spawn -> the broker first sees the child's agent
//	bare   a fresh sandbox created and started, the fork's clone inside it
//	       (upload-pack in the orchestrator -> fetch in the sandbox,
//	       checkout), one process started in it; on Incus
//	       (JAILBEE_TEST_BACKEND=incus) the incus command line alone:
//	       `incus init` of the image, `incus start`, a bundle of the commit
//	       pushed in with `incus file push` and cloned there, one process
//
// Each child or sandbox is destroyed, and the disk synced, before the next
// step. Read the custom metrics, not ns/op.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/incus"
	"agentbox/internal/backend/incus/incustest"
	"agentbox/internal/broker"
	"agentbox/internal/config"
	"agentbox/internal/gitx"
	"agentbox/internal/inbox"
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

// BenchmarkForkSpawn alternates, in each op, one fork spawn and its bare
// work on the same broker and repository, so drift in the machine's load
// or disk state hits both alike; it reports each one's mean (spawn-ms/op,
// bare-ms/op) and their ratio (spawn/bare). ns/op, the sum of both with
// the waits between, means nothing here.
func BenchmarkForkSpawn(b *testing.B) {
	for _, files := range benchRepoSizes {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			e := benchSpawnEnv(b, files)
			bare := newBareSpawner(b, e)
			lead := e.client("lead")
			var spawnTotal, bareTotal time.Duration
			n := 0
			for b.Loop() {
				n++
				bareTotal += bare.op(b, fmt.Sprintf("bare%d", n))
				spawnTotal += forkSpawnOp(b, e, lead, fmt.Sprintf("b%d", n))
			}
			b.ReportMetric(float64(spawnTotal)/1e6/float64(n), "spawn-ms/op")
			b.ReportMetric(float64(bareTotal)/1e6/float64(n), "bare-ms/op")
			b.ReportMetric(float64(spawnTotal)/float64(bareTotal), "spawn/bare")
		})
	}
}

// forkSpawnOp sends a fork spawn of child name and returns the time from
// the send to the broker's first sight of its agent, by the worker log's
// own stamp (the polling's period does not count); then it waits for the
// child to be ready, destroys it and syncs the disk.
func forkSpawnOp(b *testing.B, e *testEnv, lead *inbox.Client, name string) time.Duration {
	id := "s-" + name
	log := filepath.Join(e.state, broker.LogDir, name+"."+id+".log")
	sent := time.Now()
	if st := spawn(b, lead, id, map[string]any{"branch": name, "prompt": "stay-busy", "on_done": "keep"}); st.State != "started" {
		b.Fatalf("spawn: %s %q", st.State, st.Detail)
	}
	took := logStamp(b, log, " agent seen: ").Sub(sent)
	statusOf(b, lead, id, "done", "failed")
	if st := sendManifest(b, lead, map[string]any{"id": "d-" + name, "type": "destroy", "child": name, "force": true}); st.State != "done" {
		b.Fatalf("destroy: %s %q", st.State, st.Detail)
	}
	syscall.Sync() // the removal's writeback lands outside the next op
	return took
}

// bareOp is the bare work of one fork spawn, timed.
type bareOp interface {
	op(b *testing.B, name string) time.Duration
}

// bareSpawner does the bare work of a fork spawn straight on the backend:
// a fresh sandbox created and started, the fork's clone inside it
// (upload-pack in the orchestrator -> fetch in the sandbox, checkout), one
// process started in it.
type bareSpawner struct {
	be     backend.Backend
	src    gitx.Repo
	commit string
	limits backend.Limits
}

func newBareSpawner(b *testing.B, e *testEnv) bareOp {
	if e.incusProject != "" {
		return newIncusBare(b, e)
	}
	be := backendOf(b, e)
	src := gitx.SandboxRepo("lead", benchRunner(be, "lead"), backend.WorkspacePath)
	_, commit, err := gitx.Head(context.Background(), src)
	if err != nil {
		b.Fatal(err)
	}
	s := &bareSpawner{be: be, src: src, commit: commit}
	if !noLimits() {
		l := config.DefaultBroker().Limits
		s.limits = backend.Limits{Pids: l.Pids, MemoryBytes: l.MemoryBytes, CPUWeight: l.CPUWeight, DiskBytes: l.DiskBytes}
	}
	return s
}

// op times the bare work for a sandbox name, then destroys it and syncs.
func (s *bareSpawner) op(b *testing.B, name string) time.Duration {
	ctx := context.Background()
	start := time.Now()
	if _, err := s.be.Create(ctx, backend.CreateOptions{Name: name, HostUID: benchHostUID(), Limits: s.limits}); err != nil {
		b.Fatal(err)
	}
	if err := s.be.Start(ctx, name); err != nil {
		b.Fatal(err)
	}
	run := benchRunner(s.be, name)
	dst := gitx.SandboxRepo(name, run, backend.WorkspacePath)
	fill := gitx.TransferOptions{Init: true, Checkout: "bench"} // as a spawn fills its checkout
	if err := gitx.Transfer(ctx, s.src, s.commit, dst, "refs/jailbee/start", fill); err != nil {
		b.Fatal(err)
	}
	if code, err := run.Run(ctx, gitx.Cmd{Argv: []string{"sh", "-c", "exit 0"}}); err != nil || code != 0 {
		b.Fatalf("process in the sandbox: %d %v", code, err)
	}
	took := time.Since(start)
	if err := s.be.Destroy(ctx, name); err != nil {
		b.Fatal(err)
	}
	syscall.Sync()
	return took
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

// incusBare is the bare work of a fork spawn with the incus command line
// alone, on the broker's project, pool and image: a container made from
// the image and started, the commit cloned inside from a bundle pushed in,
// one process run.
type incusBare struct {
	project, bundle string
}

func newIncusBare(b *testing.B, e *testEnv) *incusBare {
	bundle := filepath.Join(b.TempDir(), "src.bundle")
	hostGit(b, e.repo, "bundle", "create", "-q", bundle, "main")
	return &incusBare{project: e.incusProject, bundle: bundle}
}

func (s *incusBare) op(b *testing.B, name string) time.Duration {
	run := func(args ...string) {
		if out, err := exec.Command("incus", append([]string{"--project", s.project}, args...)...).CombinedOutput(); err != nil {
			b.Fatalf("incus %v: %v: %s", args, err, out)
		}
	}
	initArgs := []string{"init", incus.DefaultImage, name, "-q"}
	if pool := incustest.Pool(); pool != "" {
		initArgs = append(initArgs, "--storage", pool)
	}
	start := time.Now()
	run(initArgs...)
	run("start", name)
	run("file", "push", "--uid", "1000", "--gid", "1000", s.bundle, name+"/tmp/src.bundle")
	run("exec", name, "--user", "1000", "--group", "1000", "--env", "HOME=/home/agent", "--",
		"git", "clone", "-q", "--branch", "main", "/tmp/src.bundle", backend.WorkspacePath)
	run("exec", name, "--", "sh", "-c", "exit 0")
	took := time.Since(start)
	run("delete", "--force", name)
	syscall.Sync()
	return took
}
