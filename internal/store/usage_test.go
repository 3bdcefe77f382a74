package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"agentbox/internal/wire"
)

// t0 is a fixed minute-aligned instant the usage tests count from.
var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

type usageAdd struct {
	name, uuid, tree string
	u                Usage
	at               time.Duration // after t0
}

// TestAddUsageTotals: adds accumulate per uuid; a name reused after a
// destroy (a new uuid) gets a row of its own beside the old one; rows are
// sorted by tree, then name, then age.
func TestAddUsageTotals(t *testing.T) {
	for _, tc := range []struct {
		name string
		adds []usageAdd
		want []UsageRow
	}{
		{
			name: "one add",
			adds: []usageAdd{{"o", "u1", "o", usage(1, 10, 20, 30, 40), 0}},
			want: []UsageRow{{Name: "o", UUID: "u1", Tree: "o", Usage: usage(1, 10, 20, 30, 40), Updated: t0}},
		},
		{
			name: "adds accumulate",
			adds: []usageAdd{
				{"o", "u1", "o", usage(1, 10, 20, 30, 40), 0},
				{"o", "u1", "o", usage(1, 1, 2, 3, 4), time.Second},
				{"o", "u1", "o", Usage{Requests: 1}, 2 * time.Second},
			},
			want: []UsageRow{{Name: "o", UUID: "u1", Tree: "o", Usage: usage(3, 11, 22, 33, 44), Updated: t0.Add(2 * time.Second)}},
		},
		{
			name: "two sandboxes of a tree and one of another",
			adds: []usageAdd{
				{"solo", "u3", "solo", Usage{Requests: 1, OutputTokens: 5}, 0},
				{"o", "u1", "o", Usage{Requests: 1, InputTokens: 7}, time.Second},
				{"c", "u2", "o", Usage{Requests: 2, InputTokens: 9}, 2 * time.Second},
			},
			want: []UsageRow{
				{Name: "c", UUID: "u2", Tree: "o", Usage: Usage{Requests: 2, InputTokens: 9}, Updated: t0.Add(2 * time.Second)},
				{Name: "o", UUID: "u1", Tree: "o", Usage: Usage{Requests: 1, InputTokens: 7}, Updated: t0.Add(time.Second)},
				{Name: "solo", UUID: "u3", Tree: "solo", Usage: Usage{Requests: 1, OutputTokens: 5}, Updated: t0},
			},
		},
		{
			name: "a reused name",
			adds: []usageAdd{
				{"c", "u2", "o", Usage{Requests: 1, OutputTokens: 3}, 0},
				{"c", "u9", "o", Usage{Requests: 1, OutputTokens: 4}, time.Minute},
				{"c", "u2", "o", Usage{Requests: 1, OutputTokens: 1}, time.Second}, // a late record of the old one
			},
			want: []UsageRow{
				{Name: "c", UUID: "u2", Tree: "o", Usage: Usage{Requests: 2, OutputTokens: 4}, Updated: t0.Add(time.Second)},
				{Name: "c", UUID: "u9", Tree: "o", Usage: Usage{Requests: 1, OutputTokens: 4}, Updated: t0.Add(time.Minute)},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openTestStore(t)
			ctx := context.Background()
			for _, a := range tc.adds {
				if err := s.AddUsage(ctx, a.name, a.uuid, a.tree, a.u, t0.Add(a.at)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.UsageRows(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !usageRowsEqual(got, tc.want) {
				t.Fatalf("rows\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func usageRowsEqual(a, b []UsageRow) bool {
	return slices.EqualFunc(a, b, func(x, y UsageRow) bool {
		return x.Name == y.Name && x.UUID == y.UUID && x.Tree == y.Tree && x.Usage == y.Usage && x.Updated.Equal(y.Updated)
	})
}

func TestSandboxTree(t *testing.T) {
	for _, tc := range []struct {
		sb   Sandbox
		want string
	}{
		{Sandbox{Name: "o", Role: wire.RoleOrchestrator}, "o"},
		{Sandbox{Name: "c", Role: wire.RoleChild, Parent: "o"}, "o"},
	} {
		if got := tc.sb.Tree(); got != tc.want {
			t.Errorf("%+v: tree %q, want %q", tc.sb, got, tc.want)
		}
	}
}

// TestUsageOutlivesTheSandbox: deleting a sandbox keeps its usage row.
func TestUsageOutlivesTheSandbox(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	if err := s.AddUsage(ctx, "c", "u2", "o", Usage{Requests: 1, OutputTokens: 3}, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if rows, err := s.UsageRows(ctx); err != nil || len(rows) != 1 || rows[0].UUID != "u2" {
		t.Fatalf("rows after the delete: %+v, %v", rows, err)
	}
}

// TestTreeOutputSince: output tokens counted per tree and minute; a
// window counts the minutes from the one since falls in, and nothing
// older.
func TestTreeOutputSince(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	for _, a := range []usageAdd{
		{"o", "u1", "o", Usage{Requests: 1, OutputTokens: 1000}, -61 * time.Minute}, // more than an hour before t0
		{"o", "u1", "o", Usage{Requests: 1, OutputTokens: 100}, -59 * time.Minute},
		{"c", "u2", "o", Usage{Requests: 1, OutputTokens: 10, InputTokens: 5000}, -time.Second},
		{"c", "u2", "o", Usage{Requests: 1, OutputTokens: 1}, 0},
		{"c", "u2", "o", Usage{Requests: 1, InputTokens: 7}, 0}, // no output: no bucket
		{"solo", "u3", "solo", Usage{Requests: 1, OutputTokens: 50000}, 0},
	} {
		if err := s.AddUsage(ctx, a.name, a.uuid, a.tree, a.u, t0.Add(a.at)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		tree  string
		since time.Time
		want  int64
	}{
		{"o", t0.Add(-time.Hour), 111},
		{"o", t0.Add(-2 * time.Hour), 1111},
		{"o", t0.Add(-time.Minute), 11},
		{"o", t0.Add(-30 * time.Second), 11}, // the minute since falls in counts whole
		{"o", t0, 1},
		{"o", t0.Add(time.Minute), 0},
		{"solo", t0.Add(-time.Hour), 50000},
		{"nobody", t0.Add(-time.Hour), 0},
	} {
		got, err := s.TreeOutputSince(ctx, tc.tree, tc.since)
		if err != nil || got != tc.want {
			t.Errorf("TreeOutputSince(%s, t0%+v) = %d, %v; want %d", tc.tree, tc.since.Sub(t0), got, err, tc.want)
		}
	}
}

// TestTreeInputSince: input tokens, uncached, cache reads and cache
// writes together, counted per tree and minute as output tokens are; a
// usage with no input adds no bucket.
func TestTreeInputSince(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	for _, a := range []usageAdd{
		{"o", "u1", "o", usage(1, 1000, 1, 0, 0), -61 * time.Minute}, // more than an hour before t0
		{"o", "u1", "o", usage(1, 100, 1, 20, 3), -59 * time.Minute},
		{"c", "u2", "o", usage(1, 0, 9, 0, 0), -time.Second},
		{"c", "u2", "o", usage(1, 4, 0, 0, 0), 0},
	} {
		if err := s.AddUsage(ctx, a.name, a.uuid, a.tree, a.u, t0.Add(a.at)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		since time.Time
		want  int64
	}{
		{t0.Add(-time.Hour), 127},
		{t0.Add(-2 * time.Hour), 1127},
		{t0.Add(-time.Minute), 4},
		{t0.Add(time.Minute), 0},
	} {
		got, err := s.TreeInputSince(ctx, "o", tc.since)
		if err != nil || got != tc.want {
			t.Errorf("TreeInputSince(o, t0%+v) = %d, %v; want %d", tc.since.Sub(t0), got, err, tc.want)
		}
	}
	var buckets int
	if err := s.db.QueryRow(`SELECT count(*) FROM tree_input`).Scan(&buckets); err != nil || buckets != 3 {
		t.Fatalf("%d input buckets, %v; want 3 (none for the usage without input)", buckets, err)
	}
}

// TestTreeOutputPruned: a bucket older than a day goes when a new bucket
// is written (of any tree); adds within an existing bucket prune nothing.
func TestTreeOutputPruned(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	buckets := func() []string {
		t.Helper()
		rows, err := s.db.Query(`SELECT tree, minute FROM tree_output ORDER BY tree, minute`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var tree string
			var minute int64
			rows.Scan(&tree, &minute)
			out = append(out, tree+"@"+time.Unix(minute*60, 0).Sub(t0).String())
		}
		return out
	}
	add := func(tree string, at time.Duration) {
		t.Helper()
		if err := s.AddUsage(ctx, tree, "u-"+tree, tree, Usage{Requests: 1, OutputTokens: 1}, t0.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	add("o", -25*time.Hour)
	add("old", -24*time.Hour-time.Minute)
	add("o", -23*time.Hour)
	if got, want := buckets(), []string{"o@-25h0m0s", "o@-23h0m0s", "old@-24h1m0s"}; !slices.Equal(got, want) {
		t.Fatalf("buckets %v, want %v", got, want)
	}
	add("o", 0)
	if got, want := buckets(), []string{"o@-23h0m0s", "o@0s"}; !slices.Equal(got, want) {
		t.Fatalf("after a new bucket: %v, want %v", got, want)
	}
	if n, _ := s.TreeOutputSince(ctx, "o", t0.Add(-48*time.Hour)); n != 2 {
		t.Fatalf("o's output over two days: %d, want 2", n)
	}
	// The totals are not pruned.
	rows, _ := s.UsageRows(ctx)
	if len(rows) != 2 || rows[0].Name != "o" || rows[0].Requests != 3 || rows[1].Name != "old" {
		t.Fatalf("rows %+v", rows)
	}
}

// TestUsageDurable: what AddUsage returned from is there after Close and
// Open.
func TestUsageDurable(t *testing.T) {
	s, path := openTestStore(t)
	ctx := context.Background()
	now := time.Now()
	if err := s.AddUsage(ctx, "c", "u2", "o", usage(1, 2, 3, 4, 5), now); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.UsageRows(ctx)
	want := []UsageRow{{Name: "c", UUID: "u2", Tree: "o", Usage: usage(1, 2, 3, 4, 5), Updated: now.Truncate(time.Millisecond)}}
	if err != nil || !usageRowsEqual(rows, want) {
		t.Fatalf("rows after reopening: %+v, %v", rows, err)
	}
	if n, err := s.TreeOutputSince(ctx, "o", now.Add(-time.Hour)); err != nil || n != 3 {
		t.Fatalf("o's output after reopening: %d, %v", n, err)
	}
}

// usage is a Usage of requests and the four token counts, in that order.
func usage(requests, input, output, cacheRead, cacheCreation int64) Usage {
	return Usage{Requests: requests, InputTokens: input, OutputTokens: output,
		CacheReadInputTokens: cacheRead, CacheCreationInputTokens: cacheCreation}
}
