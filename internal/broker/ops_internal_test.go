package broker

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// TestListResultMatchesWireType: list's hand-written result is byte for
// byte what encoding wire.ListResult gives for the same items.
func TestListResultMatchesWireType(t *testing.T) {
	doc := func(id, body string) store.Item {
		return store.Item{ID: id, Doc: json.RawMessage(fmt.Sprintf(`{"version":1,"id":%q,"type":"message","body":%q}`, id, body))}
	}
	read := func(it store.Item) store.Item { it.Read = true; return it }
	big := strings.Repeat("x", maxResultBytes/3)
	for _, tc := range []struct {
		name  string
		items []store.Item
		kept  int
	}{
		{"empty", nil, 0},
		{"unread", []store.Item{doc("h-1", "a"), doc("h-2", "b")}, 2},
		{"read and unread", []store.Item{read(doc("h-1", "a")), doc("h-2", "b"), read(doc("h-3", "c"))}, 3},
		{"more", []store.Item{read(doc("h-1", big)), doc("h-2", big), doc("h-3", big), doc("h-4", "d")}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := wire.ListResult{Items: []json.RawMessage{}, More: tc.kept < len(tc.items)}
			for _, it := range tc.items[:tc.kept] {
				want.Items = append(want.Items, it.Doc)
				if it.Read {
					want.ReadIDs = append(want.ReadIDs, it.ID)
				}
			}
			wantJSON, err := json.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			if got := listResult(tc.items); string(got) != string(wantJSON) {
				t.Errorf("listResult = %.300s\nwant        %.300s", got, wantJSON)
			}
		})
	}
}

// TestNextFilterDecodesEachItemOnce: a parked next with a kind filter
// decodes each unread document once, not on every wake (each change to
// the inbox); it remembers only the items still unread, and still finds a
// matching item that comes later.
func TestNextFilterDecodesEachItemOnce(t *testing.T) {
	msg := func(seq int64, kind string) store.Item {
		return store.Item{Seq: seq, ID: fmt.Sprintf("h-%d", seq), Type: wire.ItemMessage,
			Doc: json.RawMessage(fmt.Sprintf(`{"version":1,"id":"h-%d","type":"message","kind":%q}`, seq, kind))}
	}
	first := func(scan func(store.Item) bool, items []store.Item) (store.Item, bool) {
		for _, it := range items {
			if scan(it) {
				return it, true
			}
		}
		return store.Item{}, false
	}
	var inbox []store.Item
	for seq := range int64(100) {
		inbox = append(inbox, msg(seq, "note"))
	}
	f := newNextFilter(&wire.NextArgs{MsgKinds: []string{"wanted"}})
	if _, found := first(f.scan(), inbox); found || f.decodes != 100 {
		t.Fatalf("first scan: found %v, %d decodes; want none found, 100", found, f.decodes)
	}
	// A wake: one item read, one more that does not match.
	inbox = append(inbox[1:], msg(100, "note"))
	if _, found := first(f.scan(), inbox); found || f.decodes != 101 {
		t.Fatalf("second scan: found %v, %d decodes in all; want none found, 101", found, f.decodes)
	}
	if len(f.rejected) != 100 || f.rejected[0] {
		t.Fatalf("remembered %d items (seq 0: %v); want the 100 still unread", len(f.rejected), f.rejected[0])
	}
	inbox = append(inbox, msg(101, "wanted"))
	if it, found := first(f.scan(), inbox); !found || it.Seq != 101 || f.decodes != 102 {
		t.Fatalf("third scan: %+v %v, %d decodes in all; want seq 101 found, 102", it, found, f.decodes)
	}
	// Without a filter nothing is decoded or remembered.
	all := newNextFilter(&wire.NextArgs{})
	if it, found := first(all.scan(), inbox); !found || it.Seq != 1 || all.decodes != 0 || all.rejected != nil {
		t.Fatalf("no filter: %+v %v, %d decodes", it, found, all.decodes)
	}
}
