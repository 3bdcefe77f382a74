package orchestrate

import (
	"context"
	"encoding/json"

	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// InterruptedDetail is the failed status of a manifest a broker died
// while running. Its delivery and its status are written together, so
// nothing it would have delivered was.
const InterruptedDetail = "the broker stopped before this request finished, and nothing was delivered: check the child's state and send it again with a new id"

// RecoverManifests gives each manifest a previous broker journaled but
// never answered (in, listed before any requester could send) its first
// status, after RecoverSpawns: a spawn or restart still queued gets
// queued at its position, anything else failed.
func (o *Orchestrator) RecoverManifests(ctx context.Context, in []store.Interrupted) {
	if len(in) == 0 {
		return
	}
	all, err := o.Store.Sandboxes(ctx)
	if err != nil {
		o.logger().Error("recover manifests", "err", err)
		return
	}
	for _, m := range in {
		state, detail := wire.StateFailed, InterruptedDetail
		if pos := queuePosition(all, m); pos > 0 {
			active, _, _ := o.slots(ctx, m.Sandbox)
			max, _ := o.maxRunning(ctx, m.Sandbox)
			state, detail = wire.StateQueued, queuedDetail(pos, active, max)
		}
		ok, err := o.Store.FinishInterrupted(ctx, m, state, detail)
		if err != nil {
			o.logger().Error("recover manifest", "sandbox", m.Sandbox, "manifest", m.ManifestID, "err", err)
			continue
		}
		if ok {
			o.logger().Warn("manifest interrupted by a broker stop", "sandbox", m.Sandbox, "manifest", m.ManifestID, "type", m.Type, "state", state)
			o.notify(m.Sandbox)
		}
	}
}

// queuePosition is the place in its orchestrator's queue of the child
// waiting for the spawn or restart m (0: none waits for it).
func queuePosition(all []store.Sandbox, m store.Interrupted) int {
	var seq int64
	for _, c := range all {
		var doc spawnDoc
		if c.Parent == m.Sandbox && waitsForSlot(c) && json.Unmarshal([]byte(c.SpawnDoc), &doc) == nil && doc.Ref == m.ManifestID {
			seq = c.QueuedSeq
		}
	}
	if seq == 0 {
		return 0
	}
	pos := 0
	for _, c := range all {
		if c.Parent == m.Sandbox && waitsForSlot(c) && c.QueuedSeq <= seq {
			pos++
		}
	}
	return pos
}

// ChildState is a child's state as the host and its orchestrator see it:
// the store's, with done for a running child whose done report was
// accepted and queued for a stopped one waiting for a slot to restart in.
func ChildState(sb store.Sandbox) string {
	switch {
	case sb.DoneHead != "" && (sb.State == store.StateReady || sb.State == store.StateRunning):
		return "done"
	case restartQueued(sb):
		return store.StateQueued
	}
	return sb.State
}

// LastManifest is the id of the spawn or restart that last ran (or waits
// to run) on a spawned child: its orchestrator's status for it is the
// child's last status. "" for a child made on the host.
func LastManifest(sb store.Sandbox) string {
	var doc spawnDoc
	if json.Unmarshal([]byte(sb.SpawnDoc), &doc) != nil {
		return ""
	}
	return doc.Ref
}
