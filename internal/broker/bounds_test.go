package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/orchestrate"
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

// TestQueuedSpawnCyclesDoNotGrowTheJournal: an orchestrator spawning a
// child that queues and destroying it at once, again and again, keeps no
// more than store.MaxJournaled of those spawns and destroys (each spawn's
// queued and failed statuses) after a sweep; the spawn of the child that
// still exists keeps its statuses (ls shows it) however many came after.
func TestQueuedSpawnCyclesDoNotGrowTheJournal(t *testing.T) {
	e := newTestEnvStopped(t)
	e.caps = orchestrate.Caps{MaxSpawnsPerHour: store.MaxJournaled} // past tree.max_spawns_per_hour's default
	e.start()
	e.withAgent()
	e.orchestratorOneSlot("lead")
	lead := e.client("lead")
	ctx := context.Background()
	spawn(t, lead, "s-busy", map[string]any{"branch": "busy", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-busy", "done", "failed"), "done", "child `busy` is ready")
	cycles := store.MaxJournaled/2 + 100
	start := time.Now()
	for i := range cycles {
		if st := spawn(t, lead, fmt.Sprintf("q-%d", i), map[string]any{"branch": "q", "kind": "new", "prompt": "x"}); st.State != "queued" {
			t.Fatalf("spawn %d: %+v", i, st)
		}
		wantStatus(t, sendManifest(t, lead, map[string]any{"id": fmt.Sprintf("d-%d", i), "type": "destroy", "child": "q"}), "done", "child `q` destroyed")
	}
	t.Logf("%d spawn and destroy cycles in %v", cycles, time.Since(start))
	e.b.SweepStorageForTest(time.Now())
	var all wire.ListResult
	if err := lead.Call(ctx, "list", map[string]any{"all": true}, &all); err != nil {
		t.Fatal(err)
	}
	refs := map[string]bool{}
	for _, raw := range all.Items {
		var st wire.StatusItem
		json.Unmarshal(raw, &st)
		if st.Type == wire.ItemStatus {
			refs[st.Ref] = true
		}
	}
	// Besides the newest spawns and destroys, the spawn of busy.
	if limit := store.MaxJournaled + 1; len(refs) > limit {
		t.Errorf("lead keeps the statuses of %d manifests after the sweep, want at most %d", len(refs), limit)
	}
	if !refs["s-busy"] {
		t.Error("the spawn of busy, which exists, lost its statuses")
	}
	for _, s := range e.list() {
		if s.Name == "busy" && (s.LastStatus == nil || s.LastStatus.Ref != "s-busy") {
			t.Errorf("busy's last status is gone: %+v", s.LastStatus)
		}
	}
	t.Logf("lead keeps the statuses of %d manifests (%d items listed)", len(refs), len(all.Items))
}

// TestOnePendingDoneReportPerChild: a child whose done report waits for
// its stopped orchestrator cannot queue more behind it (each a body of
// up to 64 KiB kept in broker.db, and an import when the orchestrator
// runs again): a second report is refused until the first is delivered.
func TestOnePendingDoneReportPerChild(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("lead")
	e.child("kid", "lead")
	e.stopByBroker("lead")
	head, st := e.reportDone("kid", "d-0")
	wantStatus(t, st, "queued", "accepted at "+head[:12]+"; waiting for your orchestrator `lead` to run: it will be imported and delivered then")
	kid := e.client("kid")
	body := strings.Repeat("x", 60<<10)
	queued := 0
	for i := 1; i <= 20; i++ {
		st := sendManifest(t, kid, map[string]any{"id": fmt.Sprintf("d-%d", i), "type": "message", "kind": "done", "body": body})
		if st.State == "queued" {
			queued++
		}
	}
	if queued > 0 {
		t.Fatalf("%d more done reports of kid queued behind its first", queued)
	}
	st = sendManifest(t, kid, map[string]any{"id": "d-last", "type": "message", "kind": "done", "body": "again"})
	wantStatus(t, st, "refused", "your done report `d-0` still waits for your orchestrator `lead`: it will be imported and delivered then; report done again once it was")
	if err := e.admin("start", wire.NameArgs{Name: "lead"}, nil); err != nil {
		t.Fatal(err)
	}
	if msgs := doneMessages(t, e.client("lead"), 1); len(msgs) != 1 || msgs[0].OriginID != "d-0" {
		t.Fatalf("lead's done messages: %+v", msgs)
	}
	wantStatus(t, statusOf(t, kid, "d-0", "done"), "done", "delivered to lead: imported as refs/jailbee/from/kid/work/kid at "+head[:12]+"; this child is kept")
	if st := sendManifest(t, kid, map[string]any{"id": "d-after", "type": "message", "kind": "done", "body": "later"}); st.State != "done" {
		t.Fatalf("a done report once the first was delivered: %+v", st)
	}
}

// TestUnfinishedLineIsDropped: a sandbox that begins request lines on
// all its connections and never ends them (each just short of the 1 MiB
// limit) holds the broker's buffers only for broker.LineReadTimeout: then
// the broker closes those connections, and serves new ones.
func TestUnfinishedLineIsDropped(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	var conns []*rawConn
	part := []byte(`{"v":1,"op":"list","args":{}` + strings.Repeat(" ", wire.MaxLineBytes-64))
	for range broker.MaxConnsPerSandbox {
		c := e.raw("orch")
		if _, err := c.Write(part); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	start := time.Now()
	for i, c := range conns {
		if !closedWithin(c, broker.LineReadTimeout+10*time.Second) {
			t.Fatalf("connection %d still open %v after its unfinished line", i, time.Since(start))
		}
	}
	t.Logf("closed after %v", time.Since(start))
	o := e.raw("orch")
	fmt.Fprintln(o, `{"v":1,"op":"list"}`)
	if r := o.reply(t); !r.OK {
		t.Fatalf("a new connection: %+v", r.Error)
	}
}

// closedWithin reports whether the broker closed c within d.
func closedWithin(c *rawConn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.r.ReadByte()
	return err == io.EOF
}
