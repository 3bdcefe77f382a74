package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"agentbox/internal/wire"
)

func openTestStore(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "broker.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	for _, sb := range []Sandbox{
		{Name: "o", UUID: "u1", Role: wire.RoleOrchestrator, Branch: "main", Repo: "/r", State: "running"},
		{Name: "c", UUID: "u2", Role: wire.RoleChild, Parent: "o", Branch: "c", Repo: "/r", State: "running"},
	} {
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	return s, path
}

func TestHostIDCollisionRetries(t *testing.T) {
	s, _ := openTestStore(t)
	// Ids are unique per inbox. The first send gives the message in c and
	// the status in o the same id; the second send's message collides with
	// it twice in c before a free id comes.
	ids := []string{"h-00000001", "h-00000001", "h-00000001", "h-00000001", "h-00000002"}
	hostID = func() string {
		if len(ids) == 0 {
			return newHostID()
		}
		id := ids[0]
		ids = ids[1:]
		return id
	}
	defer func() { hostID = newHostID }()
	ctx := context.Background()
	for _, m := range []string{"a", "b"} {
		if _, err := s.DeliverMessage(ctx, Delivery{From: "o", To: "c", ManifestID: m, Kind: "note", Body: m}); err != nil {
			t.Fatalf("send %s: %v", m, err)
		}
	}
	items, err := s.ListItems(ctx, "c", false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range items {
		got = append(got, it.ID)
	}
	if !slices.Equal(got, []string{"h-00000001", "h-00000002"}) {
		t.Fatalf("child's item ids %v: a colliding id was not retried", got)
	}
}

// TestUnreadCacheMatchesDatabase runs random sends, reads, acks and
// put-backs (of messages and of statuses), and compares the cached unread
// inboxes, and their totals by type, with what a fresh store reads from
// the file.
func TestUnreadCacheMatchesDatabase(t *testing.T) {
	s, path := openTestStore(t)
	s.SetQuota(Quota{MaxUnreadItems: 1000}) // counts c's inbox; never refuses here
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	var read []string // ids read in c, candidates for MarkUnread
	for i := range 300 {
		switch op := rng.IntN(12); {
		case op >= 10:
			// c's own send: its status in c, stored read.
			sent, err := s.DeliverMessage(ctx, Delivery{From: "c", To: "o", ManifestID: fmt.Sprintf("c-%d", i), Kind: "note", Body: "y"})
			if err != nil {
				t.Fatal(err)
			}
			read = append(read, sent.Status.ID)
		case op < 5:
			if _, err := s.DeliverMessage(ctx, Delivery{From: "o", To: "c", ManifestID: fmt.Sprintf("m-%d", i), Kind: "note", Body: "x"}); err != nil {
				t.Fatal(err)
			}
		case op < 8:
			items, _ := s.ListItems(ctx, "c", false)
			if len(items) == 0 {
				continue
			}
			it := items[rng.IntN(len(items))]
			if _, err := s.ReadItem(ctx, "c", it.ID, op == 7); err != nil {
				t.Fatal(err)
			}
			if op != 7 {
				read = append(read, it.ID)
			}
		default:
			if len(read) == 0 {
				continue
			}
			if err := s.MarkUnread(ctx, "c", read[0]); err != nil {
				t.Fatal(err)
			}
			read = read[1:]
		}
	}
	// The unread totals the quota reads followed every change too.
	if got, want := s.totals["c"], dbTotals(t, s, "c"); got != want || want.msgs == want.items || want.msgs == 0 {
		t.Fatalf("c: cached totals %+v, the database %+v (want messages and statuses)", got, want)
	}
	fresh, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	for _, sb := range []string{"o", "c"} {
		cached, _ := s.ListItems(ctx, sb, false)
		stored, err := fresh.ListItems(ctx, sb, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(cached, stored, func(a, b Item) bool { return a.ID == b.ID && a.Seq == b.Seq && string(a.Doc) == string(b.Doc) }) {
			t.Fatalf("%s: cache has %d unread, the database %d", sb, len(cached), len(stored))
		}
	}
}

func TestJournal(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	if _, found, err := journalLookup(ctx, s.w.journalGet, "o", "x"); found || err != nil {
		t.Fatalf("unknown id: found=%v err=%v", found, err)
	}
	first, err := s.RecordStatus(ctx, "o", "x", "spawn", wire.StateQueued, "queued at position 1", true)
	if err != nil || !first.Fresh || !first.Status.Read {
		t.Fatalf("first status: %+v %v", first, err)
	}
	// A later status of the same manifest is unread news.
	later, err := s.RecordStatus(ctx, "o", "x", "spawn", wire.StateDone, "ready", false)
	if err != nil || later.Status.Read {
		t.Fatalf("later status: %+v %v", later, err)
	}
	latest, found, err := journalLookup(ctx, s.w.journalGet, "o", "x")
	if err != nil || !found || latest.ID != later.Status.ID {
		t.Fatalf("latest = %+v", latest)
	}
	// A second "first" status returns the recorded one and writes nothing.
	again, err := s.RecordStatus(ctx, "o", "x", "spawn", wire.StateRefused, "no", true)
	if err != nil || again.Fresh || again.Status.ID != later.Status.ID {
		t.Fatalf("resent first status: %+v %v", again, err)
	}
}

// TestInboxQueriesUseTheirIndexes: what a send (the quota's counts), an
// inbox load, the idle watch (a child's last message) and a publish (a
// delivered import) look for in one inbox is found through an index that
// holds only such items. Through items_by_sandbox they walked the
// inbox's whole read history, which senders make as large as they like
// (kept for days): a send's quota check did that under the store's write
// lock, stalling every sandbox's writes for seconds per gigabyte.
func TestInboxQueriesUseTheirIndexes(t *testing.T) {
	s, _ := openTestStore(t)
	for _, tt := range []struct {
		name, query, index string
		args               []any
	}{
		{"unread items", unreadItemsSQL, "items_unread", []any{"o"}},
		{"unread totals", unreadTotalsSQL, "items_unread", []any{"o", 501}},
		{"unread from a sender", unreadFromSQL, "items_unread", []any{"o", "c"}},
		{"last child message", lastChildMessageSQL, "items_child_messages", []any{"o", "c"}},
		{"delivered import", deliveredImportSQL, "items_imports", []any{"o", "refs/jailbee/from/c/c", "0123"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			plan := queryPlan(t, s, tt.query, tt.args...)
			found := slices.ContainsFunc(plan, func(d string) bool {
				return strings.HasPrefix(d, "SEARCH items USING INDEX "+tt.index+" ") ||
					strings.HasPrefix(d, "SEARCH items USING COVERING INDEX "+tt.index+" ")
			})
			if !found {
				t.Fatalf("plan %q, want a search through %s", plan, tt.index)
			}
		})
	}
}
