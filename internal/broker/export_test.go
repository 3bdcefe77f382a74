package broker

import (
	"context"
	"testing"
	"time"
)

// SetSocketDirForTest records dir as a sandbox's socket dir, bypassing the
// never-reused rule (to simulate a legacy layout).
func (b *Broker) SetSocketDirForTest(t testing.TB, name, dir string) {
	if err := b.store.SetSocketDirForTest(context.Background(), name, dir); err != nil {
		t.Fatal(err)
	}
}

// ParkedForTest reports whether a sandbox has a parked next.
func (b *Broker) ParkedForTest(name string) bool {
	s := b.server(name)
	return s != nil && s.parked.Load()
}

// BusyConnsForTest is how many connections are handling a request.
func (b *Broker) BusyConnsForTest() int { return b.conns.busy() }

// QueuedQueriesForTest is how many store queries wait for a worker.
func (b *Broker) QueuedQueriesForTest() int {
	return int(b.queries.admitted.Load()) - len(b.queries.workers)
}

// QueuedSendsForTest is how many requests wait for the executor.
func (b *Broker) QueuedSendsForTest() int {
	return b.executor.Waiting()
}

// TreeConnsForTest is how many model and egress connections of tree's
// sandboxes are admitted.
func (b *Broker) TreeConnsForTest(tree string) int {
	b.proxyConns.mu.Lock()
	defer b.proxyConns.mu.Unlock()
	return b.proxyConns.byTree[tree]
}

// SweepStorageForTest runs the storage sweep as if at now.
func (b *Broker) SweepStorageForTest(now time.Time) { b.sweepStorage(now) }

// TreeModelBodiesForTest is how many bytes of model request bodies of
// tree's are admitted and not yet released.
func (b *Broker) TreeModelBodiesForTest(tree string) int64 {
	b.modelBodies.mu.Lock()
	defer b.modelBodies.mu.Unlock()
	return b.modelBodies.byTree[tree]
}

// QueriesAdmitted is how many store queries are queued or running.
func (b *Broker) QueriesAdmitted() int { return int(b.queries.admitted.Load()) }

// RunRoundForTest runs one round now.
func (b *Broker) RunRoundForTest() { b.runRound() }

// NoteBudgetSpentForTest tells tree's orchestrator that its kind budget
// is spent, as a refused model request does.
func (b *Broker) NoteBudgetSpentForTest(tree, kind, why string) {
	b.noteBudgetSpent(tree, kind, why, time.Now())
}
