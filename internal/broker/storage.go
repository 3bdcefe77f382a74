package broker

import (
	"time"

	"agentbox/internal/store"
)

// The storage sweep's cadence and default.
const (
	// SweepInterval is how often read items past the retention are
	// removed and broker.db's free pages given back: far less often than
	// rounds, each batch a short transaction of its own.
	SweepInterval = time.Minute
	// DefaultReadRetention is how long read items are kept.
	DefaultReadRetention = 7 * 24 * time.Hour
)

// sweepLoop sweeps storage at start and every SweepInterval.
func (b *Broker) sweepLoop() {
	t := time.NewTicker(SweepInterval)
	defer t.Stop()
	for {
		b.sweepStorage(time.Now())
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepStorage removes read items older than the retention and the
// manifests past each sandbox's journal bound, then gives back the pages
// that removal and destroyed sandboxes freed.
func (b *Broker) sweepStorage(now time.Time) {
	n, err := b.store.RemoveReadBefore(b.ctx, now.Add(-b.retention))
	if err != nil {
		b.log.Warn("storage sweep: remove read items", "err", err)
	}
	if n > 0 {
		b.log.Info("storage sweep: read items past the retention removed", "items", n, "retention", b.retention)
	}
	n, err = b.store.PruneJournals(b.ctx)
	if err != nil {
		b.log.Warn("storage sweep: prune manifest journals", "err", err)
	}
	if n > 0 {
		b.log.Info("storage sweep: manifests past each sandbox's journal bound forgotten", "manifests", n, "bound", store.MaxJournaled)
	}
	if err := b.store.Shrink(b.ctx); err != nil {
		b.log.Warn("storage sweep: shrink broker.db", "err", err)
	}
}
