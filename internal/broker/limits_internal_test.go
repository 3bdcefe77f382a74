package broker

import (
	"testing"

	"agentbox/internal/store"
)

// TestInboxQuotaResolution: the broker never runs without a quota. Each zero
// bound takes its default; a negative one is refused.
func TestInboxQuotaResolution(t *testing.T) {
	for _, tc := range []struct {
		in, want store.Quota
		bad      bool
	}{
		{in: store.Quota{}, want: store.Quota{MaxUnreadItems: 1000, MaxUnreadBytes: 32 << 20, TreeMaxUnreadItems: 2000, TreeMaxUnreadBytes: 64 << 20}},
		{in: store.Quota{MaxUnreadItems: 3}, want: store.Quota{MaxUnreadItems: 3, MaxUnreadBytes: 32 << 20, TreeMaxUnreadItems: 2000, TreeMaxUnreadBytes: 64 << 20}},
		{in: store.Quota{MaxUnreadBytes: 4096}, want: store.Quota{MaxUnreadItems: 1000, MaxUnreadBytes: 4096, TreeMaxUnreadItems: 2000, TreeMaxUnreadBytes: 64 << 20}},
		{in: store.Quota{MaxUnreadItems: 7, MaxUnreadBytes: 9, TreeMaxUnreadItems: 11, TreeMaxUnreadBytes: 13},
			want: store.Quota{MaxUnreadItems: 7, MaxUnreadBytes: 9, TreeMaxUnreadItems: 11, TreeMaxUnreadBytes: 13}},
		{in: store.Quota{MaxUnreadItems: -1}, bad: true},
		{in: store.Quota{MaxUnreadBytes: -1}, bad: true},
		{in: store.Quota{TreeMaxUnreadItems: -1}, bad: true},
		{in: store.Quota{TreeMaxUnreadBytes: -1}, bad: true},
	} {
		got, err := inboxQuota(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("inboxQuota(%+v) = %+v, want an error", tc.in, got)
			}
			if _, err := Open(Config{InboxQuota: tc.in}); err == nil {
				t.Errorf("Open with quota %+v succeeded", tc.in)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("inboxQuota(%+v) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
