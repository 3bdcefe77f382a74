package broker

import (
	"context"
	"testing"
	"time"

	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// TestSweepStorageRetention: a read message is kept until it is older
// than the retention (7 days by default), then the sweep removes it; an
// unread one stays.
func TestSweepStorageRetention(t *testing.T) {
	b, err := Open(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	for _, sb := range []store.Sandbox{
		{Name: "lead", UUID: "u-lead", Role: wire.RoleOrchestrator, Branch: "main", Repo: "/r", State: store.StateRunning},
		{Name: "kid", UUID: "u-kid", Role: wire.RoleChild, Parent: "lead", Branch: "kid", Repo: "/r", State: store.StateFailed},
	} {
		if err := b.store.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"m-read", "m-unread"} {
		if _, err := b.store.DeliverMessage(ctx, store.Delivery{From: "kid", To: "lead", ManifestID: id, Kind: "note", Body: id}); err != nil {
			t.Fatal(err)
		}
	}
	unread, err := b.store.ListItems(ctx, "lead", false)
	if err != nil || len(unread) != 2 {
		t.Fatalf("lead's inbox: %v %v", unread, err)
	}
	if err := b.store.Ack(ctx, "lead", unread[0].ID); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		all, err := b.store.ListItems(ctx, "lead", true)
		if err != nil {
			t.Fatal(err)
		}
		return len(all)
	}
	b.sweepStorage(time.Now().Add(DefaultReadRetention - time.Hour))
	if n := count(); n != 2 {
		t.Fatalf("within the retention lead keeps %d items, want 2", n)
	}
	b.sweepStorage(time.Now().Add(DefaultReadRetention + time.Hour))
	left, err := b.store.ListItems(ctx, "lead", true)
	if err != nil || len(left) != 1 || left[0].ID != unread[1].ID {
		t.Fatalf("past the retention lead keeps %+v (%v), want only its unread message", left, err)
	}
}
