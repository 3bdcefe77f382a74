package orchestrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/crashpoint"
	"agentbox/internal/gitx"
	"agentbox/internal/grant"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// doneCleanupDelay is how long after an accepted done report the child is
// destroyed (on_done destroy): its agent's `send --wait` takes the reply
// first.
const doneCleanupDelay = 3 * time.Second

// childDone handles a child's message of kind done: accepted only with a
// clean work tree and HEAD on a branch; then its HEAD is recorded, fetched
// into the orchestrator's repository at refs/jailbee/from/<child>/<branch>,
// and the report delivered with the import's outcome and on_done; a
// destroy follows when on_done says so and the import succeeded. The id
// is journaled before any of it, so a resend acts once.
func (o *Orchestrator) childDone(ctx context.Context, req wire.Caller, m Message) (store.Sent, error) {
	prev, found, err := o.Store.BeginManifest(ctx, req.Sandbox, m.ID, string(manifest.TypeMessage))
	if err != nil || found {
		return prev, err
	}
	refuse := func(detail string) (store.Sent, error) {
		return o.Store.FinishManifest(ctx, req.Sandbox, m.ID, wire.StateRefused, detail)
	}
	child, err := o.Store.Sandbox(ctx, req.Sandbox)
	if err != nil {
		return store.Sent{}, err
	}
	parent, err := o.Store.Sandbox(ctx, req.Parent)
	if errors.Is(err, store.ErrNotFound) {
		return refuse(vanishedDetail(req.Parent))
	}
	if err != nil {
		return store.Sent{}, err
	}
	// One report of a child waits at a time: each queued one keeps its
	// body in broker.db and costs an import once it is delivered. (A
	// child's sends are one at a time, so none queues meanwhile.)
	if pending, found, err := o.Store.PendingFinish(ctx, child.Name); err != nil || found {
		if err != nil {
			return store.Sent{}, err
		}
		return refuse(fmt.Sprintf("your done report `%s` still waits for your orchestrator `%s`: it will be imported and delivered then; report done again once it was", pending, parent.Name))
	}
	work, err := o.readWork(ctx, child.Name)
	if err != nil {
		return refuse("could not record the done report: your repository does not answer")
	}
	if work.dirty {
		return refuse("uncommitted changes: commit everything before reporting done")
	}
	if work.branch == "" {
		return refuse("detached HEAD: check out your branch before reporting done")
	}

	if why, err := o.finishWaits(ctx, parent); err != nil || why != "" {
		if err != nil {
			return store.Sent{}, err
		}
		return o.queueFinish(ctx, child, parent, m, work, why)
	}
	imp := o.importDone(ctx, parent, child, work)
	crashpoint.Hit(crashpoint.DoneImported)
	sent, err := o.Store.DeliverMessage(ctx, store.Delivery{
		From: child.Name, To: parent.Name, ManifestID: m.ID, Kind: m.Kind, Body: m.Body, InReplyTo: m.InReplyTo,
		Import: &imp, Journaled: true, StatusDetail: doneDetail(parent.Name, imp),
		DoneHead: work.head, Cleanup: imp.OnDone == manifest.OnDoneDestroy,
	})
	if full, ok := errors.AsType[*store.InboxFullError](err); ok {
		if full.NeverFits() {
			return refuse(inboxFullDetail(full))
		}
		return o.queueFinish(ctx, child, parent, m, work, fmt.Sprintf("for room in the inbox of your orchestrator `%s`", parent.Name))
	}
	if err != nil {
		return sent, err
	}
	o.notify(parent.Name, child.Name)
	crashpoint.Hit(crashpoint.DoneDelivered)
	if imp.OnDone == manifest.OnDoneDestroy {
		o.destroyAfterDone(child.Name, work.head)
	}
	return sent, nil
}

// doneDetail is the done status of a delivered done report.
func doneDetail(parent string, imp store.ImportResult) string {
	detail := fmt.Sprintf("delivered to %s: imported as %s at %s", parent, imp.Ref, short(imp.SHA))
	if imp.Error != "" {
		detail = fmt.Sprintf("delivered to %s with an import error (%s)", parent, imp.Error)
	}
	if imp.OnDone == manifest.OnDoneDestroy {
		return detail + "; this child will be destroyed"
	}
	return detail + "; this child is kept"
}

// importDone imports a done child's HEAD into its orchestrator and decides
// what becomes of the child: its spawn's on_done, kept when the import
// failed or the grant no longer holds destroy.
func (o *Orchestrator) importDone(ctx context.Context, parent, child store.Sandbox, work workState) store.ImportResult {
	imp := store.ImportResult{OnDone: manifest.OnDoneKeep}
	var doc spawnDoc
	if child.SpawnDoc != "" {
		json.Unmarshal([]byte(child.SpawnDoc), &doc)
		imp.OnDone = doc.OnDone
	} else {
		imp.OnDoneReason = "made on the host, not spawned: nothing asked for its destroy"
	}
	ctx, cancel := context.WithTimeout(ctx, importTimeout)
	defer cancel()
	ref := ImportRefPrefix + child.Name + "/" + work.branch
	if err := gitx.Transfer(ctx, o.checkout(child.Name), work.head, o.checkout(parent.Name), ref, gitx.TransferOptions{}); err != nil {
		o.logger().Error("done import failed", "sandbox", child.Name, "orchestrator", parent.Name, "err", err)
		imp.Error = fmt.Sprintf("could not fetch your branch into %s", parent.Name)
		imp.OnDone, imp.OnDoneReason = manifest.OnDoneKeep, ""
		return imp
	}
	if err := o.Store.SetImported(ctx, child.Name, work.head); err != nil {
		o.logger().Error("record import", "sandbox", child.Name, "err", err)
	}
	imp.Ref, imp.SHA = ref, work.head
	if imp.OnDone == manifest.OnDoneDestroy && !o.grantHas(ctx, parent, grant.OpDestroy) {
		imp.OnDone, imp.OnDoneReason = manifest.OnDoneKeep, "the orchestrator's grant no longer holds `destroy`"
	}
	return imp
}

// grantHas reports whether an orchestrator's effective grant holds op.
func (o *Orchestrator) grantHas(ctx context.Context, orch store.Sandbox, op string) bool {
	if orch.Grant == "" {
		return false
	}
	g, err := o.parsedGrant(orch.Grant)
	if err != nil {
		return false
	}
	repo, err := LoadRepoConfig(orch.Repo)
	if err != nil {
		return false
	}
	return g.Capped(repo.Orchestration.Cap).Has(op)
}

// destroyAfterDone destroys a child whose done was accepted with on_done
// destroy, once its agent has had its reply, if its HEAD is still the one
// it reported (work after the report is never thrown away).
func (o *Orchestrator) destroyAfterDone(name, head string) {
	if o.Go == nil {
		return
	}
	o.Go(func(ctx context.Context) {
		for again := true; again; {
			select {
			case <-ctx.Done():
				return
			case <-time.After(doneCleanupDelay):
			}
			o.serial(ctx, func(ctx context.Context) { again = o.cleanUpDone(ctx, name, head) })
		}
	})
}

// cleanUpDone destroys a done child unless its work changed since the
// report; true when it must wait (its spawn's worker still runs).
func (o *Orchestrator) cleanUpDone(ctx context.Context, name, head string) (wait bool) {
	sb, err := o.Store.Sandbox(ctx, name)
	if err != nil || sb.DoneHead != head {
		return false
	}
	if sb.State == store.StateCreating || sb.Phase != "" {
		return true // its spawn's worker is still at it
	}
	work, err := o.readWork(ctx, name)
	switch {
	case err == nil && (work.dirty || work.head != head):
		o.logger().Info("done child changed since its report: kept", "sandbox", name)
		o.Store.SetCleanup(ctx, name, false)
		return false
	case err != nil && !errors.Is(err, backend.ErrNotRunning):
		return false
	}
	if _, err := o.DestroySandbox(ctx, name, true); err != nil {
		o.logger().Error("destroy done child", "sandbox", name, "err", err)
		return false
	}
	o.logger().Info("done child destroyed", "sandbox", name)
	return false
}

// serial runs fn in order with the broker's other mutations (its
// executor; fn's context carries the turn); directly without one.
func (o *Orchestrator) serial(ctx context.Context, fn func(context.Context)) {
	if o.Serial == nil {
		fn(ctx)
		return
	}
	o.Serial(ctx, fn)
}
