package orchestrate

import (
	"context"
	"slices"
	"strings"

	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// maxSuggestions bounds the names one "did you mean" offers.
const maxSuggestions = 3

// maxSuggestEdits: a name more edits than this away from the one asked
// for is another name, not a typo of it.
const maxSuggestEdits = 2

// NoSuchSandbox is the refusal for a sandbox name that is not recorded,
// with the closest recorded names (host callers see every sandbox).
func (o *Orchestrator) NoSuchSandbox(ctx context.Context, name string) error {
	return o.noSuchSandbox(ctx, name, "")
}

// noSuchSandbox is NoSuchSandbox suggesting only sandboxes of role ("":
// any).
func (o *Orchestrator) noSuchSandbox(ctx context.Context, name string, role wire.Role) error {
	hint := o.suggest(ctx, name, func(sb store.Sandbox) bool { return role == "" || sb.Role == role })
	return &Refusal{Detail: "no sandbox named " + truncate(name, 80) + hint, err: ErrNoSuchSandbox}
}

// suggest is didYouMean over the recorded sandboxes that pass visible:
// only names the caller may see are ever offered.
func (o *Orchestrator) suggest(ctx context.Context, name string, visible func(store.Sandbox) bool) string {
	sbs, err := o.Store.Sandboxes(ctx)
	if err != nil {
		return ""
	}
	var names []string
	for _, sb := range sbs {
		if visible(sb) {
			names = append(names, sb.Name)
		}
	}
	return didYouMean(name, names)
}

// didYouMean is " (did you mean `a`, `b` or `c`?)" for the candidates
// closest to name, if at most maxSuggestEdits edits away; "" for none.
func didYouMean(name string, candidates []string) string {
	type near struct {
		name  string
		edits int
	}
	var found []near
	for _, c := range candidates {
		if d := editDistance(name, c, maxSuggestEdits); d > 0 && d <= maxSuggestEdits {
			found = append(found, near{c, d})
		}
	}
	if len(found) == 0 {
		return ""
	}
	slices.SortFunc(found, func(a, b near) int {
		if a.edits != b.edits {
			return a.edits - b.edits
		}
		return strings.Compare(a.name, b.name)
	})
	quoted := make([]string, 0, maxSuggestions)
	for _, n := range found[:min(len(found), maxSuggestions)] {
		if n.edits > found[0].edits {
			break // a closer name is the likelier one
		}
		quoted = append(quoted, "`"+n.name+"`")
	}
	list := quoted[0]
	if k := len(quoted); k > 1 {
		list = strings.Join(quoted[:k-1], ", ") + " or " + quoted[k-1]
	}
	return " (did you mean " + list + "?)"
}

// editDistance is the Levenshtein distance between a and b in bytes
// (names are ASCII), or limit+1 when it is certainly more than limit: a
// requester's name may be long, and is never compared at length.
func editDistance(a, b string, limit int) int {
	if diff := len(a) - len(b); diff > limit || -diff > limit {
		return limit + 1
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
