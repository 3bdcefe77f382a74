package broker

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"agentbox/internal/pubjournal"
	"agentbox/internal/wire"
)

// TestOutboxListWithinOneReply: outbox-ls answers without the proposals,
// not done first, and as many journals as one reply line holds: exactly
// at the bound all of them, one byte past it all but the last (More).
func TestOutboxListWithinOneReply(t *testing.T) {
	journal := func(i int, state, detail string) *pubjournal.Journal {
		return &pubjournal.Journal{Version: 1, Sandbox: "lead", Outbox: "issue", Name: fmt.Sprintf("p%03d.json", i), State: state,
			Proposal: json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`), Actions: []wire.OutboxAction{{Kind: "comment", Detail: detail}}}
	}
	size := func(j *pubjournal.Journal) int {
		c := *j
		c.Proposal = nil
		raw, _ := json.Marshal(c)
		return len(raw)
	}
	build := func(extra int) []*pubjournal.Journal {
		var all []*pubjournal.Journal
		budget := maxResultBytes - len(`{"proposals":[],"more":true}`)
		for i := 0; ; i++ {
			j := journal(i, pubjournal.Done, strings.Repeat("d", 4096))
			if i == 0 {
				j.State = pubjournal.Blocked
			}
			if n := size(j) + 1; n > budget-16384 {
				// The last one takes what is left, plus extra.
				j.Actions[0].Detail = strings.Repeat("d", 4096+budget-n+extra)
				return append(all, j)
			}
			budget -= size(j) + 1
			all = append([]*pubjournal.Journal{j}, all...) // the blocked one last: it must come first
		}
	}
	for _, c := range []struct {
		extra int
		more  bool
	}{{0, false}, {1, true}} {
		all := build(c.extra)
		list := outboxList(all)
		if list.More != c.more || len(list.Proposals) != len(all)-boolOrder(c.more) {
			t.Fatalf("extra %d: more %v, %d of %d", c.extra, list.More, len(list.Proposals), len(all))
		}
		if list.Proposals[0].State != pubjournal.Blocked || list.Proposals[0].Proposal != nil {
			t.Fatalf("extra %d: first %+v", c.extra, list.Proposals[0].Key())
		}
		raw, _ := json.Marshal(list)
		if len(raw) > maxResultBytes {
			t.Fatalf("extra %d: %d bytes", c.extra, len(raw))
		}
	}
	// outbox-show keeps the proposal that fits, and drops one that does not.
	small := journal(1, pubjournal.Done, "")
	small.Proposal = json.RawMessage(`{"version":1}`)
	if got := outboxShown(small); string(got.Proposal) != `{"version":1}` {
		t.Fatalf("show: %s", got.Proposal)
	}
	if got := outboxShown(journal(1, pubjournal.Done, "")); got.Proposal != nil {
		t.Fatal("show kept a proposal past the reply line")
	}
}
