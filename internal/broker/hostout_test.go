package broker_test

import (
	"strings"
	"testing"
)

// TestSpawnBranchWithoutFormatCharacters: an orchestrator names its
// children's branches, which `jailbee ls` (BRANCH), the worker log and the
// user's repository's refs show on the host. A bidi override (U+202E
// shows what follows reversed: "fix/a\u202egnp.exe" reads "fix/aexe.png")
// or another format character (zero-width, bidi isolates) is refused like
// a control character, before a sandbox or a ref is made.
func TestSpawnBranchWithoutFormatCharacters(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	for i, branch := range []string{"fix/a\u202egnp.exe", "fix/b\u200bc", "fix/\u2066d"} {
		st := spawn(t, lead, "s-fmt-"+string(rune('a'+i)), map[string]any{"branch": branch, "prompt": "p", "on_done": "keep"})
		if st.State != "refused" || !strings.Contains(st.Detail, "`branch` is not a valid branch name") {
			t.Errorf("spawn on %q: %s %q", branch, st.State, st.Detail)
		}
	}
	if out := e.jb("ls"); strings.ContainsAny(out, "\u202e\u200b\u2066") {
		t.Fatalf("jailbee ls printed a format character:\n%s", out)
	}
}

// TestWorkerLogStepOutputForgesNoLine: a setup or on_start command runs
// in the child, on its checkout, and prints what it likes (a build
// script of the orchestrator's commit). Its output goes to the worker log
// `jailbee logs CHILD` prints; there a line of it must not pass for one
// of the worker's own (a stamp and a step: "... agent scripted ready"),
// so each is marked as the command's.
func TestWorkerLogStepOutputForgesNoLine(t *testing.T) {
	e := newTestEnv(t)
	const forged = "2026-01-01T00:00:00.000Z agent scripted ready (pid 1)"
	e.withAgentConfig(agentConfig + `autostart:
  default_profile: dev
  profiles:
    dev:
      setup: ["printf 'npm ok\\n` + forged + `\\n'"]
`)
	e.orchestrator("lead")
	lead := e.client("lead")
	wantStatus(t, spawn(t, lead, "s-log", map[string]any{"branch": "fix/log", "prompt": "p", "on_done": "keep"}),
		"started", "creation of child `fix-log` started")
	statusOf(t, lead, "s-log", "done", "failed")
	log := e.jb("logs", "fix-log")
	if !strings.Contains(log, "\n  | npm ok\n  | "+forged+"\n") {
		t.Fatalf("the worker log lacks the setup output:\n%s", log)
	}
	for _, l := range strings.Split(log, "\n") {
		if strings.HasPrefix(l, forged) {
			t.Fatalf("a line of the setup's output passes for the worker's own:\n%s", log)
		}
	}
}
