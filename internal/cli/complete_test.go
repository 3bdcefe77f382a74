package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/cli"
)

// TestCompletionOffersSandboxNames runs the shells' completion request
// (cobra's hidden __complete) against a real broker: every command that
// takes a sandbox NAME completes it from the broker, and without a broker
// nothing is offered and nothing is said.
func TestCompletionOffersSandboxNames(t *testing.T) {
	realBroker(t) // orch and its child kid
	const both = "kid\tchild of orch, running\norch\torchestrator, running\n:4\n"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stop", ""}, both},
		{[]string{"start", ""}, both},
		{[]string{"destroy", "k"}, "kid\tchild of orch, running\n:4\n"},
		{[]string{"exec", "o"}, "orch\torchestrator, running\n:4\n"},
		{[]string{"attach", ""}, both},
		{[]string{"logs", ""}, both},
		{[]string{"usage", ""}, both},
		{[]string{"new", "x", "--parent", ""}, "orch\torchestrator, running\n:4\n"},
		// After the name: exec's command completes as files, stop's nothing.
		{[]string{"exec", "kid", ""}, ":0\n"},
		{[]string{"stop", "kid", ""}, ":4\n"},
	} {
		args := append([]string{"__complete"}, tc.args...)
		if code, stdout, stderr := run(t, "", args...); code != 0 || stdout != tc.want {
			t.Errorf("%v: exit %d stdout %q (stderr %q), want %q", tc.args, code, stdout, stderr, tc.want)
		}
	}

	state := os.Getenv(cli.StateDirEnv)
	t.Setenv(cli.StateDirEnv, filepath.Join(shortDir(t), "no-broker"))
	code, stdout, stderr := run(t, "", "__complete", "stop", "")
	if code != 0 || stdout != ":4\n" || strings.Contains(stderr, "broker") {
		t.Errorf("without a broker: exit %d stdout %q stderr %q, want nothing offered and no error", code, stdout, stderr)
	}
	// --state on the command line names the broker to ask.
	if _, stdout, _ := run(t, "", "__complete", "stop", "--state", state, ""); stdout != both {
		t.Errorf("with --state: %q, want %q", stdout, both)
	}
}
