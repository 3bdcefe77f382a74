package broker_test

import (
	"context"
	"strings"
	"testing"

	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// TestSandboxDeletedOutsideJailbee: sandboxes deleted with the backend's
// own tools, behind the broker's back, lose their records at the next
// round, with everything else of theirs; a child's orchestrator is told
// (kind blocked), and the log says what happened.
func TestSandboxDeletedOutsideJailbee(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("lead")
	e.child("kid", "lead")
	lead := e.client("lead")
	kid := e.trace("kid")
	if err := e.be.Backend.Destroy(context.Background(), "kid"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e, "kid")
	e.assertGone(kid)
	msgs := items[wire.MessageItem](t, lead, wire.ItemMessage)
	if len(msgs) != 1 || msgs[0].From != "kid" || msgs[0].Kind != "blocked" ||
		msgs[0].Body != "`kid` was deleted outside jailbee (its sandbox is gone): its record was removed, and any work it never reported is lost" {
		t.Fatalf("lead's inbox: %+v", msgs)
	}
	// The log line may follow the record's removal by a moment.
	wait.For(t, "kid's deletion in the log", func() bool {
		return strings.Contains(e.logs.String(), `msg="a sandbox was deleted outside jailbee: its record was removed" sandbox=kid`)
	})

	// The orchestrator itself, stopped first: its record goes too.
	if err := e.admin("stop", wire.NameArgs{Name: "lead"}, nil); err != nil {
		t.Fatal(err)
	}
	tr := e.trace("lead")
	if err := e.be.Backend.Destroy(context.Background(), "lead"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e, "lead")
	e.assertGone(tr)
}

// waitGone waits until the broker no longer lists name.
func waitGone(t *testing.T, e *testEnv, name string) {
	t.Helper()
	wait.For(t, name+" destroyed", func() bool {
		for _, sb := range e.list() {
			if sb.Name == name {
				return false
			}
		}
		return true
	})
}
