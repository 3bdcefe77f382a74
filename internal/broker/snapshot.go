package broker

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"agentbox/internal/orchestrate"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// Snapshot is the immutable view a completed round publishes. children,
// status and grant read it without touching the store or the backend.
type Snapshot struct {
	Children map[string][]wire.ChildInfo // by orchestrator
	Statuses map[string][]store.Item     // by sandbox: latest status per ref, first seen first
	Grants   map[string]json.RawMessage  // by orchestrator
	// statusSeq is the newest status folded into Statuses.
	statusSeq int64
}

// roundTimeout bounds one round's work (and its repairs).
const roundTimeout = 30 * time.Second

// roundLoop runs a round every RoundInterval. Host commands that change
// sandboxes run one at once, before they answer.
func (b *Broker) roundLoop() {
	t := time.NewTicker(RoundInterval)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		b.runRound()
		b.orchestrator.ExpireRights(b.ctx, time.Now())
	}
}

// runRound reconciles what the broker knows and publishes a new snapshot.
// Statuses are folded in incrementally: a round reads only the statuses
// recorded since the previous one, so its cost does not grow with history.
func (b *Broker) runRound() {
	b.roundMu.Lock()
	defer b.roundMu.Unlock()
	ctx, cancel := context.WithTimeout(b.ctx, roundTimeout)
	defer cancel()
	sbs, err := b.store.Sandboxes(ctx)
	if err != nil {
		b.log.Warn("round: list sandboxes", "err", err)
		return
	}
	running := map[string]bool{}
	if insts, err := b.cfg.Backend.List(ctx); err == nil {
		for _, in := range insts {
			running[in.Name] = in.Running
		}
		b.repair(planRepairs(sbs, insts, b.conflictedNow()))
	} else {
		b.log.Warn("round: list backend", "err", err)
	}
	prev := b.snap.Load()
	fresh, err := b.store.StatusesSince(ctx, prev.statusSeq)
	if err != nil {
		b.log.Warn("round: statuses", "err", err)
		return
	}
	next := &Snapshot{
		Children:  map[string][]wire.ChildInfo{},
		Statuses:  map[string][]store.Item{},
		Grants:    map[string]json.RawMessage{},
		statusSeq: prev.statusSeq,
	}
	for _, sb := range sbs {
		if st, ok := prev.Statuses[sb.Name]; ok {
			next.Statuses[sb.Name] = st // shared until changed below
		}
		switch sb.Role {
		case wire.RoleChild:
			next.Children[sb.Parent] = append(next.Children[sb.Parent], wire.ChildInfo{
				Name: sb.Name, Branch: sb.Branch, State: orchestrate.ChildState(sb), Running: running[sb.Name]})
		case wire.RoleOrchestrator:
			if sb.Grant != "" {
				next.Grants[sb.Name] = json.RawMessage(sb.Grant)
			}
		}
	}
	live := map[string]bool{}
	for _, sb := range sbs {
		live[sb.Name] = true
	}
	// Fold the new statuses in: per sandbox, copy its list once, index it
	// by ref, replace or append.
	byRef := map[string]map[string]int{}
	for _, si := range fresh {
		next.statusSeq = max(next.statusSeq, si.Seq)
		if !live[si.Sandbox] {
			continue // destroyed since
		}
		list := next.Statuses[si.Sandbox]
		idx, ok := byRef[si.Sandbox]
		if !ok {
			list = slices.Clone(list)
			idx = make(map[string]int, len(list))
			for i, it := range list {
				idx[it.Ref] = i
			}
			byRef[si.Sandbox] = idx
		}
		if i, ok := idx[si.Ref]; ok {
			list[i] = si.Item
		} else {
			idx[si.Ref] = len(list)
			list = append(list, si.Item)
		}
		next.Statuses[si.Sandbox] = list
	}
	b.snap.Store(next)
	b.orchestrator.ScheduleFinishes(ctx)
}

// Snapshot returns the last published snapshot.
func (b *Broker) Snapshot() *Snapshot { return b.snap.Load() }

func (b *Broker) opChildren(_ context.Context, c *call) *reply {
	if werr := decodeArgs(c.args, &struct{}{}); werr != nil {
		return replyErr(werr)
	}
	kids := b.snap.Load().Children[c.caller.Sandbox]
	if kids == nil {
		kids = []wire.ChildInfo{}
	}
	return replyOK(wire.ChildrenResult{Children: kids})
}

func (b *Broker) opStatus(_ context.Context, c *call) *reply {
	var args wire.StatusArgs
	if werr := decodeArgs(c.args, &args); werr != nil {
		return replyErr(werr)
	}
	all := b.snap.Load().Statuses[c.caller.Sandbox]
	if args.Ref == "" {
		// The newest statuses that fit in one reply line, oldest first.
		budget, first := maxResultBytes, len(all)
		for first > 0 && budget-len(all[first-1].Doc)-1 >= 0 {
			budget -= len(all[first-1].Doc) + 1
			first--
		}
		docs := make([]json.RawMessage, 0, len(all)-first)
		for _, it := range all[first:] {
			docs = append(docs, it.Doc)
		}
		return replyOK(wire.StatusResult{Statuses: docs, More: first > 0})
	}
	for _, it := range all {
		if it.Ref == args.Ref {
			return &reply{resp: &wire.Response{V: wire.Version, OK: true, Result: it.Doc}}
		}
	}
	return replyErr(wire.Errorf(wire.CodeNotFound, "no status for '%s'", truncate(args.Ref, 64)))
}

func (b *Broker) opGrant(_ context.Context, c *call) *reply {
	if werr := decodeArgs(c.args, &struct{}{}); werr != nil {
		return replyErr(werr)
	}
	g, ok := b.snap.Load().Grants[c.caller.Sandbox]
	if !ok {
		return replyErr(wire.Errorf(wire.CodeNotFound, "no orchestration grant"))
	}
	return &reply{resp: &wire.Response{V: wire.Version, OK: true, Result: g}}
}
