package launch_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/managed/managedtest"
)

// rootLib is a preload library that, in a process running as root,
// appends an fsmonitor command to the shared Git metadata's config
// (runtime-owned, bound writable into the primary) and leaves a mark.
const rootLib = `#include <fcntl.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void own(void) {
	if (getuid() != 0) return;
	int fd = open("/workspaces/main/.git/config", O_WRONLY | O_APPEND);
	if (fd >= 0) {
		const char *s = "[core]\n\tfsmonitor = touch /tmp/preload-host-root\n";
		write(fd, s, strlen(s));
		close(fd);
	}
	fd = open("/tmp/root-by-preload", O_WRONLY | O_CREAT, 0644);
	if (fd >= 0) close(fd);
}
`

// TestAttackRootShellEnvironment: the Dev Containers CLI starts a root
// shell in the primary (docker exec -u root, to patch /etc/environment
// and /etc/profile) with the container's environment, and writes that
// environment into it through a quoted here-document. The repository's
// Compose environment used to be the primary's, so a value with a line
// break ended the here-document and ran what followed as root, and
// LD_PRELOAD (or PATH) made root load the repository's code; root in
// the primary owns the runtime-owned shared Git metadata bound there and
// appended `core.fsmonitor` to the host repository's .git/config, which
// host Git (a shell prompt's `git status`) then runs as root. The
// primary now runs with its image's environment only, which the
// inspection requires exactly.
func TestAttackRootShellEnvironment(t *testing.T) {
	files := defaultFiles()
	files["own.so"] = compileC(t, rootLib, "-shared", "-fPIC")
	files["compose.yaml"] = strings.Replace(managedtest.ComposeYAML, "APP_MODE: test",
		"APP_MODE: \"x\\netcEnvironmentEOF\\nid > /tmp/root-by-heredoc; "+
			"printf '[core]\\\\n\\\\tfsmonitor = touch /tmp/heredoc-host-root\\\\n' >> /workspaces/main/.git/config\\n"+
			"cat >/dev/null <<'etcEnvironmentEOF'\\n\"\n      LD_PRELOAD: /workspaces/rootenv/own.so", 1)
	s := newSetup(t, files)
	before, err := os.ReadFile(filepath.Join(s.repo, ".git", "config"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.start("rootenv"); err != nil {
		t.Fatalf("start: %v", err)
	}
	after, err := os.ReadFile(filepath.Join(s.repo, ".git", "config"))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := execIn(t, s, "rootenv", "sh", "-c", "ls /tmp; env")
	if string(after) != string(before) || strings.Contains(out, "root-by-") {
		t.Fatalf("root ran the repository's code in the primary: host .git/config now\n%s\ncontainer:\n%s", after, out)
	}
	if strings.Contains(out, "LD_PRELOAD") || strings.Contains(out, "APP_MODE") {
		t.Fatalf("the repository's environment reached the primary:\n%s", out)
	}
}
