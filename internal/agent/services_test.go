package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"agentbox/internal/testutil/wait"
)

// TestParseServices: what tmux in a sandbox prints is read strictly: only
// windows named after a wanted service, lines of four fields with a
// valid pid or exit status; a name shown twice is not trusted.
func TestParseServices(t *testing.T) {
	out := "web\t0\t\t42\n" +
		"db\t1\t3\t0\n" +
		"cache\t1\t\t0\n" +
		"scripted\t0\t\t7\n" + // the agent's window
		"aux\t0\t\tnot-a-pid\n" +
		"evil\t0\t\t9\textra\n" +
		"dup\t0\t\t10\ndup\t0\t\t11\n" +
		"big\t1\t999\t0\n"
	got := ParseServices([]byte(out), []string{"web", "db", "cache", "aux", "evil", "dup", "big", "idle"})
	want := map[string]ServiceState{
		"web":   {State: ServiceRunning, PID: 42},
		"db":    {State: ServiceExited, Code: 3},
		"cache": {State: ServiceExited, Code: -1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parsed %+v, want %+v", got, want)
	}
}

// tmuxHome gives the test a home of its own and a run that runs argv with
// it, against a real tmux server whose socket is in the test's own
// directory (killed at the end).
func tmuxHome(t *testing.T) (home string, run func(argv []string) []byte) {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("no tmux on this machine")
	}
	home, sockets := t.TempDir(), t.TempDir()
	env := append(os.Environ(), "HOME="+home, "TMUX_TMPDIR="+sockets, "TMUX=")
	run = func(argv []string) []byte {
		t.Helper()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", argv, err, out)
		}
		return out
	}
	t.Cleanup(func() {
		cmd := exec.Command("tmux", "kill-server")
		cmd.Env = env
		cmd.Run()
	})
	return home, run
}

// TestServiceLogKeepsItsFirstOutput: a service that prints at once and
// exits (the case its log matters most for) has that output in its log
// and its exit code in its window, through a real tmux server (its socket
// and the service's home in the test's own directories).
func TestServiceLogKeepsItsFirstOutput(t *testing.T) {
	home, run := tmuxHome(t)
	for round := range 3 { // the second and third restart it
		run(StartServiceArgv("quick", fmt.Sprintf("echo quick-output-%d; exit 4", round)))
		var st ServiceState
		wait.For(t, "the service to exit", func() bool {
			st = ParseServices(run(ListServicesArgv()), []string{"quick"})["quick"]
			return st.State == ServiceExited
		})
		if st.Code != 4 {
			t.Fatalf("round %d: the service's state %+v, want exited with 4", round, st)
		}
		want := fmt.Sprintf("quick-output-%d", round)
		var log []byte
		wait.For(t, "the log to be written", func() bool {
			log, _ = os.ReadFile(filepath.Join(home, ServiceLogDir, "quick.log"))
			return len(log) > 0
		})
		if got := strings.TrimSpace(string(log)); got != want {
			t.Fatalf("round %d: the log holds %q, want %q", round, got, want)
		}
	}
}

// TestServiceLogBound: a run's log keeps MaxServiceLog bytes of output,
// at the limit and one byte past it.
func TestServiceLogBound(t *testing.T) {
	home, run := tmuxHome(t)
	// The agent's window first, as in a sandbox: the server runs the log
	// writer with its own environment, not the service start's.
	run([]string{"tmux", "new-session", "-d", "-s", Session, "-n", "agent", "--", "sleep", "1000"})
	for _, n := range []int{MaxServiceLog, MaxServiceLog + 1} {
		// No newline: the terminal passes the bytes through as they are.
		run(StartServiceArgv("big", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; exec sleep 1000", n)))
		var log []byte
		wait.For(t, "the log to be written", func() bool {
			log, _ = os.ReadFile(filepath.Join(home, ServiceLogDir, "big.log"))
			return len(log) >= MaxServiceLog
		})
		if len(log) != MaxServiceLog || strings.Trim(string(log), "x") != "" {
			t.Fatalf("%d bytes printed: the log holds %d bytes (%.20q...), want %d", n, len(log), log, MaxServiceLog)
		}
	}
}
