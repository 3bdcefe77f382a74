package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"agentbox/internal/inbox"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// The tree budget through real sockets: orch with two children, bad (a
// hostile child) and good. As in quota_test.go, a message "hello" with a
// three-character id is stored as 128 bytes from orch, 127 from bad.

// treeFamily is a broker with quota q serving orch, bad and good.
func treeFamily(t *testing.T, q store.Quota) *testEnv {
	t.Helper()
	e := newTestEnvQuota(t, q)
	e.orchestrator("orch")
	e.child("bad", "orch")
	e.child("good", "orch")
	return e
}

// putBack has name send a manifest the broker refuses (and journals)
// under id, and half-close its connection while the executor runs it:
// the reply is never written, so the refused status is put back unread
// into name's inbox. The executor hook only holds the send until the
// half-close is made; a child controls that timing itself (it half-closes
// as soon as it has written the line, and tries again when the reply
// won).
func putBack(t *testing.T, e *testEnv, name, id string) {
	t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	e.b.SetExecHookForTest(func() {
		close(entered)
		<-release
	})
	c := e.raw(name)
	fmt.Fprintf(c, `{"v":1,"op":"send","args":{"manifest":{"version":1,"id":%q,"type":"spawn"}}}`+"\n", id)
	<-entered
	if err := c.Conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	e.b.SetExecHookForTest(nil)
	close(release)
	if !c.closed() {
		t.Fatal("the broker answered a half-closed send")
	}
}

// unreadStatuses counts the unread statuses in a sandbox's inbox, and
// their stored bytes.
func unreadStatuses(t *testing.T, c *inbox.Client) (n, size int) {
	t.Helper()
	for _, doc := range unreadDocs(t, c) {
		if strings.Contains(string(doc), `"type":"status"`) {
			n++
			size += len(doc)
		}
	}
	return n, size
}

// TestAttackTreeBudgetFilledWithStatuses: a child puts back refused
// statuses into its own inbox, as many as it likes (statuses are never
// refused). Were they counted in the tree budget, that child alone would
// fill its orchestrator's tree and the orchestrator could message none of
// its siblings. The tree budget counts messages only.
func TestAttackTreeBudgetFilledWithStatuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		q    store.Quota
	}{
		{"items", store.Quota{TreeMaxUnreadItems: 3}},
		{"bytes", store.Quota{TreeMaxUnreadBytes: 3 * 128}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := treeFamily(t, tc.q)
			for i := range 6 {
				putBack(t, e, "bad", fmt.Sprintf("x-%d", i))
			}
			n, size := unreadStatuses(t, e.client("bad"))
			if n != 6 || size <= 3*128 {
				t.Fatalf("bad holds %d unread statuses of %d B, want 6 past both tree bounds", n, size)
			}
			// The orchestrator still messages the honest sibling, up to
			// the bound.
			orch := e.client("orch")
			for _, id := range []string{"m-1", "m-2", "m-3"} {
				wantDone(t, sendHello(t, orch, id, "good"), "good")
			}
			if got := unreadOrigins(t, e.client("good")); got != "m-1,m-2,m-3" {
				t.Fatalf("good's unread: %s", got)
			}
		})
	}
}

// TestTreeBudgetCountsMessages: the tree bound, at its limit and one
// past it, counts the unread messages of the orchestrator and its
// children (a child's messages to the orchestrator included), never their
// statuses: the refusal names only inboxes holding messages. The counts
// come from broker.db after a restart.
func TestTreeBudgetCountsMessages(t *testing.T) {
	e := treeFamily(t, store.Quota{TreeMaxUnreadItems: 3})
	putBack(t, e, "bad", "x-1")
	putBack(t, e, "bad", "x-2")
	// orch's own statuses do not count either: one put back unread.
	putBack(t, e, "orch", "x-3")
	orch := e.client("orch")
	if n, _ := unreadStatuses(t, orch); n != 1 {
		t.Fatalf("orch holds %d unread statuses, want 1", n)
	}
	// At the limit: three messages fit.
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		wantDone(t, sendHello(t, orch, id, "good"), "good")
	}
	full := "the inboxes of `orch` and its children are full: 3 unread messages (at most 3) and 384 B unread (at most 64 MiB), held by `good` (3 messages, 384 B); send again with a new id once they have read their messages, or destroy children that never will"
	// One past it: refused, to either child, naming only good.
	wantRefused(t, sendHello(t, orch, "m-4", "good"), full)
	wantRefused(t, sendHello(t, orch, "m-5", "bad"), full)

	e.restart()
	orch = e.client("orch")
	wantRefused(t, sendHello(t, orch, "m-6", "good"), full)
	// good reads one; bad takes the room with a message to orch, which
	// counts in the tree (held by orch) though orch's own quota admits it.
	good := e.client("good")
	if err := good.Call(context.Background(), "ack", wire.AckArgs{ID: unread(t, good)[0].ID}, nil); err != nil {
		t.Fatal(err)
	}
	wantDone(t, sendHello(t, e.client("bad"), "b-1", ""), "orch")
	wantRefused(t, sendHello(t, orch, "m-7", "good"),
		"the inboxes of `orch` and its children are full: 3 unread messages (at most 3) and 383 B unread (at most 64 MiB), held by `good` (2 messages, 256 B), `orch` (1 message, 127 B); send again with a new id once they have read their messages, or destroy children that never will")
	// orch reads it, and there is room for one message again.
	for _, it := range unreadDocs(t, orch) {
		var m wire.MessageItem
		if err := json.Unmarshal(it, &m); err != nil {
			t.Fatal(err)
		}
		if m.Type == wire.ItemMessage {
			if err := orch.Call(context.Background(), "ack", wire.AckArgs{ID: m.ID}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantDone(t, sendHello(t, orch, "m-8", "good"), "good")
	wantRefused(t, sendHello(t, orch, "m-9", "good"), full)
}
