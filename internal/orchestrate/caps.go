package orchestrate

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
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
	// DefaultMaxSpawnsPerHour bounds the spawns one orchestrator has
	// admitted in the last hour: each child takes a host uid a root broker
	// never gives again, so spawning and destroying in a loop would use up
	// the range (sandbox_uids) for every tree. 256 is four fan-outs to
	// DefaultMaxChildren an hour.
	DefaultMaxSpawnsPerHour = 256
)

// spawnWindow is the span MaxSpawnsPerHour counts over.
const spawnWindow = time.Hour

// Caps bound what one orchestrator may spawn (broker.yaml tree); a zero
// bound is its default.
type Caps struct {
	MaxChildren      int
	MaxQueuedSpawns  int
	MaxSpawnsPerHour int
}

// withDefaults is c with each zero bound set to its default.
func (c Caps) withDefaults() Caps {
	if c.MaxChildren <= 0 {
		c.MaxChildren = DefaultMaxChildren
	}
	if c.MaxQueuedSpawns <= 0 {
		c.MaxQueuedSpawns = DefaultMaxQueuedSpawns
	}
	if c.MaxSpawnsPerHour <= 0 {
		c.MaxSpawnsPerHour = DefaultMaxSpawnsPerHour
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

// spawnRate counts the spawns each orchestrator had admitted over the
// last spawnWindow, in memory: a broker restart starts every count
// afresh, which a sandbox cannot cause.
type spawnRate struct {
	admitted map[string][]time.Time // by orchestrator, oldest first
}

// check refuses a spawn of orch at now once max spawns were admitted in
// the window before it, naming the cap and when the next one is allowed.
func (r *spawnRate) check(orch string, now time.Time, limit int) error {
	times := r.recent(orch, now)
	if len(times) < limit {
		return nil
	}
	wait := times[len(times)-limit].Add(spawnWindow).Sub(now).Round(time.Second)
	return refusef("you have spawned %d %s in the last hour (at most %d an hour: each new child takes a host uid that is never given again); spawn again in %v",
		len(times), plural(len(times), "child", "children"), limit, max(wait, time.Second))
}

// add records a spawn of orch admitted at now, and forgets every
// orchestrator's admissions older than the window (a destroyed
// orchestrator's too).
func (r *spawnRate) add(orch string, now time.Time) {
	if r.admitted == nil {
		r.admitted = map[string][]time.Time{}
	}
	for o := range r.admitted {
		r.recent(o, now)
	}
	r.admitted[orch] = append(r.admitted[orch], now)
}

// recent is orch's admissions within the window before now; it forgets
// older ones.
func (r *spawnRate) recent(orch string, now time.Time) []time.Time {
	times := r.admitted[orch]
	i := 0
	for i < len(times) && !times[i].After(now.Add(-spawnWindow)) {
		i++
	}
	times = times[i:]
	if len(times) == 0 {
		delete(r.admitted, orch)
		return nil
	}
	r.admitted[orch] = times
	return times
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
