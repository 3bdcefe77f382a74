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
