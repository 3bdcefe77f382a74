package broker

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/orchestrate"
	"agentbox/internal/store"
)

// Each round compares what the backend reports with the records, and
// repairs what someone changed behind the broker's back with the
// backend's own tools:
//
//   - A raw copy of a sandbox (`incus copy`) carries its original's socket
//     attachment: the copy could speak as the original. The copy's
//     attachment is removed (whether or not that works) and the original
//     is served at a fresh directory: the old directory and every
//     connection to it go, and the original's client reconnects. Every
//     attachment counts, under whatever name, whose host path is another
//     sandbox's socket directory, inside one, or above one.
//   - Root inside a sandbox may cover what the backend placed there (its
//     socket directory, the jailbee client) with a mount of its own: the
//     backend puts them back on top (Backend.Restore).
//   - Two instances sharing a sandbox's uuid (an `incus import` of its
//     backup beside it) cannot be told apart: neither gets a socket while
//     both exist. Once only the sandbox's own instance is left, it is
//     served at a fresh directory.
//   - A sandbox whose instance is gone (deleted outside jailbee, or
//     replaced by another instance of its name) loses its record; a
//     child's orchestrator is told.
//   - A sandbox recorded running whose instance is not (its unit ended
//     with no stop: the OOM killer took its supervisor, say) is recorded
//     stopped; the orchestrator of a child whose agent was at work is told.
//
// A round only plans; the repair re-plans from a fresh look at the
// records and the backend in order with the broker's other mutations, so
// it never acts on a create or destroy that was half done when the round
// looked.

// repairPlan is what a round must repair.
type repairPlan struct {
	detach   []detachment // attachments of socket directories not the instance's own
	reserve  []string     // sandboxes to serve at a fresh directory (copied)
	conflict []string     // sandboxes whose uuid several instances share: unserve
	resolved []string     // sandboxes whose uuid conflict is over: serve afresh
	vanished []string     // sandboxes whose instance is gone: forget
	restore  []string     // sandboxes something inside covers: put back what the backend placed
	ended    []string     // sandboxes recorded running whose instance is not: record them stopped
}

// detachment is one attachment to remove.
type detachment struct{ instance, mount string }

func (p repairPlan) empty() bool {
	return len(p.detach)+len(p.reserve)+len(p.conflict)+len(p.resolved)+len(p.vanished)+len(p.restore)+len(p.ended) == 0
}

// mountsOf is every host path attached to in, its socket directory
// among them.
func mountsOf(in backend.Instance) []backend.Mount {
	out := in.Mounts
	if in.SocketDir != "" && !slices.Contains(out, backend.Mount{Name: backend.SocketDeviceName, Source: in.SocketDir}) {
		out = append(slices.Clip(out), backend.Mount{Name: backend.SocketDeviceName, Source: in.SocketDir})
	}
	return out
}

// overlapping returns, sorted, the directories of dirs (sorted, the keys
// of owner) that a host path attached as source reaches: source itself,
// a directory above it (found by lookup) or one inside it (by binary
// search), so a round's cost grows as n log n with the sandboxes, not as
// n squared.
func overlapping(dirs []string, owner map[string]store.Sandbox, source string) []string {
	source = filepath.Clean(source)
	var out []string
	for p := source; ; p = filepath.Dir(p) {
		if _, ok := owner[p]; ok {
			out = append(out, p)
		}
		if p == "/" || p == "." {
			break
		}
	}
	prefix := strings.TrimSuffix(source, "/") + "/"
	i, _ := slices.BinarySearch(dirs, prefix)
	for ; i < len(dirs) && strings.HasPrefix(dirs[i], prefix); i++ {
		out = append(out, dirs[i])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// planRepairs compares the records with the backend's instances;
// conflicted holds the sandboxes already unserved for a uuid conflict.
func planRepairs(records []store.Sandbox, insts []backend.Instance, conflicted map[string]bool) repairPlan {
	var p repairPlan
	byUUID := map[string][]backend.Instance{}
	byName := map[string]backend.Instance{}
	for _, in := range insts {
		byUUID[in.UUID] = append(byUUID[in.UUID], in)
		byName[in.Name] = in
	}
	detach := func(name, mount string) {
		if d := (detachment{name, mount}); !slices.Contains(p.detach, d) {
			p.detach = append(p.detach, d)
		}
	}
	unserved := map[string]bool{} // in conflict or vanished: no fresh socket
	owner := map[string]store.Sandbox{}
	for _, sb := range records {
		if sb.SocketDir != "" {
			owner[sb.SocketDir] = sb
			owner[modelDirOf(sb.SocketDir)] = sb
		}
		if !orchestrate.HasInstance(sb) {
			continue
		}
		twins := byUUID[sb.UUID]
		if len(twins) > 1 {
			for _, in := range twins {
				if in.SocketDir != "" {
					detach(in.Name, backend.SocketDeviceName)
				}
				if in.ModelDir != "" {
					detach(in.Name, backend.ModelDeviceName)
				}
			}
			if !conflicted[sb.Name] {
				p.conflict = append(p.conflict, sb.Name)
			}
			unserved[sb.Name] = true
			continue
		}
		if in, ok := byName[sb.Name]; !ok || in.UUID != sb.UUID {
			// A worker at it (Phase) fails on its own and says why.
			if sb.Phase == "" {
				p.vanished = append(p.vanished, sb.Name)
				unserved[sb.Name] = true
			}
			continue
		}
		if conflicted[sb.Name] {
			p.resolved = append(p.resolved, sb.Name)
			unserved[sb.Name] = true
			continue
		}
		if in := byName[sb.Name]; len(in.Covered) > 0 {
			p.restore = append(p.restore, sb.Name)
		}
		if !byName[sb.Name].Running && sb.Phase == "" && (sb.State == store.StateRunning || sb.State == store.StateReady) {
			p.ended = append(p.ended, sb.Name) // a worker at it (Phase) fails on its own
		}
	}
	// Only a directory a record claims counts: a round may read the
	// records just before a new sandbox's claim and the backend just
	// after its attachment.
	dirs := slices.Sorted(maps.Keys(owner))
	for _, in := range insts {
		for _, m := range mountsOf(in) {
			for _, dir := range overlapping(dirs, owner, m.Source) {
				sb := owner[dir]
				if sb.Name == in.Name {
					continue
				}
				detach(in.Name, m.Name)
				if !unserved[sb.Name] && !slices.Contains(p.reserve, sb.Name) {
					p.reserve = append(p.reserve, sb.Name)
				}
			}
		}
	}
	return p
}

// repair carries out what a round found, in a worker, in order with the
// broker's other mutations; one repair at a time.
func (b *Broker) repair(found repairPlan) {
	if found.empty() || !b.repairing.CompareAndSwap(false, true) {
		return
	}
	b.goWorker(func() {
		defer b.repairing.Store(false)
		b.runExec(b.ctx, nil, nil, func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, roundTimeout)
			defer cancel()
			records, err := b.store.Sandboxes(ctx)
			if err != nil {
				b.log.Warn("repair: list sandboxes", "err", err)
				return
			}
			insts, err := b.cfg.Backend.List(ctx)
			if err != nil {
				b.log.Warn("repair: list backend", "err", err)
				return
			}
			conflicted := b.conflictedNow()
			for name := range conflicted {
				if !slices.ContainsFunc(records, func(sb store.Sandbox) bool { return sb.Name == name }) {
					b.setConflicted(name, false) // destroyed meanwhile
				}
			}
			b.carryOut(ctx, planRepairs(records, insts, conflicted), records)
		})
	})
}

// carryOut applies a plan made from records.
func (b *Broker) carryOut(ctx context.Context, p repairPlan, records []store.Sandbox) {
	record := func(name string) (store.Sandbox, bool) {
		i := slices.IndexFunc(records, func(sb store.Sandbox) bool { return sb.Name == name })
		if i < 0 {
			return store.Sandbox{}, false
		}
		return records[i], true
	}
	for _, d := range p.detach {
		b.log.Warn("an instance carries a socket that is not its own (a raw copy or import?): detaching it", "instance", d.instance, "mount", d.mount)
		if err := b.cfg.Backend.DetachMount(ctx, d.instance, d.mount); err != nil {
			b.log.Warn("detach a copied socket", "instance", d.instance, "mount", d.mount, "err", err)
		}
	}
	for _, name := range p.conflict {
		b.log.Warn("several instances share the uuid of a sandbox (an import beside it?): none gets a socket until only one is left", "sandbox", name)
		b.setConflicted(name, true)
		b.stopServing(name) // its connections and its directory go
	}
	for _, name := range p.resolved {
		b.setConflicted(name, false)
		if sb, ok := record(name); ok {
			b.serveAfresh(sb, "its uuid conflict is over")
		}
	}
	for _, name := range p.reserve {
		if sb, ok := record(name); ok && b.server(name) != nil {
			b.stopServing(name)
			b.serveAfresh(sb, "its old socket directory was attached elsewhere")
		}
	}
	for _, name := range p.restore {
		if !b.restores.take(name, time.Now()) {
			continue // restored lately: the next try waits (restoreBackoff)
		}
		b.log.Warn("something inside a sandbox covers what the broker placed there (a mount by root inside?): putting it back", "sandbox", name)
		if err := b.cfg.Backend.Restore(ctx, name); err != nil {
			b.log.Warn("put back what the broker placed in a sandbox", "sandbox", name, "err", err)
		}
	}
	for _, name := range p.ended {
		if sb, ok := record(name); ok {
			if err := b.orchestrator.RecordEnded(ctx, sb); err != nil {
				b.log.Error("record stopped a sandbox whose unit ended", "sandbox", name, "err", err)
			}
		}
	}
	for _, name := range p.vanished {
		b.setConflicted(name, false)
		if sb, ok := record(name); ok {
			if err := b.orchestrator.ForgetVanished(ctx, sb); err != nil {
				b.log.Error("forget a sandbox deleted outside jailbee", "sandbox", name, "err", err)
			}
		}
	}
}

// serveAfresh serves sb at a fresh socket directory (stopServing removed
// its old one, so serveSandbox makes a new one).
func (b *Broker) serveAfresh(sb store.Sandbox, why string) {
	sb.SocketDir = ""
	if err := b.serveSandbox(sb); err != nil {
		b.log.Error("serve at a fresh socket directory", "sandbox", sb.Name, "err", err)
		return
	}
	b.log.Warn("socket served at a fresh directory: "+why, "sandbox", sb.Name)
}

func (b *Broker) conflictedNow() map[string]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.conflicted)
}

func (b *Broker) setConflicted(name string, on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if on {
		b.conflicted[name] = true
	} else {
		delete(b.conflicted, name)
	}
}

// Bounds of restoreBackoff.
const (
	firstRestoreDelay = RoundInterval
	maxRestoreDelay   = 5 * time.Minute
)

// restoreBackoff spaces out the repairs of a sandbox whose inside keeps
// covering what the backend placed there. Root inside can cover it again
// at once, and each restore is device changes made in the broker's one
// line of mutations, which every sandbox waits on: unspaced, one sandbox
// covering in a loop would hold that line several times a second. The
// cover hurts only the sandbox itself (its own client, its own socket),
// so it alone pays for the wait. The delay doubles while restores keep
// being needed, up to maxRestoreDelay, and starts over once the sandbox
// has stayed uncovered for twice the delay.
type restoreBackoff struct {
	mu sync.Mutex
	m  map[string]restoreState
}

type restoreState struct {
	next  time.Time // no restore before
	delay time.Duration
}

// take reports whether sandbox may be restored now, and if so counts it.
func (r *restoreBackoff) take(sandbox string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]restoreState{}
	}
	st := r.m[sandbox]
	if now.Before(st.next) {
		return false
	}
	if st.delay == 0 || now.Sub(st.next) > 2*st.delay {
		st.delay = firstRestoreDelay
	} else {
		st.delay = min(2*st.delay, maxRestoreDelay)
	}
	st.next = now.Add(st.delay)
	r.m[sandbox] = st
	for name, other := range r.m {
		if now.Sub(other.next) > 2*maxRestoreDelay {
			delete(r.m, name) // long quiet, or destroyed
		}
	}
	return true
}
