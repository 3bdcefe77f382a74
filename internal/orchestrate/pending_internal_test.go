package orchestrate

import (
	"slices"
	"testing"

	"agentbox/internal/outboxread"
	"agentbox/internal/pubjournal"
)

// TestPendingCapForgedListing: the outbox listing comes from the
// sandbox. One as long as the helper writes (MaxListed per outbox) of a
// published manifest is looked at and passes; one entry more, which no
// genuine helper writes, is refused without a journal looked at for
// each entry (a forged listing of some 29,000 held every sandbox's
// requests while each took the journals' lock).
func TestPendingCapForgedListing(t *testing.T) {
	dir, err := pubjournal.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := dir.Update("lead", "pr", "a.json", func(*pubjournal.Journal) (*pubjournal.Journal, error) {
		return &pubjournal.Journal{Sandbox: "lead", Outbox: "pr", Name: "a.json", State: pubjournal.Done}, nil
	}); err != nil {
		t.Fatal(err)
	}
	o := &Orchestrator{Publishing: &Publishing{Journal: dir}}
	bound := len(outboxread.Dirs) * outboxread.MaxListed
	for _, tc := range []struct {
		n       int
		refused bool
	}{{bound, false}, {bound + 1, true}} {
		read := outboxread.Result{Staged: slices.Repeat([]string{"pr/a.json"}, tc.n)}
		if err := o.pendingCap("lead", read); (err != nil) != tc.refused {
			t.Errorf("a listing of %d published entries: %v, refused want %v", tc.n, err, tc.refused)
		}
	}
}
