package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/store"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

func rawJSON(t testing.TB, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRefusedManifestsDoNotGrowWithoutBound: a child that sends manifest
// after manifest, each with a fresh id and each refused (the child holds
// no operation), keeps no more than store.MaxJournaled of them: in
// broker.db after a sweep, however young, and in the snapshot its status
// op reads, whether it took the replies or hung up so the statuses came
// back unread. The newest are kept: a resend of one still gets its status.
func TestRefusedManifestsDoNotGrowWithoutBound(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	kid := e.client("kid")
	ctx := context.Background()
	n := 3 * store.MaxJournaled
	junk := func(i int) map[string]any {
		return map[string]any{"version": 1, "id": fmt.Sprintf("junk-%d", i), "type": "stop", "child": "x"}
	}
	for i := range n {
		if i%3 == 0 {
			// Hung up before the reply: its status is put back unread.
			c := e.raw("kid")
			line, _ := wire.Marshal(wire.Request{V: 1, Op: "send", Args: rawJSON(t, map[string]any{"manifest": junk(i)})})
			c.Write(line)
			c.Close()
			continue
		}
		var st wire.StatusItem
		if err := kid.Call(ctx, "send", map[string]any{"manifest": junk(i)}, &st); err != nil {
			t.Fatal(err)
		}
		if st.State != "refused" {
			t.Fatalf("status %+v", st)
		}
	}
	last := junk(n - 1)
	var before wire.StatusItem
	if err := kid.Call(ctx, "send", map[string]any{"manifest": last}, &before); err != nil {
		t.Fatal(err)
	}
	var loaded wire.ListResult // loads kid's unread cache, which the sweep must keep in step
	if err := kid.Call(ctx, "list", nil, &loaded); err != nil {
		t.Fatal(err)
	}
	e.b.SweepStorageForTest(time.Now())

	var all wire.ListResult
	if err := kid.Call(ctx, "list", map[string]any{"all": true}, &all); err != nil {
		t.Fatal(err)
	}
	if len(all.Items) > store.MaxJournaled || all.More {
		t.Errorf("kid's inbox keeps %d statuses (more %v) after the sweep, want at most %d", len(all.Items), all.More, store.MaxJournaled)
	}
	var unreadNow wire.ListResult
	if err := kid.Call(ctx, "list", nil, &unreadNow); err != nil {
		t.Fatal(err)
	}
	if len(unreadNow.Items) > store.MaxJournaled {
		t.Errorf("kid keeps %d unread statuses, want at most %d", len(unreadNow.Items), store.MaxJournaled)
	}
	var res wire.StatusResult
	wait.For(t, "a round with every status", func() bool {
		var st wire.StatusItem
		return kid.Call(ctx, "status", map[string]any{"ref": last["id"]}, &st) == nil
	})
	time.Sleep(2 * broker.RoundInterval)
	if err := kid.Call(ctx, "status", nil, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Statuses) > store.MaxJournaled {
		t.Errorf("the snapshot keeps %d statuses of kid, want at most %d", len(res.Statuses), store.MaxJournaled)
	}
	var again wire.StatusItem
	if err := kid.Call(ctx, "send", map[string]any{"manifest": last}, &again); err != nil {
		t.Fatal(err)
	}
	if again != before {
		t.Errorf("a resend of the newest id got %+v, want %+v", again, before)
	}
	t.Logf("after %d refused sends: %d kept (%d unread), %d in the snapshot", n, len(all.Items), len(unreadNow.Items), len(res.Statuses))
}
