package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/inbox"
	"agentbox/internal/store"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// reportDone commits a file in the child name and sends its done report
// (as its agent would) under id; it returns the committed HEAD and the
// send's status.
func (e *testEnv) reportDone(name, id string) (string, wire.StatusItem) {
	e.t.Helper()
	e.mustExec(name, "sh", "-c", "echo "+name+" > "+name+".txt && git add "+name+".txt && "+commitCmd+" -m "+name)
	head := e.mustExec(name, "git", "rev-parse", "HEAD")
	st := sendManifest(e.t, e.client(name), map[string]any{"id": id, "type": "message", "kind": "done", "body": "done: " + name})
	return head, st
}

// waitReady waits until each named child's agent is ready.
func (e *testEnv) waitReady(names ...string) {
	e.t.Helper()
	for _, n := range names {
		wait.For(e.t, n+" ready", func() bool { return e.row(n).State == store.StateReady })
	}
}

// doneMessages waits until cl holds n unread done messages and returns
// them in inbox order, unacknowledged.
func doneMessages(t *testing.T, cl *inbox.Client, n int) []wire.MessageItem {
	t.Helper()
	var got []wire.MessageItem
	wait.For(t, fmt.Sprintf("%d done messages", n), func() bool {
		got = got[:0]
		for _, m := range items[wire.MessageItem](t, cl, wire.ItemMessage) {
			if m.Kind == "done" {
				got = append(got, m)
			}
		}
		return len(got) >= n
	})
	return got
}

// TestDoneWaitsForStoppedOrchestrator: done reports to a stopped
// orchestrator are accepted as queued (HEAD recorded, the child shown
// done); when it starts again they are imported and delivered in the
// order they were accepted, each child gets its done status, and on_done
// destroy is carried out.
func TestDoneWaitsForStoppedOrchestrator(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-a", map[string]any{"branch": "a", "prompt": "stay-busy", "on_done": "keep"})
	spawn(t, lead, "s-b", map[string]any{"branch": "b", "prompt": "stay-busy", "on_done": "destroy"})
	e.waitReady("a", "b")
	e.stopByBroker("lead")

	headA, stA := e.reportDone("a", "d-a")
	wantStatus(t, stA, "queued", "accepted at "+headA[:12]+"; waiting for your orchestrator `lead` to run: it will be imported and delivered then")
	headB, stB := e.reportDone("b", "d-b")
	wantStatus(t, stB, "queued", "accepted at "+headB[:12]+"; waiting for your orchestrator `lead` to run: it will be imported and delivered then")
	// A resend of the id gets the same status; nothing is queued twice.
	if again := sendManifest(t, e.client("a"), map[string]any{"id": "d-a", "type": "message", "kind": "done", "body": "again"}); again != stA {
		t.Fatalf("resend of d-a: %+v, want %+v", again, stA)
	}
	if info := e.info("a"); info.State != "done" {
		t.Fatalf("a, its report accepted: %+v", info)
	}
	// Rounds pass and nothing is delivered while lead is stopped.
	time.Sleep(2 * broker.RoundInterval)
	if row := e.row("a"); row.DoneHead != headA {
		t.Fatalf("a's recorded head %q, want %q", row.DoneHead, headA)
	}

	if err := e.admin("start", wire.NameArgs{Name: "lead"}, nil); err != nil {
		t.Fatal(err)
	}
	lead = e.client("lead")
	msgs := doneMessages(t, lead, 2)
	if len(msgs) != 2 || msgs[0].From != "a" || msgs[1].From != "b" {
		t.Fatalf("done messages out of order: %+v", msgs)
	}
	for i, want := range []struct{ from, head, onDone string }{{"a", headA, "keep"}, {"b", headB, "destroy"}} {
		m := msgs[i]
		if m.ImportedSHA != want.head || m.ImportedRef != "refs/jailbee/from/"+want.from+"/"+want.from || m.OnDone != want.onDone || m.OriginID != "d-"+want.from || m.ImportError != "" {
			t.Fatalf("%s's report: %+v", want.from, m)
		}
		if got := e.mustExec("lead", "git", "rev-parse", m.ImportedRef); got != want.head {
			t.Fatalf("%s in lead's repository: %s, want %s", m.ImportedRef, got, want.head)
		}
	}
	wantStatus(t, statusOf(t, e.client("a"), "d-a", "done"), "done",
		"delivered to lead: imported as refs/jailbee/from/a/a at "+headA[:12]+"; this child is kept")
	wait.For(t, "b destroyed after its report", func() bool {
		for _, sb := range e.list() {
			if sb.Name == "b" {
				return false
			}
		}
		return true
	})
	if info := e.info("a"); info.State != "done" || !info.Running {
		t.Fatalf("a, kept: %+v", info)
	}
}

// TestDoneWaitsForRoomInTheInbox: a done report to an orchestrator whose
// inbox is full is accepted as queued, a later report queues behind it,
// and both are delivered in order once the orchestrator has read.
func TestDoneWaitsForRoomInTheInbox(t *testing.T) {
	e := newTestEnvQuota(t, store.Quota{MaxUnreadItems: 3, MaxUnreadBytes: 1 << 20})
	e.withAgent()
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-a", map[string]any{"branch": "a", "prompt": "stay-busy", "on_done": "keep"})
	spawn(t, lead, "s-b", map[string]any{"branch": "b", "prompt": "stay-busy", "on_done": "keep"})
	e.waitReady("a", "b")
	// Fill lead's inbox: notes from a until the quota refuses one.
	for i := 0; ; i++ {
		st := sendManifest(t, e.client("a"), map[string]any{"id": fmt.Sprintf("n-%d", i), "type": "message", "kind": "note", "body": "fill"})
		if st.State == "refused" {
			break
		}
		if i > 3 {
			t.Fatalf("the inbox quota never refused: %+v", st)
		}
	}
	headA, st := e.reportDone("a", "d-a")
	wantStatus(t, st, "queued", "accepted at "+headA[:12]+"; waiting for room in the inbox of your orchestrator `lead`: it will be imported and delivered then")
	headB, st := e.reportDone("b", "d-b")
	wantStatus(t, st, "queued", "accepted at "+headB[:12]+"; waiting behind 1 earlier report to your orchestrator `lead`: it will be imported and delivered then")
	// lead reads what it has: room frees, the reports follow in order.
	var got []wire.MessageItem
	wait.For(t, "both reports, read as they come", func() bool {
		var res struct {
			Items []wire.MessageItem `json:"items"`
		}
		if err := lead.Call(context.Background(), "list", nil, &res); err != nil {
			t.Fatal(err)
		}
		for _, it := range res.Items {
			if it.Type == wire.ItemMessage && it.Kind == "done" {
				got = append(got, it)
			}
			if err := lead.Call(context.Background(), "ack", map[string]any{"id": it.ID}, nil); err != nil {
				t.Fatal(err)
			}
		}
		return len(got) >= 2
	})
	if len(got) != 2 || got[0].From != "a" || got[0].ImportedSHA != headA || got[1].From != "b" || got[1].ImportedSHA != headB {
		t.Fatalf("done messages: %+v", got)
	}
	wantStatus(t, statusOf(t, e.client("b"), "d-b", "done"), "done",
		"delivered to lead: imported as refs/jailbee/from/b/b at "+headB[:12]+"; this child is kept")
}
