package broker

import (
	"context"
	"slices"

	"agentbox/internal/backend"
	"agentbox/internal/store"
)

// A raw copy of a sandbox made with the backend's own tools (`incus copy`)
// carries its original's socket attachment: the copy could speak as the
// original. Each round compares what the backend reports with the
// records and, where a sandbox's socket directory is attached to another
// instance, detaches it there (whether or not that works) and serves the
// original at a fresh directory: the old directory and every connection
// to it go, and the original's client reconnects to the new one.

// socketPlan is what a round must change about sockets.
type socketPlan struct {
	detach  []string // instances whose socket attachment is not theirs
	reserve []string // sandboxes to serve at a fresh directory
}

func (p socketPlan) empty() bool { return len(p.detach) == 0 && len(p.reserve) == 0 }

// planSockets compares the instances' attachments with the records'
// socket directories.
func planSockets(records []store.Sandbox, insts []backend.Instance) socketPlan {
	owner := map[string]store.Sandbox{}
	for _, sb := range records {
		if sb.SocketDir != "" {
			owner[sb.SocketDir] = sb
		}
	}
	var p socketPlan
	for _, in := range insts {
		if in.SocketDir == "" {
			continue
		}
		// Only a directory a record claims counts: a round may read the
		// records just before a new sandbox's claim and the backend just
		// after its attachment.
		sb, ok := owner[in.SocketDir]
		if !ok || sb.Name == in.Name {
			continue
		}
		p.detach = append(p.detach, in.Name)
		if !slices.Contains(p.reserve, sb.Name) {
			p.reserve = append(p.reserve, sb.Name)
		}
	}
	return p
}

// defendSockets carries a plan out, in order with the broker's other
// mutations; one at a time.
func (b *Broker) defendSockets(p socketPlan) {
	if p.empty() || !b.defending.CompareAndSwap(false, true) {
		return
	}
	b.goWorker(func() {
		defer b.defending.Store(false)
		b.runExec(b.ctx, nil, func() {
			ctx, cancel := context.WithTimeout(b.ctx, roundTimeout)
			defer cancel()
			for _, name := range p.detach {
				b.log.Warn("an instance carries another sandbox's socket (a raw copy?): detaching it", "instance", name)
				if err := b.cfg.Backend.DetachSocket(ctx, name); err != nil {
					b.log.Warn("detach a copied socket", "instance", name, "err", err)
				}
			}
			for _, name := range p.reserve {
				sb, err := b.store.Sandbox(ctx, name)
				if err != nil || b.server(name) == nil {
					continue
				}
				b.stopServing(name) // its connections and its directory go
				if err := b.serveSandbox(sb); err != nil {
					b.log.Error("serve at a fresh socket directory", "sandbox", name, "err", err)
					continue
				}
				b.log.Warn("socket moved to a fresh directory: its old one was attached elsewhere", "sandbox", name)
			}
		})
	})
}
