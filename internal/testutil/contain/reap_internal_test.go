package contain

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A test binary that exits (or panics at its -timeout) with a detached
// process still running: runReaping gives its exit status and kills the
// process, which init would have adopted and kept.
func TestRunReapingKillsWhatTheRunLeft(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	// The subshell starts sleep in a session of its own and exits: sleep
	// is an orphan, like a sandbox unit whose test binary died.
	cmd := exec.Command("sh", "-c", `(setsid sleep 300 & echo $! > "$0") ; exit 3`, pidFile)
	code, err := runReaping(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 {
		t.Errorf("exit status %d, want 3", code)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// Killed and reaped: no such process, not even a zombie.
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		stat, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		t.Fatalf("the detached sleep (pid %d) is still there: %v %s", pid, err, stat)
	}
}
