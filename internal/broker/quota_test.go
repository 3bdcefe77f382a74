package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"agentbox/internal/broker"
	"agentbox/internal/inbox"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// The inbox quota through real sockets. Every message here has body
// "hello" and a manifest id of three characters, so each stored document
// has one length: 128 bytes from orch ("from":"orch"), 127 from kid.

// quotaDirections are the two ways a message goes.
var quotaDirections = []struct {
	name              string
	sender, recipient string
	to                string // the manifest's "to"
	docLen            int    // the stored document of each message
}{
	{"orchestrator to child", "orch", "kid", "kid", 128},
	{"child to orchestrator", "kid", "orch", "", 127},
}

// quotaFamily is a broker with quota q serving orchestrator orch and its
// child kid.
func quotaFamily(t *testing.T, q store.Quota) *testEnv {
	t.Helper()
	e := newTestEnvQuota(t, q)
	e.orchestrator("orch")
	e.child("kid", "orch")
	return e
}

// sendHello sends message id (body "hello") to `to` ("" from a child).
func sendHello(t *testing.T, c *inbox.Client, id, to string) wire.StatusItem {
	t.Helper()
	m := map[string]any{"id": id, "body": "hello"}
	if to != "" {
		m["to"] = to
	}
	return sendMessage(t, c, m)
}

// unreadDocs lists a sandbox's unread items as stored.
func unreadDocs(t *testing.T, c *inbox.Client) []json.RawMessage {
	t.Helper()
	var res wire.ListResult
	if err := c.Call(context.Background(), "list", nil, &res); err != nil {
		t.Fatal(err)
	}
	return res.Items
}

// unreadOrigins are the origin ids of a sandbox's unread messages, in
// order.
func unreadOrigins(t *testing.T, c *inbox.Client) string {
	t.Helper()
	return strings.Join(originIDs(unread(t, c)), ",")
}

func wantDone(t *testing.T, st wire.StatusItem, recipient string) {
	t.Helper()
	if st.State != wire.StateDone || st.Detail != "delivered to "+recipient {
		t.Fatalf("status of %s = %+v, want done, delivered to %s", st.Ref, st, recipient)
	}
}

func wantRefused(t *testing.T, st wire.StatusItem, detail string) {
	t.Helper()
	if st.State != wire.StateRefused || st.Detail != detail {
		t.Fatalf("status of %s = %s %q,\nwant refused %q", st.Ref, st.State, st.Detail, detail)
	}
}

func TestInboxQuotaItems(t *testing.T) {
	full := map[string]string{
		"kid":  "the inbox of `kid` is full: 3 unread items (at most 3) and 384 B unread (at most 32 MiB); send again with a new id once `kid` has read its messages",
		"orch": "the inbox of `orch` is full: 3 unread items (at most 3) and 381 B unread (at most 32 MiB); send again with a new id once `orch` has read its messages",
	}
	for _, d := range quotaDirections {
		t.Run(d.name, func(t *testing.T) {
			e := quotaFamily(t, store.Quota{MaxUnreadItems: 3})
			snd, rcv := e.client(d.sender), e.client(d.recipient)
			// At the limit: the third unread item fits.
			for _, id := range []string{"m-1", "m-2", "m-3"} {
				wantDone(t, sendHello(t, snd, id, d.to), d.recipient)
			}
			for _, doc := range unreadDocs(t, rcv) {
				if len(doc) != d.docLen {
					t.Fatalf("stored document of %d bytes, want %d: %s", len(doc), d.docLen, doc)
				}
			}
			// One past it: refused, delivered nowhere, and the refusal is
			// read history of the sender (the reply carried it).
			refused := sendHello(t, snd, "m-4", d.to)
			wantRefused(t, refused, full[d.recipient])
			if got := unreadOrigins(t, rcv); got != "m-1,m-2,m-3" {
				t.Fatalf("recipient's unread after the refusal: %s", got)
			}
			if got := unread(t, snd); len(got) != 0 {
				t.Fatalf("sender's unread after the refusal: %+v", got)
			}
			// A resend of the refused id gets the same status, and delivers
			// nothing.
			if again := sendHello(t, snd, "m-4", d.to); again != refused {
				t.Fatalf("resend of a refused id: %+v, first %+v", again, refused)
			}
			// Acking an item makes room for one message, under a new id.
			first := unread(t, rcv)[0]
			if err := rcv.Call(context.Background(), "ack", wire.AckArgs{ID: first.ID}, nil); err != nil {
				t.Fatal(err)
			}
			wantDone(t, sendHello(t, snd, "m-5", d.to), d.recipient)
			if again := sendHello(t, snd, "m-4", d.to); again != refused {
				t.Fatalf("resend of a refused id once there is room: %+v, first %+v", again, refused)
			}
			wantRefused(t, sendHello(t, snd, "m-6", d.to), full[d.recipient])
			if got := unreadOrigins(t, rcv); got != "m-2,m-3,m-5" {
				t.Fatalf("recipient's unread: %s", got)
			}
		})
	}
}

func TestInboxQuotaBytes(t *testing.T) {
	for _, d := range quotaDirections {
		for _, tc := range []struct {
			name     string
			maxBytes int64
			want     string // the refusal of the third message
		}{
			{"just enough for two", int64(2 * d.docLen),
				fmt.Sprintf("the inbox of `%[1]s` is full: 2 unread items (at most 1000) and %[2]d B unread (at most %[2]d B), no room for this message (%[3]d B); send again with a new id once `%[1]s` has read its messages",
					d.recipient, 2*d.docLen, d.docLen)},
			{"one byte short of three", int64(3*d.docLen - 1),
				fmt.Sprintf("the inbox of `%[1]s` is full: 2 unread items (at most 1000) and %[2]d B unread (at most %[4]d B), no room for this message (%[3]d B); send again with a new id once `%[1]s` has read its messages",
					d.recipient, 2*d.docLen, d.docLen, 3*d.docLen-1)},
		} {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) {
				e := quotaFamily(t, store.Quota{MaxUnreadBytes: tc.maxBytes})
				snd, rcv := e.client(d.sender), e.client(d.recipient)
				wantDone(t, sendHello(t, snd, "m-1", d.to), d.recipient)
				wantDone(t, sendHello(t, snd, "m-2", d.to), d.recipient)
				refused := sendHello(t, snd, "m-3", d.to)
				wantRefused(t, refused, tc.want)
				if again := sendHello(t, snd, "m-3", d.to); again != refused {
					t.Fatalf("resend of a refused id: %+v, first %+v", again, refused)
				}
				// Reading an item frees its bytes.
				first := unread(t, rcv)[0]
				if err := rcv.Call(context.Background(), "read", wire.ReadArgs{ID: first.ID}, nil); err != nil {
					t.Fatal(err)
				}
				wantDone(t, sendHello(t, snd, "m-4", d.to), d.recipient)
				wantRefused(t, sendHello(t, snd, "m-5", d.to), tc.want)
				if got := unreadOrigins(t, rcv); got != "m-2,m-4" {
					t.Fatalf("recipient's unread: %s", got)
				}
			})
		}
	}
}

// TestInboxQuotaNeverRefusesStatuses: with orch's inbox full, orch's own
// sends still get their statuses, a status put back unread takes the inbox
// past its bound, and messages to it report the true count.
func TestInboxQuotaNeverRefusesStatuses(t *testing.T) {
	e := quotaFamily(t, store.Quota{MaxUnreadItems: 2})
	orch, kid := e.client("orch"), e.client("kid")
	wantDone(t, sendHello(t, kid, "m-1", ""), "orch")
	wantDone(t, sendHello(t, kid, "m-2", ""), "orch")
	wantRefused(t, sendHello(t, kid, "m-3", ""),
		"the inbox of `orch` is full: 2 unread items (at most 2) and 254 B unread (at most 32 MiB); send again with a new id once `orch` has read its messages")

	wantDone(t, sendHello(t, orch, "o-1", "kid"), "kid")
	wantRefused(t, sendHello(t, orch, "o-2", "nobody"), "`nobody` is not a child of this orchestrator")
	// A send whose client half-closes once handling has begun: its status
	// goes back into orch's full inbox, unread.
	entered, release := make(chan struct{}), make(chan struct{})
	e.b.SetExecHookForTest(func() {
		close(entered)
		<-release
	})
	c := e.raw("orch")
	fmt.Fprintln(c, `{"v":1,"op":"send","args":{"manifest":{"version":1,"id":"o-3","type":"message","to":"kid","body":"hello"}}}`)
	<-entered
	if err := c.Conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	e.b.SetExecHookForTest(nil)
	close(release)
	if !c.closed() {
		t.Fatal("the broker answered a half-closed send")
	}
	docs := unreadDocs(t, orch)
	size := 0
	for _, doc := range docs {
		size += len(doc)
	}
	if len(docs) != 3 || !strings.Contains(string(docs[2]), `"ref":"o-3"`) {
		t.Fatalf("orch's unread = %s, want two messages and the status of o-3", docs)
	}
	wantRefused(t, sendHello(t, kid, "m-4", ""), fmt.Sprintf(
		"the inbox of `orch` is full: 3 unread items (at most 2) and %d B unread (at most 32 MiB); send again with a new id once `orch` has read its messages", size))
	// Every status orch was sent is in its history.
	var all struct {
		Items []wire.StatusItem `json:"items"`
	}
	if err := orch.Call(context.Background(), "list", map[string]any{"all": true}, &all); err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, it := range all.Items {
		if it.Type == wire.ItemStatus {
			refs = append(refs, it.Ref+":"+it.State)
		}
	}
	if got := strings.Join(refs, ","); got != "o-1:done,o-2:refused,o-3:done" {
		t.Fatalf("orch's statuses: %s", got)
	}
}

// TestInboxQuotaSurvivesRestart: the counts come from broker.db, not from
// the memory of the broker that filled the inbox.
func TestInboxQuotaSurvivesRestart(t *testing.T) {
	const full = "the inbox of `kid` is full: 2 unread items (at most 2) and 256 B unread (at most 32 MiB); send again with a new id once `kid` has read its messages"
	e := quotaFamily(t, store.Quota{MaxUnreadItems: 2})
	wantDone(t, sendHello(t, e.client("orch"), "m-1", "kid"), "kid")
	wantDone(t, sendHello(t, e.client("orch"), "m-2", "kid"), "kid")
	refused := sendHello(t, e.client("orch"), "m-3", "kid")
	wantRefused(t, refused, full)

	e.restart()
	orch := e.client("orch")
	wantRefused(t, sendHello(t, orch, "m-4", "kid"), full)
	if again := sendHello(t, orch, "m-3", "kid"); again != refused {
		t.Fatalf("resend of a refused id after a restart: %+v, first %+v", again, refused)
	}
	kid := e.client("kid")
	if err := kid.Call(context.Background(), "ack", wire.AckArgs{ID: unread(t, kid)[0].ID}, nil); err != nil {
		t.Fatal(err)
	}
	wantDone(t, sendHello(t, orch, "m-5", "kid"), "kid")
	if got := unreadOrigins(t, kid); got != "m-2,m-5" {
		t.Fatalf("kid's unread: %s", got)
	}
}

// TestInboxQuotaDefaults: a broker configured with no quota runs with the
// default one.
func TestInboxQuotaDefaults(t *testing.T) {
	e := quotaFamily(t, store.Quota{})
	// Fill kid's inbox through the store (a thousand sends over the socket
	// would only be slower), then send over the socket.
	ctx := context.Background()
	for i := range broker.DefaultInboxMaxUnreadItems {
		if _, err := e.b.Store().DeliverMessage(ctx, store.Delivery{From: "orch", To: "kid",
			ManifestID: fmt.Sprintf("f-%04d", i), Kind: "note", Body: "hello"}); err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	// Each document: 128 bytes as above, plus 3 for the longer origin id:
	// 1000 x 131 B.
	wantRefused(t, sendHello(t, e.client("orch"), "m-1", "kid"),
		"the inbox of `kid` is full: 1000 unread items (at most 1000) and 127.9 KiB unread (at most 32 MiB); send again with a new id once `kid` has read its messages")
	if n := len(unreadDocs(t, e.client("kid"))); n != broker.DefaultInboxMaxUnreadItems {
		t.Fatalf("kid holds %d unread items", n)
	}
}

// TestChildShareOfOrchestratorInbox: a child that fills its share of its
// orchestrator's inbox (1/store.ChildShare of the quota) while it has a
// sibling is refused, with its own counts; the sibling's notes still get
// in, up to the inbox's own bound.
func TestChildShareOfOrchestratorInbox(t *testing.T) {
	e := quotaFamily(t, store.Quota{MaxUnreadItems: 4})
	e.child("sib", "orch")
	kid, sib := e.client("kid"), e.client("sib")
	wantDone(t, sendHello(t, kid, "k-1", ""), "orch")
	wantDone(t, sendHello(t, kid, "k-2", ""), "orch")
	wantRefused(t, sendHello(t, kid, "k-3", ""), "your unread messages use up your share of the inbox of `orch` (1/2 of its quota, so its other children keep room): 2 messages (at most 2) and 254 B (at most 16 MiB); send again with a new id once `orch` has read your messages")
	wantDone(t, sendHello(t, sib, "s-1", ""), "orch")
	wantDone(t, sendHello(t, sib, "s-2", ""), "orch")
	wantRefused(t, sendHello(t, sib, "s-3", ""), "the inbox of `orch` is full: 4 unread items (at most 4) and 508 B unread (at most 32 MiB); send again with a new id once `orch` has read its messages")
	if got := unreadOrigins(t, e.client("orch")); got != "k-1,k-2,s-1,s-2" {
		t.Fatalf("orchestrator's unread: %s", got)
	}
}
