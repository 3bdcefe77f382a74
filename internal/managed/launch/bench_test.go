package launch_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"agentbox/internal/managed/dockertest"
	"agentbox/internal/managed/launch"
)

// bareCompose is what a bare `docker compose up` starts: the primary
// service of the launch repository on the same image, nothing checked,
// generated, delegated or inspected.
const bareCompose = `services:
  app:
    image: %s
    pull_policy: never
    command: ["sleep", "infinity"]
`

// bareDevcontainer is the config of a bare `devcontainer up` on
// bareCompose: the Dev Containers CLI's own cost, without branchbox.
const bareDevcontainer = `{"dockerComposeFile": ["../compose.yaml"], "service": "app", "remoteUser": "dev"}`

// BenchmarkLaunch measures `feature start` to a ready container (the
// Dev Containers CLI and the final inspection included) against two
// baselines in the same run: a bare `docker compose up -d` of the same
// image, and a bare `devcontainer up` of it. It reports the ratios and
// the teardown time. Run it with a fixed count, e.g.
//
//	BRANCHBOX_TEST_DOCKER=1 go test -run - -bench Launch -benchtime 5x ./internal/managed/launch
func BenchmarkLaunch(b *testing.B) {
	dockertest.Require(b)
	svc := dockertest.ImageID(b, dockertest.ServiceImageTag)
	var bare, bareCLI time.Duration
	b.Run("bare-devcontainer-up", func(b *testing.B) {
		dir := b.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "compose.yaml"), []byte(fmt.Sprintf(bareCompose, svc)), 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, ".devcontainer"), 0o700); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ".devcontainer", "devcontainer.json"), []byte(bareDevcontainer), 0o600); err != nil {
			b.Fatal(err)
		}
		bareCLI = 0 // the last run's mean: b.Run calls this more than once
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			project := fmt.Sprintf("bench-cli-%d-%d", os.Getpid(), i)
			cmd := exec.Command("devcontainer", "up", "--workspace-folder", dir)
			// TMPDIR: the CLI's own Compose files go with the test's.
			cmd.Env = append(os.Environ(), "COMPOSE_PROJECT_NAME="+project, "TMPDIR="+dir)
			start := time.Now()
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("devcontainer up: %v\n%s", err, out)
			}
			bareCLI += time.Since(start)
			b.StopTimer()
			composeCLI(b, "-p", project, "down", "-v")
			b.StartTimer()
		}
		bareCLI /= time.Duration(b.N)
	})
	b.Run("bare-compose-up", func(b *testing.B) {
		file := filepath.Join(b.TempDir(), "compose.yaml")
		if err := os.WriteFile(file, []byte(fmt.Sprintf(bareCompose, svc)), 0o600); err != nil {
			b.Fatal(err)
		}
		bare = 0
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			project := fmt.Sprintf("bench-bare-%d-%d", os.Getpid(), i)
			start := time.Now()
			composeCLI(b, "-p", project, "-f", file, "up", "-d", "app")
			bare += time.Since(start)
			b.StopTimer()
			composeCLI(b, "-p", project, "-f", file, "down", "-v")
			b.StartTimer()
		}
		bare /= time.Duration(b.N)
	})
	b.Run("feature-start", func(b *testing.B) {
		var started, torn time.Duration
		b.StopTimer()
		for i := 0; i < b.N; i++ {
			s := newSetup(b, defaultFiles())
			b.StartTimer()
			t0 := time.Now()
			if _, err := s.start("bench"); err != nil {
				b.Fatal(err)
			}
			started += time.Since(t0)
			b.StopTimer()
			t1 := time.Now()
			r, err := launch.Teardown(context.Background(), s.cfg, "bench")
			if err != nil || !r.ResidueFree {
				b.Fatalf("teardown: %+v %v", r, err)
			}
			torn += time.Since(t1)
		}
		n := time.Duration(b.N)
		b.ReportMetric(float64((torn / n).Milliseconds()), "teardown-ms/op")
		if bare > 0 && bareCLI > 0 {
			b.ReportMetric(float64(started/n)/float64(bare), "x-compose")
			b.ReportMetric(float64(started/n)/float64(bareCLI), "x-devcontainer")
		}
	})
}

func composeCLI(b *testing.B, args ...string) {
	b.Helper()
	out, err := exec.Command("docker", append([]string{"compose"}, args...)...).CombinedOutput()
	if err != nil {
		b.Fatalf("docker compose %v: %v\n%s", args, err, out)
	}
}

// BenchmarkDispatchTool measures launch.DispatchTool on a launched
// container: what `feature dispatch-tool` does beyond the dispatcher
// itself (the assignment validated again with its files, the container
// user checked with an exec through the Engine API, the spool volume
// looked up), with the request spooled by the consumer beforehand
// (untimed).
//
//	BRANCHBOX_TEST_DOCKER=1 go test -run - -bench DispatchTool -benchtime 20x ./internal/managed/launch
func BenchmarkDispatchTool(b *testing.B) {
	s := newSetup(b, defaultFiles())
	startEndpoint(b, s.fixture.Source(4, 0))
	sum, err := s.start("bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { launch.Teardown(context.Background(), s.cfg, "bench") })
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("b%d-%d", b.N, i)
		b.StopTimer()
		spoolRequest(b, sum.Runtime.ContainerID, id, `{}`)
		b.StartTimer()
		if _, err := launch.DispatchTool(context.Background(), s.cfg, "bench", "delivery_requests", id, 0); err != nil {
			b.Fatal(err)
		}
	}
}
