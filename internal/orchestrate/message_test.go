package orchestrate

import (
	"testing"

	"agentbox/internal/store"
)

func TestFormatSize(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1 KiB"},
		{1536, "1.5 KiB"},
		{1024*1024 - 1, "1023.9 KiB"}, // rounded down, never up to the next unit
		{2202009, "2 MiB"},            // 2.0999 MiB
		{2202010, "2.1 MiB"},
		{32 << 20, "32 MiB"},
		{32<<20 - 1, "31.9 MiB"},
		{5 << 30, "5 GiB"},
		{3 << 40, "3 TiB"},
		{2048 << 40, "2048 TiB"},
	} {
		if got := formatSize(tc.n); got != tc.want {
			t.Errorf("formatSize(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestInboxFullDetail(t *testing.T) {
	def := store.Quota{MaxUnreadItems: 1000, MaxUnreadBytes: 32 << 20}
	for _, tc := range []struct {
		name string
		err  store.InboxFullError
		want string
	}{
		{"items", store.InboxFullError{Sandbox: "lead", Items: 1000, Bytes: 2202010, MessageBytes: 61440, Quota: def},
			"the inbox of `lead` is full: 1000 unread items (at most 1000) and 2.1 MiB unread (at most 32 MiB); send again with a new id once `lead` has read its messages"},
		{"bytes", store.InboxFullError{Sandbox: "fix-12", Items: 540, Bytes: 32<<20 - 100, MessageBytes: 61440, Quota: def},
			"the inbox of `fix-12` is full: 540 unread items (at most 1000) and 31.9 MiB unread (at most 32 MiB), no room for this message (60 KiB); send again with a new id once `fix-12` has read its messages"},
		{"one item", store.InboxFullError{Sandbox: "kid", Items: 1, Bytes: 600, MessageBytes: 500, Quota: store.Quota{MaxUnreadItems: 5, MaxUnreadBytes: 1000}},
			"the inbox of `kid` is full: 1 unread item (at most 5) and 600 B unread (at most 1000 B), no room for this message (500 B); send again with a new id once `kid` has read its messages"},
		{"larger than the bound", store.InboxFullError{Sandbox: "kid", Items: 0, Bytes: 0, MessageBytes: 2048, Quota: store.Quota{MaxUnreadItems: 5, MaxUnreadBytes: 1024}},
			"the message (2 KiB) is larger than the inbox of `kid` may hold unread (at most 1 KiB)"},
	} {
		if got := inboxFullDetail(&tc.err); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}
