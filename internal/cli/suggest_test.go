package cli_test

import (
	"os/exec"
	"path/filepath"
	"testing"

	"agentbox/internal/cli"
	"agentbox/internal/inbox"
)

// TestMistypedSandboxNamesGetDidYouMean: a name the broker does not know
// gets the closest names the caller can see: every sandbox for the host
// commands, only its own children for an orchestrator.
func TestMistypedSandboxNamesGetDidYouMean(t *testing.T) {
	b := realBroker(t) // orch and its child kid
	repo := filepath.Join(t.TempDir(), "other")
	for _, a := range [][]string{{"init", "-q", "-b", "main", repo}, {"-C", repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "--allow-empty", "-m", "i"}} {
		if out, err := exec.Command("git", a...).CombinedOutput(); err != nil {
			t.Fatalf("git: %v %s", err, out)
		}
	}
	for _, args := range [][]string{{"new", "other", "--repo", repo, "--orchestrator"}, {"new", "kit", "--branch", "t", "--parent", "other"}} {
		if code, _, stderr := run(t, "", args...); code != 0 {
			t.Fatalf("%v: %s", args, stderr)
		}
	}

	for _, tc := range []struct {
		args       []string
		wantStderr string
	}{
		{[]string{"exec", "kitt", "--", "true"}, "jailbee: no sandbox named kitt (did you mean `kit`?)\n"},
		{[]string{"stop", "kdi"}, "jailbee: no sandbox named kdi (did you mean `kid` or `kit`?)\n"},
		{[]string{"destroy", "orhc"}, "jailbee: no sandbox named orhc (did you mean `orch`?)\n"},
		{[]string{"usage", "othr"}, "jailbee: no sandbox named othr (did you mean `other`?)\n"},
		{[]string{"new", "x", "--branch", "x", "--parent", "kid"}, "jailbee: `kid` is not an orchestrator\n"},
		// Only orchestrators can be parents: a child is not offered.
		{[]string{"new", "x", "--branch", "x", "--parent", "kidd"}, "jailbee: no sandbox named kidd\n"},
		{[]string{"start", "nothing-like-it"}, "jailbee: no sandbox named nothing-like-it\n"},
	} {
		code, _, stderr := run(t, "", tc.args...)
		if code != cli.ExitFailed || stderr != tc.wantStderr {
			t.Errorf("%v: exit %d stderr %q, want exit 1 and %q", tc.args, code, stderr, tc.wantStderr)
		}
	}

	// orch sees its own children only: kit, the closer name, is other's.
	t.Setenv(inbox.SocketEnv, b.SocketPath("orch"))
	code, _, stderr := run(t, "", "inbox", "send", "message", "--child", "kitt", "--id", "m-1", "--text", "hi")
	if want := "jailbee: refused: `kitt` is not a child of this orchestrator (did you mean `kid`?)\n"; code != cli.ExitFailed || stderr != want {
		t.Errorf("message to kitt: exit %d stderr %q, want exit 1 and %q", code, stderr, want)
	}
	// other's child itself: refused as unknown, and offered what orch has.
	code, _, stderr = run(t, "", "inbox", "send", "stop", "--child", "kit", "--id", "s-1")
	if want := "jailbee: refused: `kit` is not a child of this orchestrator (did you mean `kid`?)\n"; code != cli.ExitFailed || stderr != want {
		t.Errorf("stop of other's child: exit %d stderr %q, want exit 1 and %q", code, stderr, want)
	}
}
