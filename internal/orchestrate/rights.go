package orchestrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/grant"
	"agentbox/internal/manifest"
	"agentbox/internal/serial"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// EgressHook is what the egress proxy learns from the rights: it reads a
// sandbox's current rights (EgressRights) and is told after every change
// of them (granted, revoked, expired, by hand), with the egress and loose
// rights the sandbox lost, so it decides new connections anew and closes
// those rights' live ones.
type EgressHook interface {
	Changed(sandbox string, ended []store.Right)
}

// EgressRights is what a sandbox may reach through the egress proxy now.
type EgressRights struct {
	Egress []string // hosts and *.domain entries
	Loose  bool
	// RepoCap is the repository's orchestration.cap egress list; nil: no
	// cap (loose reaches any host).
	RepoCap []string
	// Until is when the first of them expires (zero: none does): the
	// proxy reads them again then, without waiting for a round.
	Until time.Time
}

// EgressRights returns sandbox's current egress rights for the proxy.
func (o *Orchestrator) EgressRights(ctx context.Context, sandbox string) (EgressRights, error) {
	sb, err := o.Store.Sandbox(ctx, sandbox)
	if err != nil {
		return EgressRights{}, err
	}
	rights, err := o.Store.Rights(ctx, sandbox)
	if err != nil {
		return EgressRights{}, err
	}
	var out EgressRights
	now := time.Now()
	for _, r := range rights {
		if !r.Expires.IsZero() && !r.Expires.After(now) {
			continue // expired; the next round removes it
		}
		switch r.Kind {
		case store.RightEgress:
			out.Egress = append(out.Egress, r.Item)
		case store.RightLoose:
			out.Loose = true
		default:
			continue
		}
		if !r.Expires.IsZero() && (out.Until.IsZero() || r.Expires.Before(out.Until)) {
			out.Until = r.Expires
		}
	}
	repo, err := LoadRepoConfig(sb.Repo)
	if err != nil {
		return EgressRights{}, err
	}
	out.RepoCap = repo.Orchestration.Cap.Egress
	return out, nil
}

// Rights runs a rights manifest: an orchestrator's about its child, or a
// child's revoke-only one about itself.
func (o *Orchestrator) Rights(ctx context.Context, req wire.Caller, m *manifest.Manifest) (store.Sent, error) {
	if req.Role == wire.RoleChild {
		return o.selfRights(ctx, req, m)
	}
	return o.childManifest(ctx, req, m, m.Rights.Child, func(sb store.Sandbox) (string, error) {
		detail, _, err := o.applyRights(ctx, sb, m.Rights)
		return detail, err
	})
}

// selfRights is a child's revoke of its own rights: its parent gets a note
// naming what it gave up.
func (o *Orchestrator) selfRights(ctx context.Context, req wire.Caller, m *manifest.Manifest) (store.Sent, error) {
	prev, found, err := o.Store.BeginManifest(ctx, req.Sandbox, m.ID, string(m.Type))
	if err != nil || found {
		return prev, err
	}
	sb, err := o.Store.Sandbox(ctx, req.Sandbox)
	if err != nil {
		return store.Sent{}, err
	}
	detail, gaveUp, err := o.applyRights(ctx, sb, m.Rights)
	if err != nil {
		o.logger().Error("manifest failed", "sandbox", req.Sandbox, "manifest", m.ID, "type", m.Type, "err", err)
		return o.Store.FinishManifest(ctx, req.Sandbox, m.ID, wire.StateFailed, "rights of `"+sb.Name+"` failed (see the broker log)")
	}
	if len(gaveUp) > 0 && sb.Parent != "" {
		body := fmt.Sprintf("%s gave up: %s", sb.Name, strings.Join(gaveUp, ", "))
		if _, err := o.Store.DeliverHostMessage(ctx, sb.Parent, sb.Name, manifest.MsgNote, body); err != nil {
			o.logger().Error("rights: note to the parent", "sandbox", sb.Name, "err", err)
		} else {
			o.notify(sb.Parent)
		}
	}
	return o.Store.FinishManifest(ctx, req.Sandbox, m.ID, wire.StateDone, detail)
}

// lockRights takes rightsMu for a holder of the broker's turn, waiting
// for it outside the turn: its holder may be a round detaching an expired
// mount, whose scan of the sandbox's processes (which the sandbox
// shapes) takes up to holders' bound, and the executor must serve others
// meanwhile. Once the mutex is the caller's, its turn is back and stays
// (serial.Pin) until unlock, but for a detach (detachMount): nobody
// waits for the mutex with a turn, so the two can never wait for each
// other. What the caller read before may have changed meanwhile.
func (o *Orchestrator) lockRights(ctx context.Context) (context.Context, func()) {
	serial.Outside(ctx, o.rightsMu.Lock)
	return serial.Pin(ctx), o.rightsMu.Unlock
}

// rightsPlan is what one rights manifest changes.
type rightsPlan struct {
	del, put []store.Right
	attach   []string // mount names newly granted
	detach   []string // mount names revoked
	notes    []string
	revoked  []string // keys revoked
	granted  []string // keys granted or extended
}

// applyRights revokes, then grants, r's items on sb as one: the backend
// steps (mounts) first, undone in reverse if one fails, then the store in
// one transaction. It returns the done detail and the keys revoked.
func (o *Orchestrator) applyRights(ctx context.Context, sb store.Sandbox, r *manifest.Rights) (string, []string, error) {
	ctx, unlock := o.lockRights(ctx)
	defer unlock()
	cur, err := o.Store.Rights(ctx, sb.Name)
	if err != nil {
		return "", nil, err
	}
	p := planRights(sb.Name, cur, r, time.Now())
	if sb.State == store.StateQueued {
		p.detach, p.attach = nil, nil // no sandbox yet: made with its rights
	}
	if err := o.applyMounts(ctx, sb.Name, p.detach, p.attach); err != nil {
		return "", nil, err
	}
	if err := o.Store.ChangeRights(ctx, p.del, p.put); err != nil {
		o.undoMounts(context.WithoutCancel(ctx), sb.Name, p.detach, p.attach)
		return "", nil, err
	}
	o.egressChanged(sb.Name, p.del)
	return rightsDetail(p, r.Grant), p.revoked, nil
}

// planRights works out the changes: a revoke touches only what
// orchestration gave; a grant skips what is held by hand and never
// shortens an expiry.
func planRights(sandbox string, cur []store.Right, r *manifest.Rights, now time.Time) rightsPlan {
	held := map[string]store.Right{}
	for _, c := range cur {
		held[c.Key()] = c
	}
	var p rightsPlan
	if r.Revoke != nil {
		for _, it := range items(sandbox, *r.Revoke) {
			h, ok := held[it.Key()]
			switch {
			case !ok:
				p.notes = append(p.notes, it.Key()+" was not held")
			case h.Owner != store.OwnerOrchestration:
				p.notes = append(p.notes, it.Key()+" was not given by orchestration; left as is")
			default:
				p.del = append(p.del, h)
				p.revoked = append(p.revoked, it.Key())
				if h.Kind == store.RightMount {
					p.detach = append(p.detach, h.Item)
				}
			}
		}
	}
	if g := r.Grant; g != nil {
		var exp time.Time
		if t, ok := g.ExpiresAt(now); ok {
			exp = t
		}
		for _, it := range items(sandbox, g.Items) {
			it.Owner, it.Expires = store.OwnerOrchestration, exp
			h, ok := held[it.Key()]
			switch {
			case ok && h.Owner != store.OwnerOrchestration:
				p.notes = append(p.notes, it.Key()+" is held by hand; left as is")
				continue
			case ok && !laterExpiry(exp, h.Expires):
				p.notes = append(p.notes, it.Key()+" keeps its "+expiryText(h.Expires))
				continue
			case !ok && it.Kind == store.RightMount:
				p.attach = append(p.attach, it.Item)
			}
			p.put = append(p.put, it)
			p.granted = append(p.granted, it.Key())
		}
	}
	return p
}

// items lists a rights set as store rights of sandbox (no owner, expiry).
func items(sandbox string, r grant.Rights) []store.Right {
	var out []store.Right
	if r.Loose {
		out = append(out, store.Right{Sandbox: sandbox, Kind: store.RightLoose})
	}
	for _, m := range r.Mounts {
		out = append(out, store.Right{Sandbox: sandbox, Kind: store.RightMount, Item: m})
	}
	for _, h := range r.Egress {
		out = append(out, store.Right{Sandbox: sandbox, Kind: store.RightEgress, Item: h})
	}
	return out
}

// laterExpiry reports whether a ends after b (zero: never ends).
func laterExpiry(a, b time.Time) bool {
	switch {
	case b.IsZero():
		return false
	case a.IsZero():
		return true
	}
	return a.After(b)
}

func expiryText(t time.Time) string {
	if t.IsZero() {
		return "permanent right (no expiry)"
	}
	return "later expiry " + t.UTC().Format(time.RFC3339)
}

// rightsDetail is the done detail: what was revoked, granted (and until
// when) and left as is.
func rightsDetail(p rightsPlan, g *manifest.RightsGrant) string {
	var parts []string
	if len(p.revoked) > 0 {
		parts = append(parts, "revoked "+strings.Join(p.revoked, ", "))
	}
	if len(p.granted) > 0 {
		until := "for " + g.For
		if g.Never {
			until = "(no expiry)"
		}
		parts = append(parts, "granted "+strings.Join(p.granted, ", ")+" "+until)
	}
	parts = append(parts, p.notes...)
	return strings.Join(parts, "; ")
}

// applyMounts detaches, then attaches, the named mounts of sandbox; on an
// error it undoes what it did, best effort, and returns the error. A
// stopped local sandbox takes its mounts when it starts (AttachRights).
func (o *Orchestrator) applyMounts(ctx context.Context, sandbox string, detach, attach []string) error {
	cleanup := context.WithoutCancel(ctx)
	var undo []func()
	fail := func(err error) error {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return err
	}
	for _, name := range detach {
		hm, err := o.hostMount(name)
		if err != nil {
			continue // no longer configured: nothing can be attached
		}
		if err := o.detachMount(ctx, sandbox, hm); err != nil && !errors.Is(err, backend.ErrNotRunning) {
			return fail(err)
		}
		undo = append(undo, func() { o.attachBestEffort(cleanup, sandbox, hm) })
	}
	for _, name := range attach {
		hm, err := o.hostMount(name)
		if err != nil {
			return fail(err)
		}
		if err := o.Backend.AttachMount(ctx, sandbox, hm); err != nil && !errors.Is(err, backend.ErrNotRunning) {
			return fail(err)
		}
		undo = append(undo, func() { o.detachMount(cleanup, sandbox, hm) })
	}
	return nil
}

// detachMount detaches hm from sandbox out of the executor's line: the
// detach ends the processes that hold the mount, a scan of processes the
// sandbox shapes (up to holders' bound, seconds), and every other
// sandbox's mutations run meanwhile. The caller holds rightsMu, and
// nobody waits for that with a turn (lockRights). A host stop or destroy
// --force of the sandbox cuts the scan (Interrupt), as it cuts commands
// in it: the stop ends every holder anyway.
func (o *Orchestrator) detachMount(ctx context.Context, sandbox string, hm backend.HostMount) (err error) {
	serial.Outside(serial.Unpin(ctx), func() {
		ctx, done := o.inflight.begin(ctx, sandbox)
		defer done()
		err = o.Backend.DetachMount(ctx, sandbox, hm.Device())
	})
	return err
}

// undoMounts reverses applyMounts, best effort.
func (o *Orchestrator) undoMounts(ctx context.Context, sandbox string, detached, attached []string) {
	for _, name := range attached {
		if hm, err := o.hostMount(name); err == nil {
			o.detachMount(ctx, sandbox, hm)
		}
	}
	for _, name := range detached {
		if hm, err := o.hostMount(name); err == nil {
			o.attachBestEffort(ctx, sandbox, hm)
		}
	}
}

func (o *Orchestrator) attachBestEffort(ctx context.Context, sandbox string, hm backend.HostMount) {
	if err := o.Backend.AttachMount(ctx, sandbox, hm); err != nil && !errors.Is(err, backend.ErrNotRunning) {
		o.logger().Error("rights: re-attach mount", "sandbox", sandbox, "mount", hm.Name, "err", err)
	}
}

// hostMount is broker.yaml's mount name.
func (o *Orchestrator) hostMount(name string) (backend.HostMount, error) {
	d, ok := o.Sandboxes.Mounts[name]
	if !ok {
		return backend.HostMount{}, fmt.Errorf("mount `%s` is not in the broker's mounts", name)
	}
	return backend.HostMount{Name: name, Source: d.Path, ReadOnly: d.ReadOnly}, nil
}

// egressChanged tells the egress hook that sandbox's rights changed and
// which of them (mounts aside) it lost.
func (o *Orchestrator) egressChanged(sandbox string, lost []store.Right) {
	if o.Egress == nil {
		return
	}
	var ended []store.Right
	for _, r := range lost {
		if r.Kind != store.RightMount {
			ended = append(ended, r)
		}
	}
	o.Egress.Changed(sandbox, ended)
}

// AttachRights attaches sandbox's mount rights that are not attached yet:
// after every start (a local sandbox loses its mounts when it stops; an
// Incus one keeps its devices). A mount that fails is logged and left.
func (o *Orchestrator) AttachRights(ctx context.Context, sandbox string) {
	ctx, unlock := o.lockRights(ctx)
	defer unlock()
	rights, err := o.Store.Rights(ctx, sandbox)
	if err != nil {
		o.logger().Error("rights: list", "sandbox", sandbox, "err", err)
		return
	}
	var attached map[string]bool
	for _, r := range rights {
		if r.Kind != store.RightMount {
			continue
		}
		hm, err := o.hostMount(r.Item)
		if err != nil {
			o.logger().Error("rights: attach mount", "sandbox", sandbox, "mount", r.Item, "err", err)
			continue
		}
		if attached == nil {
			attached = o.attachedDevices(ctx, sandbox)
		}
		if !attached[hm.Device()] {
			o.attachBestEffort(ctx, sandbox, hm)
		}
	}
}

// attachedDevices lists the attachments sandbox has now.
func (o *Orchestrator) attachedDevices(ctx context.Context, sandbox string) map[string]bool {
	out := map[string]bool{}
	insts, err := o.Backend.List(ctx)
	if err != nil {
		return out
	}
	for _, in := range insts {
		if in.Name == sandbox {
			for _, m := range in.Mounts {
				out[m.Name] = true
			}
		}
	}
	return out
}

// StartUnit starts sandbox's unit and attaches its mount rights. The unit
// starts in the caller's turn. A backend's step inside the started unit
// (backend.SteppedStarter: the Incus egress relay, which root inside can
// hold up for its whole bound, 30 s) runs out of the executor's line,
// registered like a command in the sandbox, so a host stop or destroy
// --force cuts it. Other mutations run meanwhile, of this sandbox too: a
// caller that writes its record after StartUnit reads it again first.
func (o *Orchestrator) StartUnit(ctx context.Context, sandbox string) error {
	stepped, ok := o.Backend.(backend.SteppedStarter)
	if !ok {
		if err := o.Backend.Start(ctx, sandbox); err != nil {
			return err
		}
	} else {
		if err := stepped.StartUnit(ctx, sandbox); err != nil {
			return err
		}
		sctx, done := o.inflight.begin(ctx, sandbox)
		var err error
		serial.Outside(ctx, func() { err = stepped.FinishStart(sctx, sandbox) })
		if err != nil && context.Cause(sctx) == errInterrupted {
			err = errInterrupted
		}
		done()
		if err != nil {
			return err
		}
	}
	o.AttachRights(ctx, sandbox)
	return nil
}

// stopIfRecordedStopped stops name's unit while its record says stopped:
// a start's last step runs out of line, and the host may have started the
// sandbox for good, or destroyed it, meanwhile.
func (o *Orchestrator) stopIfRecordedStopped(ctx context.Context, name string) {
	ctx = context.WithoutCancel(ctx)
	sb, err := o.Store.Sandbox(ctx, name)
	if errors.Is(err, store.ErrNotFound) || err == nil && sb.State != store.StateStopped {
		return
	}
	o.Backend.Stop(ctx, name)
}

// startStopped starts a sandbox recorded stopped for a transfer (an
// import, a fetch) and returns what stops it again. A start that fails
// partway may have left the unit up (a container whose last step timed
// out): it is stopped too, so a sandbox recorded stopped is not left
// running.
func (o *Orchestrator) startStopped(ctx context.Context, name string) (stop func(), err error) {
	stop = func() { o.stopIfRecordedStopped(ctx, name) }
	if err := o.StartUnit(ctx, name); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// spawnRightsFit checks a spawn's rights again as its child is about to
// start, with the check its send passed (manifest.CheckSpawnRights)
// against the orchestrator's grant and its repository's config as they
// are now: a queued spawn may start much later, after the host narrowed
// either, and its rights are then granted for good. A *stepError names
// the right that no longer fits; a config that cannot be read is a
// refusal, and fails the spawn too.
func (o *Orchestrator) spawnRightsFit(ctx context.Context, sb store.Sandbox, r grant.Rights) error {
	from, err := o.sender(ctx, wire.Caller{Sandbox: sb.Parent, Role: wire.RoleOrchestrator})
	if err != nil {
		return err
	}
	var ref *manifest.Refusal
	if err := manifest.CheckSpawnRights(from, r); errors.As(err, &ref) {
		return &stepError{reason: "its rights no longer fit your grant and the repository's orchestration.cap: " + ref.Detail}
	} else if err != nil {
		return err
	}
	return nil
}

// recordSpawnRights gives a new child its spawn's rights, owned by
// orchestration and permanent (also over a timed grant it had while it
// was queued; an item held by hand stays the host's), and attaches its
// mounts.
func (o *Orchestrator) recordSpawnRights(ctx context.Context, sandbox string, r grant.Rights) error {
	cur, err := o.Store.Rights(ctx, sandbox)
	if err != nil {
		return err
	}
	var put []store.Right
	for _, it := range items(sandbox, r) {
		if !slices.ContainsFunc(cur, func(c store.Right) bool { return c.Key() == it.Key() && c.Owner == store.OwnerHand }) {
			it.Owner = store.OwnerOrchestration
			put = append(put, it)
		}
	}
	if err := o.Store.ChangeRights(ctx, nil, put); err != nil {
		return err
	}
	o.egressChanged(sandbox, nil) // its proxy was served before them
	o.AttachRights(ctx, sandbox)
	return nil
}

// ExpireRights ends every right whose expiry passed: a mount is detached
// (a sandbox whose mount cannot be detached is stopped; if that fails too
// the right stays for the next round), an egress right's connections
// are closed by the proxy's hook. Rounds call it, the first one at start,
// so expiries that passed while the broker was down apply too.
func (o *Orchestrator) ExpireRights(ctx context.Context, now time.Time) {
	ctx, unlock := o.lockRights(ctx)
	defer unlock()
	expired, err := o.Store.ExpiredRights(ctx, now)
	if err != nil {
		o.logger().Error("rights: list expired", "err", err)
		return
	}
	for _, r := range expired {
		if r.Kind == store.RightMount {
			if err := o.applyMounts(ctx, r.Sandbox, []string{r.Item}, nil); err != nil {
				// Fail closed: what cannot be taken away (Incus: root
				// inside mounted it elsewhere) ends with the sandbox.
				o.logger().Error("rights: detach an expired mount failed: stopping the sandbox", "sandbox", r.Sandbox, "mount", r.Item, "err", err)
				if err := o.StopSandbox(ctx, r.Sandbox); err != nil {
					o.logger().Error("rights: stop", "sandbox", r.Sandbox, "err", err)
					continue // the right stays; the next round tries again
				}
			}
		}
		if err := o.Store.ChangeRights(ctx, []store.Right{r}, nil); err != nil {
			o.logger().Error("rights: remove an expired right", "sandbox", r.Sandbox, "err", err)
			continue
		}
		o.egressChanged(r.Sandbox, []store.Right{r})
		o.logger().Info("right expired", "sandbox", r.Sandbox, "right", r.Key())
	}
}

// HandRights removes, then adds, rights of sandbox by hand (the host's
// `jailbee rights`), and returns its rights after. Added items are owned
// by hand and never expire: orchestration's revokes leave them. Mounts
// attach at once to a running sandbox; a failure undoes the mounts and
// changes nothing.
func (o *Orchestrator) HandRights(ctx context.Context, sandbox string, add, remove grant.Rights) ([]store.Right, []string, error) {
	ctx, unlock := o.lockRights(ctx)
	defer unlock()
	if _, err := o.Store.Sandbox(ctx, sandbox); errors.Is(err, store.ErrNotFound) {
		return nil, nil, o.NoSuchSandbox(ctx, sandbox)
	} else if err != nil {
		return nil, nil, err
	}
	for _, m := range add.Mounts {
		if _, err := o.hostMount(m); err != nil {
			return nil, nil, refusef("mount `%s` is not in broker.yaml's mounts", m)
		}
	}
	if err := add.CheckSyntax("add"); err != nil {
		return nil, nil, refusef("%s", err.Error())
	}
	cur, err := o.Store.Rights(ctx, sandbox)
	if err != nil {
		return nil, nil, err
	}
	held := map[string]store.Right{}
	for _, c := range cur {
		held[c.Key()] = c
	}
	var del, put []store.Right
	var detach, attach, notes []string
	for _, it := range items(sandbox, remove) {
		h, ok := held[it.Key()]
		if !ok {
			notes = append(notes, it.Key()+" was not held")
			continue
		}
		del = append(del, h)
		if h.Kind == store.RightMount {
			detach = append(detach, h.Item)
		}
	}
	for _, it := range items(sandbox, add) {
		it.Owner = store.OwnerHand
		if _, ok := held[it.Key()]; !ok && it.Kind == store.RightMount {
			attach = append(attach, it.Item)
		}
		put = append(put, it)
	}
	if err := o.applyMounts(ctx, sandbox, detach, attach); err != nil {
		return nil, nil, err
	}
	if err := o.Store.ChangeRights(ctx, del, put); err != nil {
		o.undoMounts(context.WithoutCancel(ctx), sandbox, detach, attach)
		return nil, nil, err
	}
	o.egressChanged(sandbox, del)
	after, err := o.Store.Rights(ctx, sandbox)
	return after, notes, err
}
