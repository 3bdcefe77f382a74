package orchestrate

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The defaults of Caps: what one orchestrator's tree may hold in
// broker.db however its children end up.
const (
	// DefaultMaxChildren bounds an orchestrator's children in any state
	// (failed and stopped ones too: each keeps a record, an inbox and a
	// checkout until destroyed).
	DefaultMaxChildren = 64
	// DefaultMaxQueuedSpawns bounds an orchestrator's spawns and restarts
	// waiting for a running slot.
	DefaultMaxQueuedSpawns = 32
)

// Caps bound what one orchestrator may spawn (broker.yaml tree); a zero
// bound is its default.
type Caps struct {
	MaxChildren     int
	MaxQueuedSpawns int
}

// withDefaults is c with each zero bound set to its default.
func (c Caps) withDefaults() Caps {
	if c.MaxChildren <= 0 {
		c.MaxChildren = DefaultMaxChildren
	}
	if c.MaxQueuedSpawns <= 0 {
		c.MaxQueuedSpawns = DefaultMaxQueuedSpawns
	}
	return c
}

// admit refuses a spawn that would pass a cap: one more child, and (wait:
// it would queue) one more queued spawn. The refusal names the cap and
// what fills it.
func (c Caps) admit(kids childCounts, wait bool) error {
	c = c.withDefaults()
	if kids.total >= c.MaxChildren {
		return refusef("you have %d %s (at most %d, in any state): %s; destroy one before spawning another",
			kids.total, plural(kids.total, "child", "children"), c.MaxChildren, stateCounts(kids.byState))
	}
	if wait && kids.queued >= c.MaxQueuedSpawns {
		return refusef("your spawn queue is full: %d queued (at most %d, spawns and restarts) for %d running %s, used by %s; stop or destroy a child before spawning another",
			kids.queued, c.MaxQueuedSpawns, len(kids.active), plural(len(kids.active), "slot", "slots"), namedList(kids.active))
	}
	return nil
}

// stateCounts writes children's counts by state, in a stable order:
// "40 failed, 20 stopped, 4 running".
func stateCounts(byState map[string]int) string {
	states := slices.Sorted(maps.Keys(byState))
	slices.SortStableFunc(states, func(a, b string) int { return byState[b] - byState[a] })
	parts := make([]string, len(states))
	for i, s := range states {
		parts[i] = fmt.Sprintf("%d %s", byState[s], s)
	}
	return strings.Join(parts, ", ")
}

// namedList names at most maxHoldersNamed children: "`a`, `b` and 3 more".
func namedList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	named := names[:min(len(names), maxHoldersNamed)]
	s := "`" + strings.Join(named, "`, `") + "`"
	if more := len(names) - len(named); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}
