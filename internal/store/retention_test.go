package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"agentbox/internal/wire"
)

// TestRemoveReadBefore: read items created before the cutoff are removed,
// across batches (at SweepBatch and one past it); unread items and the
// senders' journaled statuses stay, so a resend still gets its status.
func TestRemoveReadBefore(t *testing.T) {
	for _, n := range []int{SweepBatch, SweepBatch + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s, _ := openTestStore(t)
			ctx := context.Background()
			for i := range n + 1 {
				if _, err := deliver(s, "o", "c", fmt.Sprintf("m-%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			items, err := s.ListItems(ctx, "c", false)
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range items[:n] {
				if err := s.Ack(ctx, "c", it.ID); err != nil {
					t.Fatal(err)
				}
			}
			if got, err := s.RemoveReadBefore(ctx, time.Now().Add(-time.Hour)); err != nil || got != 0 {
				t.Fatalf("items read within the retention: removed %d (%v), want 0", got, err)
			}
			got, err := s.RemoveReadBefore(ctx, time.Now().Add(time.Hour))
			if err != nil || got != int64(n) {
				t.Fatalf("removed %d (%v), want the %d read messages", got, err, n)
			}
			left, err := s.ListItems(ctx, "c", true)
			if err != nil || len(left) != 1 || left[0].Read || left[0].ID != items[n].ID {
				t.Fatalf("c keeps %+v (%v), want only its unread message", left, err)
			}
			sent, err := deliver(s, "o", "c", "m-0")
			if err != nil || sent.Fresh || !strings.Contains(string(sent.Status.Doc), "delivered to c") {
				t.Fatalf("resend of m-0: %+v %v, want its journaled status back", sent, err)
			}
		})
	}
}

// dbFileBytes is the size of broker.db with its WAL.
func dbFileBytes(t *testing.T, path string) int64 {
	t.Helper()
	var n int64
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// TestShrinkAfterDestroy: children's inboxes filled with 24 MiB, then
// the children deleted: their items go with them, and Shrink brings
// broker.db (with its WAL) back under twice its size before.
func TestShrinkAfterDestroy(t *testing.T) {
	s, path := openTestStore(t)
	ctx := context.Background()
	if err := s.Shrink(ctx); err != nil {
		t.Fatal(err)
	}
	empty := dbFileBytes(t, path)
	body := strings.Repeat("x", 60<<10)
	const children, messages = 4, 100
	for c := range children {
		name := fmt.Sprintf("k%d", c)
		if err := s.CreateSandbox(ctx, Sandbox{Name: name, UUID: "u-" + name, Role: wire.RoleChild, Parent: "o",
			Branch: name, Repo: "/r", State: "failed"}); err != nil {
			t.Fatal(err)
		}
		for i := range messages {
			if _, err := s.DeliverMessage(ctx, Delivery{From: "o", To: name, ManifestID: fmt.Sprintf("m-%s-%d", name, i),
				Kind: "note", Body: body}); err != nil {
				t.Fatal(err)
			}
		}
	}
	full := dbFileBytes(t, path)
	if full < children*messages*int64(len(body)) {
		t.Fatalf("broker.db is %d bytes after %d messages of %d", full, children*messages, len(body))
	}
	for c := range children {
		if err := s.DeleteSandbox(ctx, fmt.Sprintf("k%d", c)); err != nil {
			t.Fatal(err)
		}
	}
	var left int
	if err := s.db.QueryRow(`SELECT count(*) FROM items WHERE sandbox LIKE 'k%'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d items of deleted children left (%v)", left, err)
	}
	if err := s.Shrink(ctx); err != nil {
		t.Fatal(err)
	}
	if got := dbFileBytes(t, path); got >= 2*empty {
		t.Fatalf("broker.db is %d bytes after the children were deleted (%d at its fullest), want under 2x its empty %d", got, full, empty)
	}
}

// TestOpenMakesV5Incremental: a version 5 broker.db made without
// auto_vacuum is vacuumed into INCREMENTAL mode at open, its rows kept.
func TestOpenMakesV5Incremental(t *testing.T) {
	path := filepath.Join(t.TempDir(), "broker.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{schema, `INSERT INTO sandboxes (name, uuid, role, branch, repo, state, created_at)
		VALUES ('o', 'u-o', 'orchestrator', 'main', '/r', 'running', 1)`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	var mode int
	if err := db.QueryRow("PRAGMA auto_vacuum").Scan(&mode); err != nil || mode != 0 {
		t.Fatalf("the v5 database's auto_vacuum is %d (%v), want 0 (none)", mode, err)
	}
	db.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.db.QueryRow("PRAGMA auto_vacuum").Scan(&mode); err != nil || mode != autoVacuumIncremental {
		t.Fatalf("auto_vacuum is %d (%v) after open, want %d (incremental)", mode, err, autoVacuumIncremental)
	}
	if v := userVersion(t, s); v != schemaVersion {
		t.Errorf("user_version %d, want %d", v, schemaVersion)
	}
	if _, err := s.Sandbox(context.Background(), "o"); err != nil {
		t.Errorf("sandbox o after the vacuum: %v", err)
	}
}

// TestShrinkKeepsFewFreePages: below shrinkMinFreePages free pages,
// Shrink leaves them for the next writes to reuse.
func TestShrinkKeepsFewFreePages(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	for i := range 10 { // about 150 pages of 4 KiB
		if _, err := s.DeliverMessage(ctx, Delivery{From: "o", To: "c", ManifestID: fmt.Sprintf("m-%d", i), Kind: "note", Body: strings.Repeat("x", 60<<10)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteSandbox(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	free := func() int64 {
		var n int64
		if err := s.db.QueryRow("PRAGMA freelist_count").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := free()
	if before == 0 || before >= shrinkMinFreePages {
		t.Fatalf("%d free pages, want some below %d", before, shrinkMinFreePages)
	}
	if err := s.Shrink(ctx); err != nil {
		t.Fatal(err)
	}
	if after := free(); after != before {
		t.Errorf("Shrink freed pages below its threshold: %d free, was %d", after, before)
	}
}

// TestPruneJournalsCopiesTheInboxOnce: a sandbox whose client hangs up
// after each refused send gets each status back unread, so its inbox holds
// thousands when the journal is pruned. The prune removes them in batches
// of SweepBatch under the write lock; the unread cache is copied once per
// batch, not once per item (which cost the square of the inbox's length:
// 351 MiB for these 3,024, every writer and reader waiting).
func TestPruneJournalsCopiesTheInboxOnce(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	const n = MaxJournaled + 4*SweepBatch
	for i := range n {
		sent, err := s.RecordStatus(ctx, "c", fmt.Sprintf("m-%d", i), "message", wire.StateRefused, "no", true)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.MarkUnread(ctx, "c", sent.Status.ID); err != nil {
			t.Fatal(err)
		}
	}
	if items, err := s.ListItems(ctx, "c", false); err != nil || len(items) != n {
		t.Fatalf("c's unread inbox: %d items, %v; want %d", len(items), err, n)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if got, err := s.PruneJournals(ctx); err != nil || got != n-MaxJournaled {
		t.Fatalf("pruned %d (%v), want %d", got, err, n-MaxJournaled)
	}
	runtime.ReadMemStats(&after)
	// A copy of the inbox per batch is 4 x 3,024 items of 112 bytes,
	// 1.3 MiB; the statements allocate the rest (4.3 MiB in all here).
	const bound = 32 << 20
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("the prune of %d unread statuses allocated %.1f MiB", n-MaxJournaled, float64(alloc)/(1<<20))
	if alloc > bound {
		t.Errorf("the prune allocated %d MiB, more than %d MiB", alloc>>20, bound>>20)
	}
	items, err := s.ListItems(ctx, "c", false)
	if err != nil || len(items) != MaxJournaled {
		t.Fatalf("c's unread inbox after the prune: %d items, %v; want %d", len(items), err, MaxJournaled)
	}
	for i, it := range items {
		if want := fmt.Sprintf("m-%d", n-MaxJournaled+i); it.Ref != want {
			t.Fatalf("item %d: ref %s, want %s (the newest are kept, in order)", i, it.Ref, want)
		}
	}
}
