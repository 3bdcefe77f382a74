package broker

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
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
	// parents names each child's orchestrator (a refresh finds a
	// destroyed child's entry by it).
	parents map[string]string
	// uuids is each sandbox's UUID: the statuses kept under a name are
	// its sandbox's, never those of an earlier sandbox of that name
	// (destroyed and made again between two rounds).
	uuids map[string]string
	// statusSeq is the newest status folded into Statuses.
	statusSeq int64
}

// roundTimeout bounds one round's work (and its repairs).
const roundTimeout = 30 * time.Second

// roundLoop runs a round every RoundInterval. Host commands that change
// sandboxes refresh what they changed before they answer (refresh).
func (b *Broker) roundLoop() {
	t := time.NewTicker(RoundInterval)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		if b.roundsHeld.Load() {
			continue
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
		parents:   map[string]string{},
		uuids:     make(map[string]string, len(sbs)),
		statusSeq: prev.statusSeq,
	}
	live := map[string]bool{}
	for _, sb := range sbs {
		live[sb.Name] = true
		next.uuids[sb.Name] = sb.UUID
		if st, ok := prev.Statuses[sb.Name]; ok && prev.uuids[sb.Name] == sb.UUID {
			next.Statuses[sb.Name] = st // shared until changed below
		}
		switch sb.Role {
		case wire.RoleChild:
			next.Children[sb.Parent] = append(next.Children[sb.Parent], childInfo(sb, running[sb.Name]))
			next.parents[sb.Name] = sb.Parent
		case wire.RoleOrchestrator:
			if sb.Grant != "" {
				next.Grants[sb.Name] = json.RawMessage(sb.Grant)
			}
		}
	}
	next.fold(fresh, func(name string) bool { return live[name] })
	b.snap.Store(next)
	b.orchestrator.ScheduleFinishes(ctx)
}

func childInfo(sb store.Sandbox, running bool) wire.ChildInfo {
	return wire.ChildInfo{Name: sb.Name, Branch: sb.Branch, State: orchestrate.ChildState(sb), Running: running}
}

// fold folds new statuses into s (whose Statuses map is its own): per
// sandbox, its list is copied once, indexed by ref, and each status
// replaces its ref's or is appended. Statuses of sandboxes not live
// (destroyed since) are left out.
func (s *Snapshot) fold(fresh []store.SandboxItem, live func(string) bool) {
	byRef := map[string]map[string]int{}
	for _, si := range fresh {
		s.statusSeq = max(s.statusSeq, si.Seq)
		if !live(si.Sandbox) {
			continue
		}
		list := s.Statuses[si.Sandbox]
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
		s.Statuses[si.Sandbox] = list
	}
	// The journal keeps store.MaxJournaled finished manifests of each
	// sandbox (the sweep forgets older ones); the snapshot keeps as many
	// statuses, the oldest seen dropped, so a sandbox sending manifest
	// after manifest cannot grow it, or the cost of a round, for ever.
	for name := range byRef {
		if list := s.Statuses[name]; len(list) > store.MaxJournaled {
			s.Statuses[name] = slices.Clone(list[len(list)-store.MaxJournaled:])
		}
	}
}

// refresh publishes what a host command about sandbox name changed: the
// snapshot entries of its tree (its orchestrator and that one's children,
// before and after the command) read again from their records, and the
// statuses recorded since the last snapshot. Its cost grows with the tree,
// not with every sandbox the broker holds: the round loop still looks at
// all of them, and at the backend, every RoundInterval. Until then the
// named sandbox counts as running when its record says so (a host command
// records it running once its unit started, stopped once it ended); the
// others keep what the last round saw.
func (b *Broker) refresh(name, parent string) {
	b.roundMu.Lock()
	defer b.roundMu.Unlock()
	ctx, cancel := context.WithTimeout(b.ctx, roundTimeout)
	defer cancel()
	prev := b.snap.Load()
	fresh, err := b.store.StatusesSince(ctx, prev.statusSeq)
	if err != nil {
		b.log.Warn("refresh: statuses", "err", err)
		return
	}
	e := &snapEdit{next: &Snapshot{Children: prev.Children, Statuses: prev.Statuses, Grants: prev.Grants,
		parents: prev.parents, uuids: prev.uuids, statusSeq: prev.statusSeq}}
	root := name
	if p, ok := prev.parents[name]; ok {
		root = p
	} else if parent != "" {
		root = parent
	}
	kids, err := b.store.Children(ctx, root)
	if err != nil {
		b.log.Warn("refresh: children", "sandbox", root, "err", err)
		return
	}
	gone := map[string]bool{root: true, name: true}
	for _, c := range prev.Children[root] {
		gone[c.Name] = true
	}
	for _, n := range []string{root, name} {
		sb, err := b.store.Sandbox(ctx, n)
		if err == nil {
			kids = append(kids, sb)
		} else if !errors.Is(err, store.ErrNotFound) {
			b.log.Warn("refresh: read sandbox", "sandbox", n, "err", err)
			return
		}
	}
	for _, sb := range kids {
		delete(gone, sb.Name)
		e.update(sb, sb.Name == name)
	}
	for n := range gone {
		e.forget(n)
	}
	if len(fresh) > 0 {
		e.statuses()
		e.next.fold(fresh, func(n string) bool {
			if gone[n] {
				return false
			}
			_, err := b.store.Sandbox(ctx, n)
			return err == nil
		})
	}
	next := e.next
	b.snap.Store(next)
	b.orchestrator.ScheduleFinishes(ctx)
}

// snapEdit makes a snapshot from the last one, copying each of its maps
// before its first change (readers hold the last one).
type snapEdit struct {
	next                                                      *Snapshot
	ownChildren, ownGrants, ownParents, ownStatuses, ownUUIDs bool
}

func (e *snapEdit) children() map[string][]wire.ChildInfo {
	if !e.ownChildren {
		e.next.Children, e.ownChildren = clone(e.next.Children), true
	}
	return e.next.Children
}

func (e *snapEdit) grants() map[string]json.RawMessage {
	if !e.ownGrants {
		e.next.Grants, e.ownGrants = clone(e.next.Grants), true
	}
	return e.next.Grants
}

func (e *snapEdit) parents() map[string]string {
	if !e.ownParents {
		e.next.parents, e.ownParents = clone(e.next.parents), true
	}
	return e.next.parents
}

func (e *snapEdit) statuses() map[string][]store.Item {
	if !e.ownStatuses {
		e.next.Statuses, e.ownStatuses = clone(e.next.Statuses), true
	}
	return e.next.Statuses
}

func (e *snapEdit) uuids() map[string]string {
	if !e.ownUUIDs {
		e.next.uuids, e.ownUUIDs = clone(e.next.uuids), true
	}
	return e.next.uuids
}

// clone copies m; a nil m (the empty snapshot before the first round)
// gives an empty map.
func clone[M ~map[K]V, K comparable, V any](m M) M {
	if m == nil {
		return M{}
	}
	return maps.Clone(m)
}

// update puts sb's record in the snapshot. named: sb is the sandbox the
// host command named, running when its record says so.
func (e *snapEdit) update(sb store.Sandbox, named bool) {
	if e.next.uuids[sb.Name] != sb.UUID {
		// A new sandbox under the name: nothing of the one before is its.
		if _, ok := e.next.Statuses[sb.Name]; ok {
			delete(e.statuses(), sb.Name)
		}
		e.uuids()[sb.Name] = sb.UUID
	}
	switch sb.Role {
	case wire.RoleOrchestrator:
		if old, had := e.next.Grants[sb.Name]; had != (sb.Grant != "") || string(old) != sb.Grant {
			delete(e.grants(), sb.Name)
			if sb.Grant != "" {
				e.grants()[sb.Name] = json.RawMessage(sb.Grant)
			}
		}
	case wire.RoleChild:
		kids := e.next.Children[sb.Parent]
		i, found := slices.BinarySearchFunc(kids, sb.Name, func(c wire.ChildInfo, n string) int { return strings.Compare(c.Name, n) })
		running := found && kids[i].Running
		if named || !found {
			running = sb.State == store.StateRunning || sb.State == store.StateReady || (sb.State == store.StateCreating && running)
		}
		if found && kids[i] == childInfo(sb, running) {
			return
		}
		kids = slices.Clone(kids)
		if found {
			kids[i] = childInfo(sb, running)
		} else {
			kids = slices.Insert(kids, i, childInfo(sb, running))
		}
		e.children()[sb.Parent] = kids
		e.parents()[sb.Name] = sb.Parent
	}
}

// forget takes a destroyed sandbox out of the snapshot.
func (e *snapEdit) forget(name string) {
	if _, ok := e.next.Statuses[name]; ok {
		delete(e.statuses(), name)
	}
	if _, ok := e.next.uuids[name]; ok {
		delete(e.uuids(), name)
	}
	if _, ok := e.next.Grants[name]; ok {
		delete(e.grants(), name)
	}
	if _, ok := e.next.Children[name]; ok {
		delete(e.children(), name)
	}
	parent, ok := e.next.parents[name]
	if !ok {
		return
	}
	delete(e.parents(), name)
	kids := slices.DeleteFunc(slices.Clone(e.next.Children[parent]), func(c wire.ChildInfo) bool { return c.Name == name })
	if len(kids) == 0 {
		delete(e.children(), parent)
	} else {
		e.children()[parent] = kids
	}
}

// HoldRoundsForTest stops (on) or lets go (off) the round loop, so a test
// sees what host commands publish by themselves.
func (b *Broker) HoldRoundsForTest(on bool) { b.roundsHeld.Store(on) }

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
