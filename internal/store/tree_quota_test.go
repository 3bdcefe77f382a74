package store

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"agentbox/internal/wire"
)

// TestTreeQuota: messages from an orchestrator to its failed children
// fill the tree budget, each child within its own inbox quota: the
// message that brings the tree to a bound is delivered, the next one
// refused naming the inboxes that hold the tree's items; messages to the
// orchestrator are not held by the tree; reading frees room.
// The orchestrator's own unread items count in the tree.
func TestTreeQuota(t *testing.T) {
	size := msgLen(t, "o", "m-1", "body of m-1")
	for _, tc := range []struct {
		name  string
		quota Quota
	}{
		{"items", Quota{MaxUnreadItems: 3, TreeMaxUnreadItems: 5}},
		{"bytes", Quota{MaxUnreadItems: 3, TreeMaxUnreadBytes: 5 * size}},
		{"tree bounds only", Quota{TreeMaxUnreadItems: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openTestStore(t)
			s.SetQuota(tc.quota)
			ctx := context.Background()
			if err := s.CreateSandbox(ctx, Sandbox{Name: "d", UUID: "u-d", Role: wire.RoleChild, Parent: "o",
				Branch: "d", Repo: "/r", State: "failed"}); err != nil {
				t.Fatal(err)
			}
			n := 0
			send := func(to string) error {
				n++
				_, err := deliver(s, "o", to, fmt.Sprintf("m-%d", n))
				return err
			}
			for i, to := range []string{"c", "c", "c", "d", "d"} {
				if err := send(to); err != nil {
					t.Fatalf("message %d (to %s), within the tree budget: %v", i+1, to, err)
				}
			}
			err := send("d")
			var full *TreeFullError
			if !errors.As(err, &full) {
				t.Fatalf("message past the tree budget: %v, want a TreeFullError", err)
			}
			want := []Holder{{"c", 3, 3 * size}, {"d", 2, 2 * size}}
			if full.Root != "o" || full.Items != 5 || full.Bytes != 5*size || fmt.Sprint(full.Holders) != fmt.Sprint(want) {
				t.Fatalf("refusal %+v, want root o, 5 items, %d bytes, holders %v", full, 5*size, want)
			}
			if got := dbTotals(t, s, "d"); got.items != 2 {
				t.Errorf("the refused message was stored: d holds %d unread items", got.items)
			}
			if _, err := deliver(s, "c", "o", "to-o"); err != nil {
				t.Errorf("a child's message to its orchestrator, tree full: %v", err)
			}
			for _, sb := range []string{"o", "c"} { // the tree holds o's unread message too
				items, err := s.ListItems(ctx, sb, false)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Ack(ctx, sb, items[0].ID); err != nil {
					t.Fatal(err)
				}
			}
			if err := send("d"); err != nil {
				t.Errorf("message once c read one: %v", err)
			}
		})
	}
}

// TestTreeQuotaCountsMessagesOnly: unread statuses, however many (c holds
// more than its own item bound, so its count is taken in full), count in
// no tree bound nor holder; the tree's messages still fill it to the
// bound and no further. A reopened store, its cache cold or loaded,
// counts the same from the file.
func TestTreeQuotaCountsMessagesOnly(t *testing.T) {
	s, path := openTestStore(t)
	q := Quota{MaxUnreadItems: 5, TreeMaxUnreadItems: 3}
	s.SetQuota(q)
	ctx := context.Background()
	if err := s.CreateSandbox(ctx, Sandbox{Name: "d", UUID: "u-d", Role: wire.RoleChild, Parent: "o",
		Branch: "d", Repo: "/r", State: "running"}); err != nil {
		t.Fatal(err)
	}
	for sb, n := range map[string]int{"c": 7, "o": 2} {
		for i := range n {
			if _, err := s.RecordStatus(ctx, sb, fmt.Sprintf("x-%d", i), "spawn", wire.StateRefused, "no", false); err != nil {
				t.Fatal(err)
			}
		}
	}
	size := msgLen(t, "o", "m-1", "body of m-1")
	for i := range 3 {
		if _, err := deliver(s, "o", "d", fmt.Sprintf("m-%d", i+1)); err != nil {
			t.Fatalf("message %d within the tree bound: %v", i+1, err)
		}
	}
	want := TreeFullError{Root: "o", Items: 3, Bytes: 3 * size, MessageBytes: size, Quota: q, Holders: []Holder{{"d", 3, 3 * size}}}
	cold, warm := reopen(t, path, q), reopen(t, path, q)
	for _, sb := range []string{"c", "o", "d"} {
		if _, err := warm.ListItems(ctx, sb, false); err != nil { // counted by the cache's loader
			t.Fatal(err)
		}
	}
	for _, st := range []*Store{s, cold, warm} {
		_, err := deliver(st, "o", "d", "m-9")
		var full *TreeFullError
		if !errors.As(err, &full) || fmt.Sprint(*full) != fmt.Sprint(want) {
			t.Fatalf("past the tree bound: %v, want %+v", err, want)
		}
		if got, want := st.totals["c"], dbTotals(t, st, "c"); got != want || want.items != 7 || want.msgs != 0 {
			t.Fatalf("c's unread: counted %+v, the database %+v", got, want)
		}
	}
}
