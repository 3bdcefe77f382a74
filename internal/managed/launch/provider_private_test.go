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
// primary runs with its image's environment only, so it never gets
// there (TestAttackRootShellEnvironment); and the container's variables
// must not reach any process that holds the provider's values (the
// shell and env that start it included) either: the library never sees
// the token.
func TestProviderIgnoresContainerLoaderVariables(t *testing.T) {
	files := defaultFiles()
	files["steal.so"] = compileC(t, stealLib, "-shared", "-fPIC")
	files["compose.yaml"] = strings.Replace(managedtest.ComposeYAML, "APP_MODE: test",
		"APP_MODE: test\n      LD_PRELOAD: /workspaces/prov/steal.so", 1)
	s := newSetup(t, files)
	if _, err := s.start("prov"); err != nil {
		t.Fatalf("start: %v", err)
	}
	// The repository's LD_PRELOAD is not the container's.
	if out, code := execIn(t, s, "prov", "sh", "-c", `grep -q steal.so /proc/self/maps && echo loaded; true`); code != 0 || out != "" {
		t.Fatalf("the preload library is loaded in the container: %d %q", code, out)
	}
	out := runProvider(t, s, "prov")
	if !strings.Contains(out, "MODEL_ACCESS_TOKEN=model-"+managedtest.Secret) || strings.Contains(out, "LD_PRELOAD") {
		t.Fatalf("provider environment: %q", out)
	}
	if got, _ := execIn(t, s, "prov", "sh", "-c", "cat /tmp/stolen 2>/dev/null; true"); strings.Contains(got, managedtest.Secret) {
		t.Fatalf("the repository's preload library read the provider's token: %q", got)
	}
}

// argvWatcher scans every process's command line in a tight loop, as
// the consumer, and records any that holds the model token's name with
// a value; /tmp/watch.seen says it saw a provider start. It stops when
// /tmp/watch.stop exists.
const argvWatcher = `#include <dirent.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
int main(void) {
	static char buf[65536];
	const char *needle = "MODEL_ACCESS_TOKEN=";
	for (;;) {
		if (access("/tmp/watch.stop", F_OK) == 0) return 0;
		DIR *d = opendir("/proc");
		if (!d) return 1;
		struct dirent *e;
		while ((e = readdir(d))) {
			if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
			char p[64];
			strcpy(p, "/proc/"); strcat(p, e->d_name); strcat(p, "/cmdline");
			int fd = open(p, O_RDONLY);
			if (fd < 0) continue;
			ssize_t n = read(fd, buf, sizeof buf - 1);
			close(fd);
			if (n <= 0) continue;
			for (ssize_t i = 0; i < n; i++) if (!buf[i]) buf[i] = ' ';
			buf[n] = 0;
			if (strstr(buf, "agentbox-probe env")) {
				int o = open("/tmp/watch.seen", O_WRONLY | O_CREAT | O_TRUNC, 0644);
				if (o >= 0) close(o);
			}
			if (strstr(buf, needle)) {
				int o = open("/tmp/watch.leak", O_WRONLY | O_CREAT | O_APPEND, 0644);
				if (o >= 0) { write(o, buf, n); write(o, "\n", 1); close(o); }
			}
		}
		closedir(d);
	}
}
`

// TestProviderValuesNeverOnACommandLine: a consumer process reads every
// /proc/PID/cmdline (world-readable, unlike environ) in a loop while the
// provider starts, again and again. No command line of the start may
// hold a value.
func TestProviderValuesNeverOnACommandLine(t *testing.T) {
	files := defaultFiles()
	files["watch.bin"] = compileC(t, argvWatcher, "-static", "-O2")
	s := newSetup(t, files)
	if _, err := s.start("argv"); err != nil {
		t.Fatalf("start: %v", err)
	}
	if out, code := execIn(t, s, "argv", "sh", "-c",
		"cp watch.bin /tmp/watch && chmod 0755 /tmp/watch && rm -f /tmp/watch.*; nohup /tmp/watch >/dev/null 2>&1 &"); code != 0 {
		t.Fatalf("start the watcher: %d %s", code, out)
	}
	for range 20 {
		if out := runProvider(t, s, "argv"); !strings.Contains(out, "MODEL_ACCESS_TOKEN=model-"+managedtest.Secret) {
			t.Fatalf("provider environment: %q", out)
		}
	}
	got, _ := execIn(t, s, "argv", "sh", "-c", "touch /tmp/watch.stop; sleep 0.5; test -e /tmp/watch.seen && echo seen; cat /tmp/watch.leak 2>/dev/null; true")
	if !strings.HasPrefix(got, "seen") {
		t.Fatalf("the watcher never saw a provider start: %q", got)
	}
	if strings.Contains(got, managedtest.Secret) {
		t.Fatalf("a provider value on a command line the consumer can read:\n%s", got)
	}
}
