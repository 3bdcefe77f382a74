// Package loglimit bounds the log lines a sandbox can make the broker
// write: a burst of events per period is logged one by one, the rest are
// only counted, by kind, and summed up once at the period's end.
package loglimit

import (
	"sync"
	"time"
)

// Limiter is one source's bound; make it with New.
type Limiter struct {
	burst   int
	period  time.Duration
	summary func(counts []int)

	mu     sync.Mutex
	start  time.Time   // of the current period
	logged int         // events logged one by one in it
	counts []int       // per kind, not logged since the last summary
	timer  *time.Timer // runs the summary at the period's end
}

// New returns a limiter that lets burst events a period be logged, and
// counts the others in kinds counters (0 to kinds-1). summary gets those
// counts, some non-zero, at the end of a period that counted any, or
// from Flush.
func New(burst int, period time.Duration, kinds int, summary func(counts []int)) *Limiter {
	return &Limiter{burst: burst, period: period, summary: summary, counts: make([]int, kinds)}
}

// Admit reports whether an event of kind is logged on its own; one that
// is not is counted for the summary.
func (l *Limiter) Admit(kind int) bool { return l.admit(time.Now(), kind, true) }

// Count counts an event of kind that is never logged on its own, and
// takes no place in the burst.
func (l *Limiter) Count(kind int) { l.admit(time.Now(), kind, false) }

func (l *Limiter) admit(now time.Time, kind int, loggable bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.start) >= l.period {
		l.start, l.logged = now, 0
	}
	if loggable && l.logged < l.burst {
		l.logged++
		return true
	}
	l.counts[kind]++
	if l.timer == nil {
		l.timer = time.AfterFunc(l.start.Add(l.period).Sub(now), l.Flush)
	}
	return false
}

// Flush runs the summary now if anything was counted since the last one
// (what was counted is not left unsaid when the source closes), and
// disarms the period's timer.
func (l *Limiter) Flush() {
	l.mu.Lock()
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	counts := make([]int, len(l.counts))
	counted := false
	for i, n := range l.counts {
		counts[i], counted = n, counted || n > 0
		l.counts[i] = 0
	}
	l.mu.Unlock()
	if counted {
		l.summary(counts)
	}
}
