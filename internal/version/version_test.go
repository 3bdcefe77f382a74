package version_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// moduleDir is the module's root, where the binaries are built.
func moduleDir(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// buildAndAsk builds ./cmd/<prog> with the extra go build args and
// returns what `<prog> --version` prints.
func buildAndAsk(t *testing.T, prog string, buildArgs ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), prog)
	args := append([]string{"build", "-o", bin}, buildArgs...)
	cmd := exec.Command("go", append(args, "./cmd/"+prog)...)
	cmd.Dir = moduleDir(t)
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", prog, err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", prog, err, out)
	}
	return string(out)
}

// TestVersionSetAtBuildTime: -X sets the version both programs print.
func TestVersionSetAtBuildTime(t *testing.T) {
	for _, prog := range []string{"jailbee", "branchbox"} {
		got := buildAndAsk(t, prog, "-ldflags", "-X agentbox/internal/version.Version=v9.8.7-test")
		if want := prog + " version v9.8.7-test\n"; got != want {
			t.Errorf("%s --version = %q, want %q", prog, got, want)
		}
	}
}

// TestVersionDefaultsToTheBuildInfo: without -X, both programs print
// "devel", with the commit they were built from when the toolchain
// recorded it (it does not in a git worktree, nor with -buildvcs=false).
func TestVersionDefaultsToTheBuildInfo(t *testing.T) {
	for _, prog := range []string{"jailbee", "branchbox"} {
		got := buildAndAsk(t, prog)
		if !strings.HasPrefix(got, prog+" version devel") {
			t.Errorf("%s --version = %q, want %q and the revision if recorded", prog, got, prog+" version devel")
		}
	}
}
