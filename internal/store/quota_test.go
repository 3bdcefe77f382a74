package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"agentbox/internal/wire"
)

// msgLen is the length of the document DeliverMessage stores for a
// message from `from` with body and manifest id (host ids have one length).
func msgLen(t *testing.T, from, manifestID, body string) int64 {
	t.Helper()
	doc, err := json.Marshal(wire.MessageItem{Version: 1, ID: "h-00000000", Type: wire.ItemMessage, From: from,
		Kind: "note", Body: body, OriginID: manifestID})
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(doc))
}

// dbTotals counts a sandbox's unread inbox in the database.
func dbTotals(t *testing.T, s *Store, sandbox string) unreadTotals {
	t.Helper()
	var tot unreadTotals
	err := s.db.QueryRow(`SELECT count(*), coalesce(sum(octet_length(doc)), 0),
		count(*) FILTER (WHERE type = 'message'), coalesce(sum(octet_length(doc)) FILTER (WHERE type = 'message'), 0)
		FROM items WHERE sandbox = ? AND read = 0`,
		sandbox).Scan(&tot.items, &tot.bytes, &tot.msgs, &tot.msgBytes)
	if err != nil {
		t.Fatal(err)
	}
	return tot
}

func deliver(s *Store, from, to, id string) (Sent, error) {
	return s.DeliverMessage(context.Background(), Delivery{From: from, To: to, ManifestID: id, Kind: "note", Body: "body of " + id})
}

// TestQuotaBounds fills an inbox to each bound, in both directions, and
// checks that one more message is refused, writes nothing, and fits again
// once an item is read.
func TestQuotaBounds(t *testing.T) {
	for _, dir := range []struct{ from, to string }{{"o", "c"}, {"c", "o"}} {
		size := msgLen(t, dir.from, "m-1", "body of m-1")
		for _, tc := range []struct {
			name      string
			quota     Quota
			fit       int  // messages delivered before the refusal
			itemsFull bool // the item bound refuses, not the byte bound
		}{
			{"items", Quota{MaxUnreadItems: 3}, 3, true},
			{"items with bytes to spare", Quota{MaxUnreadItems: 3, MaxUnreadBytes: 100 * size}, 3, true},
			{"bytes", Quota{MaxUnreadBytes: 2 * size}, 2, false},
			{"bytes one short", Quota{MaxUnreadBytes: 3*size - 1}, 2, false},
			{"bytes with items to spare", Quota{MaxUnreadItems: 10, MaxUnreadBytes: 2 * size}, 2, false},
		} {
			t.Run(dir.from+" to "+dir.to+"/"+tc.name, func(t *testing.T) {
				s, _ := openTestStore(t)
				s.SetQuota(tc.quota)
				ctx := context.Background()
				for i := 1; i <= tc.fit; i++ {
					if _, err := deliver(s, dir.from, dir.to, fmt.Sprintf("m-%d", i)); err != nil {
						t.Fatalf("message %d of %d: %v", i, tc.fit, err)
					}
				}
				refusedID := fmt.Sprintf("m-%d", tc.fit+1)
				_, err := deliver(s, dir.from, dir.to, refusedID)
				var full *InboxFullError
				if !errors.As(err, &full) {
					t.Fatalf("message %d: %v, want an InboxFullError", tc.fit+1, err)
				}
				want := InboxFullError{Sandbox: dir.to, Items: tc.fit, Bytes: int64(tc.fit) * size, MessageBytes: size, Quota: tc.quota}
				if *full != want || full.ItemsFull() != tc.itemsFull {
					t.Fatalf("refusal %+v (items full %v), want %+v (items full %v)", *full, full.ItemsFull(), want, tc.itemsFull)
				}
				// Nothing was written: no journal row, no new item, no status.
				if _, found, err := journalLookup(ctx, s.w.journalGet, dir.from, refusedID); found || err != nil {
					t.Fatalf("refused id journaled: found=%v err=%v", found, err)
				}
				if got := dbTotals(t, s, dir.to); got != (unreadTotals{tc.fit, int64(tc.fit) * size, tc.fit, int64(tc.fit) * size}) {
					t.Fatalf("recipient's unread inbox after the refusal: %+v", got)
				}
				all, _ := s.ListItems(ctx, dir.from, true)
				if len(all) != tc.fit {
					t.Fatalf("sender holds %d items, want its %d statuses", len(all), tc.fit)
				}
				// Reading one item makes room for one message.
				items, err := s.ListItems(ctx, dir.to, false)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.ReadItem(ctx, dir.to, items[0].ID, false); err != nil {
					t.Fatal(err)
				}
				if _, err := deliver(s, dir.from, dir.to, refusedID); err != nil {
					t.Fatalf("after a read: %v", err)
				}
				if _, err := deliver(s, dir.from, dir.to, "m-next"); !errors.As(err, &full) {
					t.Fatalf("past the bound again: %v", err)
				}
			})
		}
	}
}

// TestQuotaCountsFromDatabase: a store opened on a full inbox, with the
// unread cache cold or loaded, refuses as the store that filled it did.
func TestQuotaCountsFromDatabase(t *testing.T) {
	s, path := openTestStore(t)
	q := Quota{MaxUnreadItems: 3}
	s.SetQuota(q)
	for i := range 3 {
		if _, err := deliver(s, "o", "c", fmt.Sprintf("m-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := deliver(s, "o", "c", "m-x")
	var before *InboxFullError
	if !errors.As(err, &before) {
		t.Fatalf("past the bound: %v", err)
	}
	for _, warm := range []bool{false, true} {
		fresh, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		fresh.SetQuota(q)
		if warm {
			fresh.ListItems(context.Background(), "c", false)
		}
		_, err = deliver(fresh, "o", "c", "m-y")
		var full *InboxFullError
		if !errors.As(err, &full) || *full != *before {
			t.Errorf("reopened store (cache loaded: %v): %v, want %+v", warm, err, *before)
		}
		fresh.Close()
	}
}

// TestQuotaNeverRefusesStatuses: statuses go into a full inbox, past its
// bound; the next message to it reports the true count, also when the
// bounded count of a reopened store has to count again.
func TestQuotaNeverRefusesStatuses(t *testing.T) {
	s, path := openTestStore(t)
	q := Quota{MaxUnreadItems: 3}
	s.SetQuota(q)
	ctx := context.Background()
	for i := range 3 {
		if _, err := deliver(s, "o", "c", fmt.Sprintf("m-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// c's inbox is full. Its own send still gets its first status, and
	// later statuses still arrive unread.
	if st, err := deliver(s, "c", "o", "from-c"); err != nil || !st.Fresh {
		t.Fatalf("send from the owner of a full inbox: %+v %v", st, err)
	}
	for i := range 2 {
		if _, err := s.RecordStatus(ctx, "c", "from-c", "message", wire.StateDone, fmt.Sprint("later ", i), false); err != nil {
			t.Fatalf("later status into a full inbox: %v", err)
		}
	}
	if _, err := s.RecordStatus(ctx, "c", "other", "spawn", wire.StateRefused, "no", true); err != nil {
		t.Fatalf("first status into a full inbox: %v", err)
	}
	want := dbTotals(t, s, "c")
	if want.items != 5 {
		t.Fatalf("c holds %d unread items, want 5", want.items)
	}
	for _, st := range []*Store{s, reopen(t, path, q)} {
		_, err := deliver(st, "o", "c", "m-over")
		var full *InboxFullError
		if !errors.As(err, &full) || full.Items != want.items || full.Bytes != want.bytes {
			t.Errorf("message to an inbox past its bound: %v, want %+v", err, want)
		}
	}
}

func reopen(t *testing.T, path string, q Quota) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.SetQuota(q)
	return s
}

// TestQuotaZeroChecksNothing: the zero Quota (a store the broker did not
// configure) delivers without counting.
func TestQuotaZeroChecksNothing(t *testing.T) {
	s, _ := openTestStore(t)
	for i := range 5 {
		if _, err := deliver(s, "o", "c", fmt.Sprintf("m-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.totals) != 0 {
		t.Fatalf("totals counted without a quota: %v", s.totals)
	}
}

// TestQuotaAfterDeleteSandbox: a sandbox created again under a deleted
// one's name starts with an empty inbox, in the counts too.
func TestQuotaAfterDeleteSandbox(t *testing.T) {
	s, _ := openTestStore(t)
	s.SetQuota(Quota{MaxUnreadItems: 2})
	ctx := context.Background()
	kid := Sandbox{Name: "c", UUID: "u3", Role: wire.RoleChild, Parent: "o", Branch: "c", Repo: "/r", State: "running"}
	for round := range 2 {
		for i := range 2 {
			if _, err := deliver(s, "o", "c", fmt.Sprintf("m-%d-%d", round, i)); err != nil {
				t.Fatalf("round %d, message %d: %v", round, i, err)
			}
		}
		if err := s.DeleteSandbox(ctx, "c"); err != nil {
			t.Fatal(err)
		}
		kid.UUID = fmt.Sprint("u-again-", round)
		if err := s.CreateSandbox(ctx, kid); err != nil {
			t.Fatal(err)
		}
	}
}

// TestQuotaUnmeteredDelivery: an unmetered delivery (an update's message)
// goes into a full inbox, with its ref and merged head; a metered one to
// the same inbox is refused.
func TestQuotaUnmeteredDelivery(t *testing.T) {
	s, _ := openTestStore(t)
	s.SetQuota(Quota{MaxUnreadItems: 1})
	ctx := context.Background()
	if _, err := deliver(s, "o", "c", "m-1"); err != nil {
		t.Fatal(err)
	}
	var full *InboxFullError
	if _, err := deliver(s, "o", "c", "m-2"); !errors.As(err, &full) {
		t.Fatalf("metered message past the bound: %v", err)
	}
	imp := &ImportResult{Ref: "refs/jailbee/from/o/main", SHA: "1111111111111111111111111111111111111111", MergedHead: "2222222222222222222222222222222222222222"}
	if _, err := s.DeliverMessage(ctx, Delivery{From: "o", To: "c", ManifestID: "up-1", Kind: "update", Body: "b", Import: imp, Unmetered: true}); err != nil {
		t.Fatalf("unmetered message past the bound: %v", err)
	}
	items, err := s.ListItems(ctx, "c", false)
	if err != nil || len(items) != 2 {
		t.Fatalf("recipient's inbox: %d items, %v; want 2", len(items), err)
	}
	var m wire.MessageItem
	if err := json.Unmarshal(items[1].Doc, &m); err != nil {
		t.Fatal(err)
	}
	if m.Kind != "update" || m.ImportedRef != imp.Ref || m.ImportedSHA != imp.SHA || m.MergedHead != imp.MergedHead || m.OriginID != "up-1" {
		t.Fatalf("delivered %+v", m)
	}
}

// TestChildShare: a child with a sibling may fill at most 1/ChildShare of
// its orchestrator's inbox quota (items, or bytes) with unread messages:
// at its share it is delivered, one past it refused naming the child's
// own counts, and its sibling still gets in to the inbox's own bound. An
// only child, and the orchestrator's messages to a child, are held by the
// inbox bound alone; a child with nothing unread there always gets in.
func TestChildShare(t *testing.T) {
	size := msgLen(t, "c", "m-001", "body of m-001") // ids of one length: messages of one size
	for _, tc := range []struct {
		name      string
		quota     Quota
		share     int // messages of one child within its share
		itemsFull bool
	}{
		{"items", Quota{MaxUnreadItems: 10}, 5, true},
		{"items, odd", Quota{MaxUnreadItems: 11}, 5, true},
		{"bytes", Quota{MaxUnreadItems: 100, MaxUnreadBytes: 8 * size}, 4, false},
		{"bytes one short", Quota{MaxUnreadItems: 100, MaxUnreadBytes: 8*size - 1}, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openTestStore(t)
			s.SetQuota(tc.quota)
			ctx := context.Background()
			n := 0
			send := func(from, to string) error {
				n++
				_, err := deliver(s, from, to, fmt.Sprintf("m-%03d", n))
				return err
			}
			// An only child may go past the share.
			for i := range tc.share + 1 {
				if err := send("c", "o"); err != nil {
					t.Fatalf("only child, message %d: %v", i+1, err)
				}
			}
			items, _ := s.ListItems(ctx, "o", false)
			if err := s.Ack(ctx, "o", items[0].ID); err != nil {
				t.Fatal(err)
			}
			if err := s.CreateSandbox(ctx, Sandbox{Name: "d", UUID: "u-d", Role: wire.RoleChild, Parent: "o",
				Branch: "d", Repo: "/r", State: "running"}); err != nil {
				t.Fatal(err)
			}
			err := send("c", "o")
			var full *InboxFullError
			if !errors.As(err, &full) {
				t.Fatalf("message past the share, with a sibling: %v", err)
			}
			want := InboxFullError{Sandbox: "o", Sender: "c", Items: tc.share, Bytes: int64(tc.share) * size, MessageBytes: size, Quota: tc.quota.childShare()}
			if *full != want || full.ItemsFull() != tc.itemsFull || full.NeverFits() {
				t.Fatalf("refusal %+v (items full %v), want %+v (items full %v)", *full, full.ItemsFull(), want, tc.itemsFull)
			}
			if got := dbTotals(t, s, "o"); got.msgs != tc.share {
				t.Fatalf("the refused message was stored: o holds %d messages", got.msgs)
			}
			// The sibling fills its own share.
			for i := range tc.share {
				if err := send("d", "o"); err != nil {
					t.Fatalf("the sibling's message %d: %v", i+1, err)
				}
			}
			// The orchestrator's messages to a child are not shared.
			for i := range tc.share + 1 {
				if err := send("o", "c"); err != nil {
					t.Fatalf("to the child, message %d: %v", i+1, err)
				}
			}
			// Once the orchestrator reads its inbox, the child gets in
			// again, even with a message larger than its share.
			items, _ = s.ListItems(ctx, "o", false)
			for _, it := range items {
				if err := s.Ack(ctx, "o", it.ID); err != nil {
					t.Fatal(err)
				}
			}
			big := strings.Repeat("x", int(tc.quota.childShare().MaxUnreadBytes))
			if tc.quota.MaxUnreadBytes == 0 {
				big = "small"
			}
			if _, err := s.DeliverMessage(ctx, Delivery{From: "c", To: "o", ManifestID: "big", Kind: "note", Body: big}); err != nil {
				t.Fatalf("a child with nothing unread: %v", err)
			}
		})
	}
}

// TestListHistoryBounded: a history is read up to MaxHistoryBytes of
// documents, and the one item past it (what a list's reply needs to say
// there is more); never the rest, however long the history grew.
func TestListHistoryBounded(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	const docLen = MaxHistoryBytes / 16
	body := strings.Repeat("x", docLen-int(msgLen(t, "c", "m-00", "")))
	for i := range 18 {
		if _, err := s.DeliverMessage(ctx, Delivery{From: "c", To: "o", ManifestID: fmt.Sprintf("m-%02d", i), Kind: "note", Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := s.ListItems(ctx, "o", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 17 || len(hist[0].Doc) != docLen {
		t.Fatalf("read %d items of %d bytes; want the 16 that make %d bytes and one more", len(hist), len(hist[0].Doc), MaxHistoryBytes)
	}
}

// TestListHistoryPlan: the history is read from the index and then by
// seq, never sorted whole. (Ordered by seq, the sandbox's index gives its
// rows in id order: a query reading them sorts the whole history,
// documents and all, before its first row; the read bound would then
// bound only what Go keeps.)
func TestListHistoryPlan(t *testing.T) {
	s, _ := openTestStore(t)
	for _, tc := range []struct {
		query, want, never string
		args               []any
	}{
		{historySeqsSQL, "COVERING INDEX", "", []any{"o", 10}},
		{itemsBySeqSQL, "INTEGER PRIMARY KEY", "TEMP B-TREE", []any{"[1,2]", "o"}},
	} {
		all := strings.Join(queryPlan(t, s, tc.query, tc.args...), "; ")
		if !strings.Contains(all, tc.want) || tc.never != "" && strings.Contains(all, tc.never) {
			t.Errorf("%s:\nplan %s, want %s and no %q", tc.query, all, tc.want, tc.never)
		}
	}
}

// queryPlan is the lines of SQLite's EXPLAIN QUERY PLAN for query.
func queryPlan(t *testing.T, s *Store, query string, args ...any) []string {
	t.Helper()
	rows, err := s.db.Query("EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan
}

// TestListHistoryChunks: a history read in several chunks comes back
// whole and in order, and never holds an item of another sandbox.
func TestListHistoryChunks(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	const n = 2*historyChunk + 1
	for i := range n {
		if _, err := deliver(s, "c", "o", fmt.Sprintf("m-%d", i)); err != nil {
			t.Fatal(err)
		}
		if _, err := deliver(s, "o", "c", fmt.Sprintf("r-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := s.ListItems(ctx, "o", true)
	if err != nil {
		t.Fatal(err)
	}
	// o holds c's messages and the statuses of its own sends.
	if len(hist) != 2*n {
		t.Fatalf("o's history: %d items, want %d", len(hist), 2*n)
	}
	for i, it := range hist {
		if i > 0 && it.Seq <= hist[i-1].Seq {
			t.Fatalf("item %d (seq %d) after seq %d", i, it.Seq, hist[i-1].Seq)
		}
		if it.Type == wire.ItemMessage && !strings.Contains(string(it.Doc), `"from":"c"`) {
			t.Fatalf("o's history holds %s", it.Doc)
		}
	}
}

// TestMinItemDoc: the smallest document the store writes is at least
// minItemDoc bytes, which maxHistoryItems relies on.
func TestMinItemDoc(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	if _, err := s.DeliverMessage(ctx, Delivery{From: "o", To: "c", ManifestID: "m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RecordStatus(ctx, "c", "", "message", "", "", true); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []string{"o", "c"} {
		items, err := s.ListItems(ctx, sb, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if len(it.Doc) < minItemDoc {
				t.Errorf("%s: a document of %d bytes, under minItemDoc (%d): %s", sb, len(it.Doc), minItemDoc, it.Doc)
			}
		}
	}
}
