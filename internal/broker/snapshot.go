package broker

import (
	"context"
	"encoding/json"
	"time"

	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// Snapshot is the immutable view a completed round publishes. children,
// status and grant read it without touching the store or the backend.
type Snapshot struct {
	Round    uint64
	At       time.Time
	Children map[string][]ChildInfo       // by orchestrator
	Statuses map[string][]json.RawMessage // by sandbox: latest status per ref
	Grants   map[string]json.RawMessage   // by orchestrator
}

// ChildInfo is one entry of the children op's result.
type ChildInfo struct {
	Name    string `json:"name"`
	Branch  string `json:"branch"`
	State   string `json:"state"`
	Running bool   `json:"running"`
}

// roundLoop runs a round every RoundInterval and whenever one is
// requested (coalesced).
func (b *Broker) roundLoop() {
	t := time.NewTicker(RoundInterval)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		case <-b.rounds:
		}
		b.runRound()
	}
}

// requestRound asks for a round soon; requests coalesce.
func (b *Broker) requestRound() {
	select {
	case b.rounds <- struct{}{}:
	default:
	}
}

// runRound reconciles what the broker knows and publishes a new snapshot.
func (b *Broker) runRound() {
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
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
	} else {
		b.log.Warn("round: list backend", "err", err)
	}
	statuses, err := b.store.LatestStatuses(ctx)
	if err != nil {
		b.log.Warn("round: statuses", "err", err)
		return
	}
	prev := b.snap.Load()
	next := &Snapshot{
		Round:    prev.Round + 1,
		At:       time.Now(),
		Children: map[string][]ChildInfo{},
		Statuses: map[string][]json.RawMessage{},
		Grants:   map[string]json.RawMessage{},
	}
	for _, sb := range sbs {
		switch sb.Role {
		case store.RoleChild:
			next.Children[sb.Parent] = append(next.Children[sb.Parent], ChildInfo{
				Name: sb.Name, Branch: sb.Branch, State: sb.State, Running: running[sb.Name]})
		case store.RoleOrchestrator:
			if sb.Grant != "" {
				next.Grants[sb.Name] = json.RawMessage(sb.Grant)
			}
		}
	}
	for sb, items := range statuses {
		for _, it := range items {
			next.Statuses[sb] = append(next.Statuses[sb], it.Doc)
		}
	}
	b.snap.Store(next)
}

// Snapshot returns the last published snapshot.
func (b *Broker) Snapshot() *Snapshot { return b.snap.Load() }

func (b *Broker) opChildren(_ context.Context, c *call) *reply {
	if werr := decodeArgs(c.args, &struct{}{}); werr != nil {
		return replyErr(werr)
	}
	kids := b.snap.Load().Children[c.caller.Sandbox]
	if kids == nil {
		kids = []ChildInfo{}
	}
	return replyOK(map[string]any{"children": kids})
}

// StatusArgs are status's arguments.
type StatusArgs struct {
	Ref string `json:"ref,omitempty"`
}

func (b *Broker) opStatus(_ context.Context, c *call) *reply {
	var args StatusArgs
	if werr := decodeArgs(c.args, &args); werr != nil {
		return replyErr(werr)
	}
	all := b.snap.Load().Statuses[c.caller.Sandbox]
	if args.Ref == "" {
		if all == nil {
			all = []json.RawMessage{}
		}
		return replyOK(map[string]any{"statuses": all})
	}
	for _, doc := range all {
		var st wire.StatusItem
		if json.Unmarshal(doc, &st) == nil && st.Ref == args.Ref {
			return &reply{resp: &wire.Response{V: wire.Version, OK: true, Result: doc}}
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
