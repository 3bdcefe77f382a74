package launch_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/managed/launch"
	"agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/provider"
)

// compileC compiles the C source src with the host's gcc (the test image
// is Debian 12, as the CI host: same glibc) and returns the output's
// bytes. It skips without gcc.
func compileC(t *testing.T, src string, args ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build the attacker's program")
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "a.c"), filepath.Join(dir, "a.out")
	if err := os.WriteFile(in, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gcc, append(append([]string{}, args...), "-o", out, in)...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("gcc %q: %v\n%s", args, err, msg)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// stealLib is a preload library that appends the model token it finds
// in its process's environment to /tmp/stolen.
const stealLib = `#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void steal(void) {
	const char *v = getenv("MODEL_ACCESS_TOKEN");
	if (!v || !*v) return;
	int fd = open("/tmp/stolen", O_WRONLY | O_CREAT | O_APPEND, 0666);
	if (fd < 0) return;
	fchmod(fd, 0666);
	write(fd, v, strlen(v));
	write(fd, "\n", 1);
	close(fd);
}
`

// runProvider runs the signed probe as the provider with the model token.
func runProvider(t *testing.T, s *setup, name string) string {
	t.Helper()
	t.Setenv("MODEL_ACCESS_TOKEN", "model-"+managedtest.Secret)
	var stdout, stderr bytes.Buffer
	code, err := launch.ExecProvider(context.Background(), s.cfg, name,
		provider.Request{Executable: probe, Inherit: []string{"MODEL_ACCESS_TOKEN"}, Args: []string{"env"}},
		os.Environ(), strings.NewReader(""), &stdout, &stderr)
	if err != nil || code != 0 {
		t.Fatalf("exec-provider: %v %d %s", err, code, stderr.String())
	}
	return stdout.String()
}

// TestProviderIgnoresContainerLoaderVariables: the repository's Compose
// environment sets LD_PRELOAD to a library of the workspace. The
// container's variables must not reach any process that holds the
// provider's values (the shell and env that start it included): the
// library never sees the token.
func TestProviderIgnoresContainerLoaderVariables(t *testing.T) {
	files := defaultFiles()
	files["steal.so"] = compileC(t, stealLib, "-shared", "-fPIC")
	files["compose.yaml"] = strings.Replace(managedtest.ComposeYAML, "APP_MODE: test",
		"APP_MODE: test\n      LD_PRELOAD: /workspaces/prov/steal.so", 1)
	s := newSetup(t, files)
	if _, err := s.start("prov"); err != nil {
		t.Fatalf("start: %v", err)
	}
	// The library is loaded in the container (so the attack is live).
	if out, code := execIn(t, s, "prov", "sh", "-c", `grep -q steal.so /proc/self/maps && echo loaded`); code != 0 || out != "loaded" {
		t.Fatalf("the preload library is not loaded in the container: %d %q", code, out)
	}
	out := runProvider(t, s, "prov")
	if !strings.Contains(out, "MODEL_ACCESS_TOKEN=model-"+managedtest.Secret) || strings.Contains(out, "LD_PRELOAD") {
		t.Fatalf("provider environment: %q", out)
	}
	if got, _ := execIn(t, s, "prov", "sh", "-c", "cat /tmp/stolen 2>/dev/null; true"); strings.Contains(got, managedtest.Secret) {
		t.Fatalf("the repository's preload library read the provider's token: %q", got)
	}
}
