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
