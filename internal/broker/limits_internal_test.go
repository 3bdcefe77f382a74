package broker

import (
	"fmt"
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

// TestQueryShare: a tree's share of the store queries shrinks as more
// trees hold queries, always leaving room for one more, and never falls
// under one sandbox's own cap (with 68 trees querying it was 0, and every
// new tree was busy).
func TestQueryShare(t *testing.T) {
	for _, tc := range []struct{ holding, want int }{
		{0, TreeMaxQueries}, {1, 22}, {2, 17}, {32, 2}, {33, MaxQueriesPerSandbox}, {100, MaxQueriesPerSandbox},
	} {
		p := &queryPool{byTree: map[string]int{}}
		for i := range tc.holding {
			p.byTree[fmt.Sprintf("t%d", i)] = 1
		}
		if got := p.share("new"); got != tc.want {
			t.Errorf("%d trees holding queries: a new tree's share %d, want %d", tc.holding, got, tc.want)
		}
	}
}
