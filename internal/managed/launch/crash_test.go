package launch_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/crashpoint"
	"agentbox/internal/managed/launch"
	"agentbox/internal/managed/provider"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// branchboxBinary builds cmd/branchbox once per test binary.
func branchboxBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "branchbox-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "branchbox")
		out, err := exec.Command("go", "build", "-o", binPath, "agentbox/cmd/branchbox").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("build branchbox: %v", buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// TestKilledStartTearsDownClean: a `feature start` killed (SIGKILL) at
// each chosen step leaves a record that teardown completes from: nothing
// on the engine, no worktree, no materialization, no inputs.
func TestKilledStartTearsDownClean(t *testing.T) {
	for _, point := range []string{crashpoint.LaunchWorktreeAdded, crashpoint.LaunchContainersCreated, crashpoint.LaunchContainerUp, crashpoint.LaunchProxyStarted} {
		t.Run(point, func(t *testing.T) {
			s := newSetup(t, defaultFiles())
			cmd := exec.Command(branchboxBinary(t), "feature", "start", "crash", "--repo", s.repo,
				"--runtime", "in-guest", "--runtime-manifest", s.fixture.Path, "--json")
			cmd.Env = []string{"PATH=" + provider.SafePATH, s.fixture.Env(), "BRANCHBOX_STATE_DIR=" + s.cfg.StateRoot,
				crashpoint.EnvVar + "=" + point}
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("start did not die at %s: %v\n%s", point, err, out)
			}
			rec, err := launch.Load(s.cfg.StateRoot, "crash")
			if err != nil || rec.Phase != launch.PhaseStarting {
				t.Fatalf("record after the kill: %+v %v", rec, err)
			}
			if (point == crashpoint.LaunchContainerUp || point == crashpoint.LaunchProxyStarted) && rec.ContainerID == "" {
				t.Fatal("the record does not name the container devcontainer up made")
			}
			if point == crashpoint.LaunchContainersCreated {
				// Created, never started: the start died between the two.
				if o := s.owned(rec.ComposeProject); len(o.Containers) == 0 {
					t.Fatal("no container was created before the kill")
				}
				if starts := startEvents(engineEvents(t, rec.ComposeProject, time.Now().Add(-time.Minute))); len(starts) > 0 {
					t.Fatalf("a container started before its inspection: %q", starts)
				}
			}
			r, err := launch.Teardown(context.Background(), s.cfg, "crash")
			if err != nil || !r.ResidueFree {
				t.Fatalf("teardown: %+v %v", r, err)
			}
			if o := s.owned(rec.ComposeProject); !o.Empty() {
				t.Fatalf("the engine holds %+v", o)
			}
			for _, p := range []string{rec.Worktree, rec.WorktreeGitDir, filepath.Join(s.cfg.StateRoot, "features", "crash"), s.fixture.Source(1, 0)} {
				if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("left after teardown: %s", filepath.Base(p))
				}
			}
		})
	}
}
