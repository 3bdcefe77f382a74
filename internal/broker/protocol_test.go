package broker_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/config"
	"agentbox/internal/inbox"
	"agentbox/internal/manifest"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// padded returns a list request padded with spaces so the line, newline
// included, is exactly n bytes (JSON allows whitespace).
func padded(n int) []byte {
	head := `{"v":1,"op":"list","args":{}`
	pad := n - len(head) - len("}\n")
	return []byte(head + strings.Repeat(" ", pad) + "}\n")
}

func TestLineLimit(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")

	atLimit := e.raw("orch")
	if _, err := atLimit.Write(padded(wire.MaxLineBytes)); err != nil {
		t.Fatal(err)
	}
	if r := atLimit.reply(t); !r.OK {
		t.Fatalf("a line of exactly %d bytes was refused: %+v", wire.MaxLineBytes, r.Error)
	}

	past := e.raw("orch")
	if _, err := past.Write(padded(wire.MaxLineBytes + 1)); err != nil {
		t.Fatal(err)
	}
	r := past.reply(t)
	if r.OK || r.Error.Code != wire.CodeBadRequest {
		t.Fatalf("a line one byte past the limit: got %+v, want bad_request", r)
	}
	if !past.closed() {
		t.Fatal("connection stayed open after an oversized line")
	}
}

func TestVersionMismatch(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	c := e.raw("orch")
	for _, line := range []string{`{"v":2,"op":"list"}`, `{"v":0,"op":"list"}`, `{"op":"list"}`, `{"v":"1","op":"list"}`} {
		fmt.Fprintln(c, line)
		r := c.reply(t)
		if r.OK || r.Error.Code != wire.CodeVersion {
			t.Errorf("%s: got %+v, want code version", line, r)
		}
	}
	fmt.Fprintln(c, `{"v":1,"op":"list"}`)
	if r := c.reply(t); !r.OK {
		t.Errorf("v1 request after a version error: %+v", r.Error)
	}
}

func TestBadEnvelopes(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	c := e.raw("orch")
	for _, tc := range []struct{ line, code string }{
		{`not json`, "bad_request"},
		{`{"v":1}`, "bad_request"},
		{`{"v":1,"op":"list","extra":1}`, "bad_request"},
		{`{"v":1,"op":"list","args":{"all":true,"x":1}}`, "bad_request"},
		{`{"v":1,"op":"nope"}`, "unknown_op"},
		{`{"v":1,"op":"read","args":{"id":"h-00000000"}}`, "not_found"},
	} {
		fmt.Fprintln(c, tc.line)
		r := c.reply(t)
		if r.OK || string(r.Error.Code) != tc.code {
			t.Errorf("%s: got %+v, want %s", tc.line, r, tc.code)
		}
	}
	fmt.Fprintln(c, `{"v":1,"op":"read","args":{"id":"h-00000000"}}`)
	if r := c.reply(t); r.Error.Detail != "no unread item 'h-00000000'" {
		t.Errorf("not_found detail = %q", r.Error.Detail)
	}
}

func TestConnectionCap(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	var conns []*rawConn
	for i := range broker.MaxConnsPerSandbox {
		c := e.raw("orch")
		fmt.Fprintln(c, `{"v":1,"op":"list"}`)
		if r := c.reply(t); !r.OK {
			t.Fatalf("connection %d of %d refused: %+v", i+1, broker.MaxConnsPerSandbox, r.Error)
		}
		conns = append(conns, c)
	}
	ninth := e.raw("orch")
	r := ninth.reply(t)
	if r.OK || r.Error.Code != wire.CodeBusy {
		t.Fatalf("connection %d: got %+v, want busy", broker.MaxConnsPerSandbox+1, r)
	}
	if !ninth.closed() {
		t.Fatal("the refused connection stayed open")
	}
	// Another sandbox is not affected by orch's connections.
	e.orchestrator("other")
	o := e.raw("other")
	fmt.Fprintln(o, `{"v":1,"op":"list"}`)
	if r := o.reply(t); !r.OK {
		t.Fatalf("other sandbox refused: %+v", r.Error)
	}
	// Freeing one slot admits a new connection.
	conns[0].Close()
	deadline := time.Now().Add(wait.Guard)
	for {
		c := e.raw("orch")
		fmt.Fprintln(c, `{"v":1,"op":"list"}`)
		r := c.reply(t)
		if r.OK {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("a slot never freed: %+v", r.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPipelinedRequestsAnsweredInOrder(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch := e.client("orch")
	for i := range 3 {
		sendMessage(t, orch, map[string]any{"id": fmt.Sprintf("m-%d", i), "to": "kid", "body": fmt.Sprint(i)})
	}
	items := unread(t, e.client("kid"))
	c := e.raw("kid")
	var batch strings.Builder
	for _, it := range items {
		fmt.Fprintf(&batch, `{"v":1,"op":"read","args":{"id":%q}}`+"\n", it.ID)
	}
	batch.WriteString(`{"v":1,"op":"list"}` + "\n")
	if _, err := c.Write([]byte(batch.String())); err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		r := c.reply(t)
		var got wire.MessageItem
		json.Unmarshal(r.Result, &got)
		if !r.OK || got.ID != it.ID || got.Body != fmt.Sprint(i) {
			t.Fatalf("pipelined reply %d: %+v %s", i, r.Error, r.Result)
		}
	}
	r := c.reply(t)
	var res struct{ Items []json.RawMessage }
	json.Unmarshal(r.Result, &res)
	if !r.OK || len(res.Items) != 0 {
		t.Fatalf("list after the pipelined reads: %s", r.Result)
	}
}

func TestMessageRoundTripMapsReplies(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch, kid := e.client("orch"), e.client("kid")

	st := sendMessage(t, orch, map[string]any{"id": "reply-0004", "to": "kid", "body": "Use the existing parser.", "kind": "note"})
	if st.Ref != "reply-0004" || st.State != "done" || st.Detail != "delivered to kid" || !strings.HasPrefix(st.ID, "h-") {
		t.Fatalf("first status = %+v", st)
	}
	got := unread(t, kid)
	if len(got) != 1 {
		t.Fatalf("child inbox = %+v", got)
	}
	m := got[0]
	if m.From != "orch" || m.OriginID != "reply-0004" || m.InReplyTo != nil || m.Kind != "note" || len(m.ID) != 10 {
		t.Fatalf("child's copy = %+v", m)
	}

	// The child answers with the host id it read; the orchestrator's copy
	// carries the orchestrator's own manifest id.
	sendMessage(t, kid, map[string]any{"id": "msg-0002", "body": "Which parser?", "kind": "question", "in_reply_to": m.ID})
	back := unread(t, orch)
	if len(back) != 1 || back[0].From != "kid" || back[0].OriginID != "msg-0002" || back[0].InReplyTo == nil || *back[0].InReplyTo != "reply-0004" {
		t.Fatalf("orchestrator's copy = %+v", back)
	}

	// The orchestrator answers the question by its host id: the child gets
	// its own manifest id back.
	sendMessage(t, orch, map[string]any{"id": "reply-0005", "to": "kid", "body": "The one in parse.go", "in_reply_to": back[0].ID})
	got = unread(t, kid)
	if len(got) != 2 || got[1].InReplyTo == nil || *got[1].InReplyTo != "msg-0002" {
		t.Fatalf("child's copy of the answer = %+v", got)
	}

	// An origin id, or any other id, passes through unchanged.
	sendMessage(t, kid, map[string]any{"id": "msg-0003", "body": "ok", "in_reply_to": "reply-0005"})
	sendMessage(t, kid, map[string]any{"id": "msg-0004", "body": "ok", "in_reply_to": "h-ffffffff"})
	back = unread(t, orch)
	if len(back) != 3 || *back[1].InReplyTo != "reply-0005" || *back[2].InReplyTo != "h-ffffffff" {
		t.Fatalf("pass-through in_reply_to = %+v", back)
	}
}

func TestResendReturnsSameStatusWithoutNewDelivery(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch, kid := e.client("orch"), e.client("kid")
	m := map[string]any{"id": "once", "to": "kid", "body": "hello"}
	first := sendMessage(t, orch, m)
	again := sendMessage(t, orch, map[string]any{"id": "once", "to": "kid", "body": "changed"})
	if again != first {
		t.Fatalf("resend status %+v, first %+v", again, first)
	}
	if got := unread(t, kid); len(got) != 1 || got[0].Body != "hello" {
		t.Fatalf("child inbox after resend = %+v", got)
	}
	// A refusal is journaled too: resending a refused id gets the refusal.
	r1 := sendMessage(t, orch, map[string]any{"id": "bad", "to": "nobody", "body": "x"})
	r2 := sendMessage(t, orch, map[string]any{"id": "bad", "to": "kid", "body": "x"})
	if r1.State != "refused" || r1 != r2 {
		t.Fatalf("refusal %+v, resend %+v", r1, r2)
	}
	if got := unread(t, kid); len(got) != 1 {
		t.Fatalf("resend of a refused id delivered: %+v", got)
	}
}

func TestMessageRefusals(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.orchestrator("orch2")
	e.child("kid", "orch")
	e.child("kid2", "orch2")
	orch := e.client("orch")
	st := sendMessage(t, orch, map[string]any{"id": "to-other", "to": "kid2", "body": "x"})
	// The closest of orch's own children is offered, never kid2.
	if st.State != "refused" || st.Detail != "`kid2` is not a child of this orchestrator (did you mean `kid`?)" {
		t.Fatalf("message to another orchestrator's child: %+v", st)
	}
	if got := unread(t, e.client("kid2")); len(got) != 0 {
		t.Fatalf("kid2 got %+v", got)
	}
	// The refusal is read history, not unread news.
	if got := unread(t, orch); len(got) != 0 {
		t.Fatalf("orchestrator's unread after a refusal: %+v", got)
	}
}

func TestMessageToStoppedChildIsDelivered(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	if err := e.admin("stop", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := e.info("kid"); got.State != "stopped" || got.Running {
		t.Fatalf("kid after stop: %+v", got)
	}
	st := sendMessage(t, e.client("orch"), map[string]any{"id": "while-stopped", "to": "kid", "body": "later"})
	if st.State != "done" || st.Detail != "delivered to kid" {
		t.Fatalf("status = %+v", st)
	}
	if got := unread(t, e.client("kid")); len(got) != 1 || got[0].Body != "later" {
		t.Fatalf("stopped child's inbox = %+v", got)
	}
}

func TestInboxIsolation(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	e.child("kid2", "orch")
	orch := e.client("orch")
	sendMessage(t, orch, map[string]any{"id": "secret", "to": "kid", "body": "for kid only"})
	item := unread(t, e.client("kid"))[0]

	// kid2's socket: the item id is unknown there, whatever the request says.
	kid2 := e.client("kid2")
	for _, op := range []string{"read", "ack"} {
		err := kid2.Call(context.Background(), op, map[string]any{"id": item.ID}, nil)
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.CodeNotFound {
			t.Errorf("%s of kid's item from kid2's socket: %v", op, err)
		}
	}
	if got := unread(t, kid2); len(got) != 0 {
		t.Errorf("kid2 lists %+v", got)
	}
	// Identity cannot be claimed in the request: unknown fields are refused.
	err := kid2.Call(context.Background(), "list", map[string]any{"sandbox": "kid"}, nil)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeBadRequest {
		t.Errorf("list naming another sandbox: %v", err)
	}
	// The orchestrator's socket does not see the child's inbox either.
	if err := orch.Call(context.Background(), "read", map[string]any{"id": item.ID}, nil); !errors.As(err, &we) || we.Code != wire.CodeNotFound {
		t.Errorf("orchestrator read the child's item: %v", err)
	}
	if got := unread(t, e.client("kid")); len(got) != 1 {
		t.Errorf("kid's item disturbed: %+v", got)
	}
}

func TestRestartKeepsInboxHistoryAndStatuses(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch := e.client("orch")
	sendMessage(t, orch, map[string]any{"id": "a", "to": "kid", "body": "first"})
	sendMessage(t, orch, map[string]any{"id": "b", "to": "kid", "body": "second"})
	kid := e.client("kid")
	items := unread(t, kid)
	if err := kid.Call(context.Background(), "read", map[string]any{"id": items[0].ID}, nil); err != nil {
		t.Fatal(err)
	}
	sockBefore := e.sock("kid")
	e.restart()

	if e.sock("kid") != sockBefore {
		t.Errorf("socket moved across a restart: %s -> %s", sockBefore, e.sock("kid"))
	}
	kid = e.client("kid")
	got := unread(t, kid)
	if len(got) != 1 || got[0].Body != "second" {
		t.Fatalf("unread after restart = %+v", got)
	}
	var all struct {
		Items   []wire.MessageItem `json:"items"`
		ReadIDs []string           `json:"read_ids"`
	}
	if err := kid.Call(context.Background(), "list", map[string]any{"all": true}, &all); err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 2 || len(all.ReadIDs) != 1 || all.ReadIDs[0] != items[0].ID {
		t.Fatalf("history after restart = %+v", all)
	}
	var st wire.StatusItem
	if err := e.client("orch").Call(context.Background(), "status", map[string]any{"ref": "a"}, &st); err != nil {
		t.Fatal(err)
	}
	if st.State != "done" || st.Detail != "delivered to kid" {
		t.Fatalf("status after restart = %+v", st)
	}
	// The journal survived: a resend delivers nothing new.
	sendMessage(t, e.client("orch"), map[string]any{"id": "b", "to": "kid", "body": "second"})
	if got := unread(t, kid); len(got) != 1 {
		t.Fatalf("resend after restart delivered again: %+v", got)
	}
}

func TestOneParkedNextPerSandbox(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	parked := e.raw("kid")
	fmt.Fprintln(parked, `{"v":1,"op":"next"}`)
	waitParked(t, e, "kid")

	second := e.raw("kid")
	fmt.Fprintln(second, `{"v":1,"op":"next"}`)
	if r := second.reply(t); r.OK || r.Error.Code != wire.CodeBusy {
		t.Fatalf("second next: %+v, want busy", r)
	}
	// Store queries are not blocked by the parked next.
	fmt.Fprintln(second, `{"v":1,"op":"list"}`)
	if r := second.reply(t); !r.OK {
		t.Fatalf("list beside a parked next: %+v", r.Error)
	}
	// Another sandbox may park its own next.
	other := e.raw("orch")
	fmt.Fprintln(other, `{"v":1,"op":"next","args":{"quiet_after_ms":50}}`)
	if r := other.reply(t); !r.OK {
		t.Fatalf("orch's next: %+v", r.Error)
	}
	// A delivery wakes the parked next.
	sendMessage(t, e.client("orch"), map[string]any{"id": "wake", "to": "kid", "body": "up"})
	r := parked.reply(t)
	var res wire.NextResult
	json.Unmarshal(r.Result, &res)
	var m wire.MessageItem
	json.Unmarshal(res.Item, &m)
	if !r.OK || m.Body != "up" {
		t.Fatalf("parked next woke with %+v %s", r.Error, r.Result)
	}
}

// waitParked waits until a sandbox's next is parked.
func waitParked(t *testing.T, e *testEnv, name string) {
	t.Helper()
	wait.For(t, "the next of "+name+" to park", func() bool { return e.b.ParkedForTest(name) })
}

func TestHalfCloseEndsParkedNext(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	c := e.raw("orch")
	fmt.Fprintln(c, `{"v":1,"op":"next"}`)
	waitParked(t, e, "orch")
	if err := c.Conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if !c.closed() {
		t.Fatal("the broker answered or kept a half-closed connection")
	}
	// The park slot is free again.
	n := e.raw("orch")
	fmt.Fprintln(n, `{"v":1,"op":"next","args":{"quiet_after_ms":1}}`)
	var res wire.NextResult
	r := n.reply(t)
	json.Unmarshal(r.Result, &res)
	if !r.OK || !res.Quiet {
		t.Fatalf("next after the half-close: %+v %s", r.Error, r.Result)
	}
}

func TestNextFilters(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	kid := e.client("kid")
	sendMessage(t, e.client("orch"), map[string]any{"id": "n1", "to": "kid", "body": "a note"})
	sendMessage(t, e.client("orch"), map[string]any{"id": "q1", "to": "kid", "body": "a question", "kind": "question"})
	var res wire.NextResult
	if err := kid.Call(context.Background(), "next", wire.NextArgs{MsgKinds: []string{"question"}}, &res); err != nil {
		t.Fatal(err)
	}
	var m wire.MessageItem
	json.Unmarshal(res.Item, &m)
	if m.Body != "a question" {
		t.Fatalf("next with msg:question woke on %+v", m)
	}
	// next does not consume (without ack): both stay unread.
	if got := unread(t, kid); len(got) != 2 {
		t.Fatalf("unread after next = %d", len(got))
	}
	// ack=true consumes, and a ref filter matches only that manifest's status.
	orch := e.client("orch")
	if err := orch.Call(context.Background(), "next", wire.NextArgs{Ref: "n1", QuietAfterMS: 100}, &res); err != nil {
		t.Fatal(err)
	}
	if !res.Quiet {
		t.Fatalf("next ref=n1 found %s although the reply already carried that status", res.Item)
	}
}

// TestNextFilterBounds: each filter list holds up to broker.MaxNextFilter
// entries and a ref up to the longest manifest id; one past is refused
// at once, before anything waits holding it.
func TestNextFilterBounds(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	orch := e.client("orch")
	kinds := func(n int) []string { return slices.Repeat([]string{"question"}, n) }
	for _, tc := range []struct {
		name string
		args wire.NextArgs
		want string // "" = answered
	}{
		{"kinds at the bound", wire.NextArgs{MsgKinds: kinds(broker.MaxNextFilter), QuietAfterMS: 1}, ""},
		{"states at the bound", wire.NextArgs{StatusStates: kinds(broker.MaxNextFilter), QuietAfterMS: 1}, ""},
		{"ref at the bound", wire.NextArgs{Ref: strings.Repeat("a", manifest.MaxIDLen), QuietAfterMS: 1}, ""},
		{"kinds past the bound", wire.NextArgs{MsgKinds: kinds(broker.MaxNextFilter + 1)}, "msg_kinds and status_states hold at most 32 entries each"},
		{"states past the bound", wire.NextArgs{StatusStates: kinds(broker.MaxNextFilter + 1)}, "msg_kinds and status_states hold at most 32 entries each"},
		{"ref past the bound", wire.NextArgs{Ref: strings.Repeat("a", manifest.MaxIDLen+1)}, "ref is longer than 64 bytes, the longest manifest id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var res wire.NextResult
			err := orch.Call(context.Background(), "next", tc.args, &res)
			if tc.want == "" {
				if err != nil || !res.Quiet {
					t.Fatalf("next: %v, %+v; want quiet", err, res)
				}
				return
			}
			wantWireError(t, tc.name, err, wire.CodeBadRequest, tc.want)
		})
	}
}

func TestStoreQueriesPerSandboxCap(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("a")
	e.orchestrator("b")
	var inFlight atomic.Int32
	release := make(chan struct{})
	entered := make(chan string, 16)
	e.b.SetQueryHookForTest(func(op string) {
		inFlight.Add(1)
		entered <- op
		<-release
		inFlight.Add(-1)
	})
	defer e.b.SetQueryHookForTest(nil)

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range broker.MaxQueriesPerSandbox + 1 {
		c := e.client("a")
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.Call(context.Background(), "list", nil, nil)
		}()
	}
	for range broker.MaxQueriesPerSandbox {
		<-entered
	}
	// The third of a's queries waits in its connection; b is served.
	bDone := make(chan error, 1)
	go func() { bDone <- e.client("b").Call(context.Background(), "list", nil, nil) }()
	select {
	case <-entered:
	case <-time.After(wait.Guard):
		t.Fatal("b's query did not reach a worker while a held its two")
	}
	if n := inFlight.Load(); n != broker.MaxQueriesPerSandbox+1 {
		t.Fatalf("%d queries in workers, want a's %d plus b's", n, broker.MaxQueriesPerSandbox)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a's query: %v (over the per-sandbox cap, queries wait, never busy)", err)
		}
	}
	if err := <-bDone; err != nil {
		t.Errorf("b's query: %v", err)
	}
}

// TestStoreQueriesTreeCap: one orchestrator's tree holds at most
// TreeMaxQueries store queries queued or running (its 64 children could
// otherwise fill the broker-wide queue); the next of that tree is busy,
// naming the cap, while another tree's query is admitted and served.
func TestStoreQueriesTreeCap(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("a")
	e.orchestrator("b")
	members := []string{"a"}
	for i := range broker.TreeMaxQueries / broker.MaxQueriesPerSandbox {
		kid := fmt.Sprintf("a-kid-%d", i)
		e.child(kid, "a")
		members = append(members, kid)
	}
	release := make(chan struct{})
	e.b.SetQueryHookForTest(func(string) { <-release })
	defer e.b.SetQueryHookForTest(nil)
	var wg sync.WaitGroup
	held := members[:broker.TreeMaxQueries/broker.MaxQueriesPerSandbox]
	errs := make(chan error, len(held)*broker.MaxQueriesPerSandbox)
	for _, m := range held {
		for range broker.MaxQueriesPerSandbox {
			c := e.client(m)
			wg.Go(func() { errs <- c.Call(context.Background(), "list", nil, nil) })
		}
	}
	wait.For(t, "the tree's queries admitted", func() bool { return e.b.QueriesAdmitted() == broker.TreeMaxQueries })
	last := members[len(members)-1]
	err := e.client(last).Call(context.Background(), "list", nil, nil)
	wantWireError(t, "a query past the tree's cap", err, wire.CodeBusy,
		fmt.Sprintf("orchestrator a and its children have %d store queries queued or running, at most %d now (the broker's %d, shared by the trees that query and one more); retry",
			broker.TreeMaxQueries, broker.TreeMaxQueries, broker.QueryWorkers+broker.QueryQueueCap))
	bDone := make(chan error, 1)
	go func() { bDone <- e.client("b").Call(context.Background(), "list", nil, nil) }()
	wait.For(t, "b's query admitted", func() bool { return e.b.QueriesAdmitted() == broker.TreeMaxQueries+1 })
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a query within the tree's cap: %v", err)
		}
	}
	if err := <-bDone; err != nil {
		t.Errorf("b's query: %v", err)
	}
}

// TestStoreQueriesShared: two trees that keep the query queue as full as
// they may leave room for a third: each tree's share shrinks as more
// trees query (with one fixed share each, two hostile trees filled the
// whole queue, and every other sandbox's list, read and ack was busy).
func TestStoreQueriesShared(t *testing.T) {
	const total = broker.QueryWorkers + broker.QueryQueueCap
	e := newTestEnv(t)
	e.orchestrator("c")
	hostile := map[string][]string{}
	for _, orch := range []string{"a", "b"} {
		e.orchestrator(orch)
		hostile[orch] = []string{orch}
		for i := range broker.TreeMaxQueries/broker.MaxQueriesPerSandbox - 1 {
			kid := fmt.Sprintf("%s-kid-%d", orch, i)
			e.child(kid, orch)
			hostile[orch] = append(hostile[orch], kid)
		}
	}
	e.child("b-spare", "b") // queries only past b's share
	release := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	e.b.SetQueryHookForTest(func(string) { <-release })
	defer e.b.SetQueryHookForTest(nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer letGo()
	// Each of a's and b's sandboxes sends as many lists as it may at
	// once: a, alone, gets half the queue; b, beside a, a third.
	flood := func(orch string) {
		for _, m := range hostile[orch] {
			for range broker.MaxQueriesPerSandbox {
				c := e.client(m)
				wg.Go(func() { c.Call(context.Background(), "list", nil, nil) })
			}
		}
	}
	flood("a")
	wait.For(t, "a's queries admitted", func() bool { return e.b.QueriesAdmitted() == total/2 })
	flood("b")
	wait.For(t, "b's queries admitted", func() bool { return e.b.QueriesAdmitted() == total/2+total/3 })
	err := e.client("b-spare").Call(context.Background(), "list", nil, nil)
	wantWireError(t, "a query past b's share", err, wire.CodeBusy,
		fmt.Sprintf("orchestrator b and its children have %d store queries queued or running, at most %d now (the broker's %d, shared by the trees that query and one more); retry",
			total/3, total/3, total))
	cDone := make(chan error, 1)
	go func() { cDone <- e.client("c").Call(context.Background(), "list", nil, nil) }()
	wait.For(t, "c's query admitted", func() bool { return e.b.QueriesAdmitted() == total/2+total/3+1 })
	letGo()
	if err := <-cDone; err != nil {
		t.Fatalf("c's query: %v", err)
	}
}

func TestSecondBrokerRefused(t *testing.T) {
	e := newTestEnv(t)
	_, err := broker.Open(broker.Config{StateDir: e.state, Backend: backendOf(t, e)})
	if !errors.Is(err, broker.ErrLocked) {
		t.Fatalf("second broker on the same state dir: %v", err)
	}
}

func TestSocketLayout(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	var list []wire.SandboxInfo
	if err := e.admin("ls", nil, &list); err != nil {
		t.Fatal(err)
	}
	info := list[0]
	if info.Name != "orch" || info.Role != "orchestrator" || info.State != "running" || !info.Running || info.Parent != nil || info.Branch != "main" {
		t.Fatalf("ls entry: %+v", info)
	}
	dir := filepath.Dir(*info.Socket)
	if filepath.Dir(dir) != filepath.Join(e.state, "sock") || !strings.HasPrefix(filepath.Base(dir), info.UUID+".") {
		t.Fatalf("socket dir %s is not <state>/sock/<uuid>.<random>", dir)
	}
	assertMode(t, dir, os.ModeDir|0o700)
	assertMode(t, *info.Socket, os.ModeSocket|0o600)
}

func TestLegacySocketDirReplaced(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	var list []wire.SandboxInfo
	e.admin("ls", nil, &list)
	uuid := list[0].UUID
	oldDir := filepath.Dir(e.sock("orch"))
	e.stop()
	// Simulate the legacy layout: the sandbox's recorded dir is
	// <state>/sock/<uuid>/.
	legacy := filepath.Join(e.state, "sock", uuid)
	if err := os.Rename(oldDir, legacy); err != nil {
		t.Fatal(err)
	}
	setSocketDirForTest(t, e, "orch", legacy)
	e.start()
	newDir := filepath.Dir(e.sock("orch"))
	if newDir == legacy || newDir == oldDir || !strings.HasPrefix(filepath.Base(newDir), uuid+".") {
		t.Fatalf("socket dir after legacy replacement: %s", newDir)
	}
	if _, err := os.Lstat(legacy); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("legacy dir still there: %v", err)
	}
	if got := unread(t, e.client("orch")); len(got) != 0 {
		t.Fatalf("unexpected items %+v", got)
	}
	// The unit kept running across the restart with the directory it
	// started with bound (the legacy one, now removed): a local sandbox's
	// socket dir is bound at its next start. After a stop and a start the
	// client inside reaches the broker through the new directory.
	for _, op := range []string{"stop", "start"} {
		if err := e.admin(op, wire.NameArgs{Name: "orch"}, nil); err != nil {
			t.Fatalf("%s: %v", op, err)
		}
	}
	if out := e.mustExec("orch", "jailbee", "inbox", "ls", "--json"); out != "[]" {
		t.Fatalf("inbox ls inside the sandbox: %q", out)
	}
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&(os.ModeType|os.ModePerm) != want {
		t.Errorf("%s: mode %v, want %v", filepath.Base(path), fi.Mode(), want)
	}
}

var _ = inbox.ErrUnreachable

func TestGlobalQueryQueueBusyOnlyWhenFull(t *testing.T) {
	e := newTestEnv(t)
	// Enough sandboxes to fill every worker and the whole queue, two
	// queries each (the per-sandbox cap), plus one more sandbox.
	held := broker.QueryWorkers + broker.QueryQueueCap
	n := held / broker.MaxQueriesPerSandbox
	for i := range n + 1 {
		e.orchestrator(fmt.Sprintf("s%d", i))
	}
	release := make(chan struct{})
	var running atomic.Int32
	e.b.SetQueryHookForTest(func(string) {
		running.Add(1)
		<-release
	})
	var wg sync.WaitGroup
	errs := make(chan error, held)
	for i := range n {
		for range broker.MaxQueriesPerSandbox {
			c := e.client(fmt.Sprintf("s%d", i))
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- c.Call(context.Background(), "list", nil, nil)
			}()
		}
	}
	for int(running.Load()) < broker.QueryWorkers || e.b.QueuedQueriesForTest() < broker.QueryQueueCap {
		time.Sleep(5 * time.Millisecond)
	}
	// Queue full: the next query, from a sandbox under its own cap, is busy.
	err := e.client(fmt.Sprintf("s%d", n)).Call(context.Background(), "list", nil, nil)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeBusy {
		t.Fatalf("query past a full queue: %v, want busy", err)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a query within the queue's capacity failed: %v", err)
		}
	}
	e.b.SetQueryHookForTest(nil)
}

func TestQueuedSendDroppedWhenClientLeaves(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	hold := make(chan struct{})
	held := make(chan struct{}, 4)
	e.b.SetExecHookForTest(func() {
		held <- struct{}{}
		<-hold
	})
	// A first send occupies the executor (held in the hook).
	first := e.raw("orch")
	fmt.Fprintln(first, `{"v":1,"op":"send","args":{"manifest":{"version":1,"id":"first","type":"message","to":"kid","body":"1"}}}`)
	<-held
	// A second send queues behind it, then its client leaves.
	gone := e.raw("orch")
	fmt.Fprintln(gone, `{"v":1,"op":"send","args":{"manifest":{"version":1,"id":"gone","type":"message","to":"kid","body":"2"}}}`)
	wait.For(t, "the second send to be read", func() bool { return e.b.BusyConnsForTest() == 2 })
	gone.Close()
	// The first send still holds the executor, so the second can only
	// end by being dropped.
	wait.For(t, "the broker to drop the second send", func() bool { return e.b.BusyConnsForTest() == 1 })
	e.b.SetExecHookForTest(nil)
	close(hold)
	if r := first.reply(t); !r.OK {
		t.Fatalf("first send: %+v", r.Error)
	}
	got := unread(t, e.client("kid"))
	if len(got) != 1 || got[0].Body != "1" {
		t.Fatalf("child inbox = %+v, want only the first message", got)
	}
	// Nothing was journaled for the dropped send: the id is still free.
	if st := sendMessage(t, e.client("orch"), map[string]any{"id": "gone", "to": "kid", "body": "again"}); st.State != "done" {
		t.Fatalf("resend of the dropped id: %+v", st)
	}
}

func TestRefWaitBesideParkedNext(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	parked := e.raw("orch")
	fmt.Fprintln(parked, `{"v":1,"op":"next"}`)
	waitParked(t, e, "orch")
	// send --wait's status wait is not the general next: no busy.
	c := e.raw("orch")
	fmt.Fprintln(c, `{"v":1,"op":"next","args":{"ref":"x","quiet_after_ms":50}}`)
	if r := c.reply(t); !r.OK {
		t.Fatalf("ref-scoped next beside a parked next: %+v", r.Error)
	}
}

func TestGrantDocuments(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	var g map[string]any
	if err := e.client("orch").Call(context.Background(), "grant", nil, &g); err != nil {
		t.Fatal(err)
	}
	if g["max_running_children"] != float64(2) || len(g["operations"].([]any)) != 7 {
		t.Fatalf("default grant = %v", g)
	}
	for _, bad := range []string{`{"version":1,"bogus":true}`, `{"version":2,"max_running_children":1,"operations":[],"grantable":{"mounts":[],"loose":false,"egress":[]}}`, `[]`} {
		err := e.admin("new", wire.NewArgs{Name: "x", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(bad)}, nil)
		var we *wire.Error
		if !errors.As(err, &we) || !strings.HasPrefix(we.Detail, "invalid grant") {
			t.Errorf("grant %s: %v", bad, err)
		}
	}
	var list []wire.SandboxInfo
	e.admin("ls", nil, &list)
	if len(list) != 1 {
		t.Fatalf("a refused grant left a sandbox: %+v", list)
	}
	// A child has no grant.
	e.child("kid", "orch")
	err := e.client("kid").Call(context.Background(), "grant", nil, nil)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeNotFound {
		t.Fatalf("child's grant: %v", err)
	}
}

func TestBrokerStopsReadingWhenRepliesAreNotCollected(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	c := e.raw("orch")
	// Far more requests than the socket buffers hold, and never a read:
	// once the broker's replies fill the buffers it stops reading, so our
	// writes stop completing.
	line := []byte(`{"v":1,"op":"list"}` + "\n")
	batch := bytes.Repeat(line, 1<<16)
	c.SetWriteDeadline(time.Now().Add(3 * time.Second))
	written := 0
	for range 64 {
		n, err := c.Write(batch)
		written += n
		if err != nil {
			break
		}
	}
	if written == 64*len(batch) {
		t.Fatalf("all %d bytes of requests were taken although no reply was collected", written)
	}
	// Other connections are still served.
	o := e.raw("orch")
	fmt.Fprintln(o, `{"v":1,"op":"list"}`)
	if r := o.reply(t); !r.OK {
		t.Fatalf("another connection: %+v", r.Error)
	}
}

func TestHalfClosedSendLeavesStatusUnread(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	// Hold the send once it has its executor turn, half-close, then let it
	// run: handling had begun before the client left.
	entered, release := make(chan struct{}), make(chan struct{})
	e.b.SetExecHookForTest(func() {
		close(entered)
		<-release
	})
	c := e.raw("orch")
	fmt.Fprintln(c, `{"v":1,"op":"send","args":{"manifest":{"version":1,"id":"hc-1","type":"message","to":"kid","body":"x"}}}`)
	<-entered
	if err := c.Conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	e.b.SetExecHookForTest(nil)
	close(release)
	if !c.closed() {
		t.Fatal("the broker answered a half-closed send")
	}
	// The message went out (handling had begun), and its status is unread.
	if got := unread(t, e.client("kid")); len(got) != 1 {
		t.Fatalf("child inbox = %+v", got)
	}
	var res struct {
		Items []wire.StatusItem `json:"items"`
	}
	if err := e.client("orch").Call(context.Background(), "list", nil, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Items) != 1 || res.Items[0].Ref != "hc-1" || res.Items[0].State != "done" {
		t.Fatalf("orchestrator unread = %+v, want the status of hc-1", res.Items)
	}
}

func TestExecutorQueueBusyOnlyWhenFull(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("o")
	hold := make(chan struct{})
	e.b.SetExecHookForTest(func() { <-hold })
	// One sandbox's sends wait in its own line: however many connections
	// it floods, it holds one place (the running one) for the executor.
	var sends []*rawConn
	for i := range broker.MaxConnsPerSandbox {
		c := e.raw("o")
		// A refused manifest still goes through the executor.
		fmt.Fprintf(c, `{"v":1,"op":"send","args":{"manifest":{"version":1,"id":"q-%d","type":"stop","child":"nobody"}}}`+"\n", i)
		sends = append(sends, c)
	}
	// Host commands have no line of their own: they fill the queue. A
	// stop of no sandbox still goes through the executor.
	stop := func() *rawConn {
		c := dialRaw(t, e.adminPath())
		fmt.Fprintf(c, `{"v":1,"op":"stop","args":{"name":"nobody"}}`+"\n")
		return c
	}
	var admin []*rawConn
	for range broker.ExecQueueCap {
		admin = append(admin, stop())
	}
	for e.b.QueuedSendsForTest() < broker.ExecQueueCap {
		time.Sleep(5 * time.Millisecond)
	}
	if r := stop().reply(t); r.OK || r.Error.Code != wire.CodeBusy {
		t.Fatalf("a host command past a full executor queue: %+v, want busy", r)
	}
	e.b.SetExecHookForTest(nil)
	close(hold)
	for i, c := range sends {
		if r := c.reply(t); !r.OK {
			t.Fatalf("send %d in the sandbox's line: %+v", i, r.Error)
		}
	}
	for i, c := range admin {
		if r := c.reply(t); r.OK || r.Error.Code != wire.CodeNotFound {
			t.Fatalf("host command %d within the queue: %+v, want not_found", i, r)
		}
	}
}

func TestUnrecordedBackendSandbox(t *testing.T) {
	e := newTestEnv(t)
	// A create the broker did not finish: the backend has it, broker.db not.
	ghost, err := backendOf(t, e).Create(context.Background(), backend.CreateOptions{Name: "ghost", HostUID: spareHostUID(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = e.admin("new", wire.NewArgs{Name: "ghost", Repo: e.repo, Role: "orchestrator"}, nil)
	wantWireError(t, "new over an unrecorded sandbox", err, wire.CodeBadRequest,
		"a sandbox `ghost` exists in the backend without a broker record (an interrupted create?): remove it with 'jailbee destroy ghost --force'")
	// The refused create left the backend's sandbox as it was.
	if insts, _ := backendOf(t, e).List(context.Background()); len(insts) != 1 || insts[0].UUID != ghost.UUID {
		t.Fatalf("backend after the refused new: %+v", insts)
	}
	err = e.admin("destroy", wire.DestroyArgs{Name: "ghost"}, nil)
	wantWireError(t, "destroy without --force", err, wire.CodeNotFound, "no sandbox named ghost")
	var res wire.DestroyResult
	if err := e.admin("destroy", wire.DestroyArgs{Name: "ghost", Force: true}, &res); err != nil || res.Destroyed != 1 {
		t.Fatalf("destroy --force: %+v, %v", res, err)
	}
	if insts, _ := backendOf(t, e).List(context.Background()); len(insts) != 0 {
		t.Fatalf("backend after destroy --force: %+v", insts)
	}
	e.orchestrator("ghost")
	if got := e.info("ghost"); got.UUID == ghost.UUID || !got.Running {
		t.Fatalf("the new ghost: %+v", got)
	}
}

// spareHostUID is a host uid for a sandbox made without the broker: as
// root, a uid outside the broker's range (so the broker never picks it)
// that no account or process uses; 0 otherwise.
func spareHostUID(t testing.TB) int {
	t.Helper()
	if os.Geteuid() != 0 {
		return 0
	}
	def := config.DefaultBroker().SandboxUIDs
	for {
		var b [4]byte
		rand.Read(b[:])
		uid := int(def.Last()) + 1 + int(binary.LittleEndian.Uint32(b[:])%(1<<20))
		if len(processesOf(uid, "")) == 0 {
			if _, err := user.LookupId(strconv.Itoa(uid)); err != nil {
				return uid
			}
		}
	}
}

// A next --ack whose reply is lost returns the item to the inbox, and that
// wakes a next parked meanwhile on another connection: it must not sleep
// beside an unread item.
func TestLostAckWakesParkedNext(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	// A body of control characters is stored escaped, six bytes each: a
	// reply far larger than a socket's buffer, so the broker's write of it
	// blocks while the client does not read.
	body := strings.Repeat("\x01", manifest.MaxTextBytes-1)
	sendMessage(t, e.client("orch"), map[string]any{"id": "big", "to": "kid", "body": body})

	acker := e.raw("kid")
	fmt.Fprintln(acker, `{"v":1,"op":"next","args":{"ack":true}}`)
	kid := e.client("kid")
	wait.For(t, "the ack to take the item and give up its park", func() bool {
		return len(unread(t, kid)) == 0 && !e.b.ParkedForTest("kid")
	})

	parked := e.raw("kid")
	fmt.Fprintln(parked, `{"v":1,"op":"next"}`)
	waitParked(t, e, "kid")

	acker.Close() // the ack's reply is lost: the item is unread again
	r := parked.reply(t)
	var res wire.NextResult
	json.Unmarshal(r.Result, &res)
	var m wire.MessageItem
	json.Unmarshal(res.Item, &m)
	if !r.OK || m.Body != body {
		t.Fatalf("parked next: %+v, item of %d bytes", r.Error, len(m.Body))
	}
}
