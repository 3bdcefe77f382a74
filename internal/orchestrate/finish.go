package orchestrate

import (
	"context"
	"errors"
	"fmt"

	"agentbox/internal/crashpoint"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
)

// A child's accepted done report whose orchestrator cannot take it now
// (stopped, or its inbox full) becomes a pending finish: the report is
// accepted (its HEAD recorded, its agent no longer watched) and the child
// gets a queued status; the broker's rounds import and deliver pending
// finishes in the order they were accepted once the orchestrator runs and
// has room, and the child then gets its done status. Later reports to the
// same orchestrator queue behind older ones.

// finishWaits says what a done report to parent must wait for ("": it
// can be finished now).
func (o *Orchestrator) finishWaits(ctx context.Context, parent store.Sandbox) (string, error) {
	if parent.State != store.StateRunning {
		return fmt.Sprintf("for your orchestrator `%s` to run", parent.Name), nil
	}
	older, err := o.Store.Finishes(ctx, parent.Name)
	if err != nil {
		return "", err
	}
	if n := len(older); n > 0 {
		return fmt.Sprintf("behind %d earlier %s to your orchestrator `%s`", n, plural(n, "report", "reports"), parent.Name), nil
	}
	return "", nil
}

// queueFinish accepts a done report as a pending finish.
func (o *Orchestrator) queueFinish(ctx context.Context, child, parent store.Sandbox, m Message, work workState, why string) (store.Sent, error) {
	sent, err := o.Store.QueueFinish(ctx, store.Finish{
		Child: child.Name, Parent: parent.Name, ManifestID: m.ID, Head: work.head, Branch: work.branch,
		Kind: m.Kind, Body: m.Body, InReplyTo: m.InReplyTo,
	}, fmt.Sprintf("accepted at %s; waiting %s: it will be imported and delivered then", short(work.head), why))
	if err != nil {
		return sent, err
	}
	o.logger().Info("done report waits for its orchestrator", "sandbox", child.Name, "orchestrator", parent.Name, "why", why)
	return sent, nil
}

// ScheduleFinishes starts, in the background and in order with the
// broker's other mutations, the pending finishes of every orchestrator
// that has some, runs (or vanished) and is not being finished already. The broker calls it
// each round.
func (o *Orchestrator) ScheduleFinishes(ctx context.Context) {
	if o.Go == nil {
		return
	}
	parents, err := o.Store.FinishParents(ctx)
	if err != nil {
		o.logger().Error("list pending finishes", "err", err)
		return
	}
	for _, p := range parents {
		if sb, err := o.Store.Sandbox(ctx, p); err == nil && sb.State != store.StateRunning {
			continue // nothing to do until it runs
		}
		o.mu.Lock()
		busy := o.finishing[p]
		if !busy {
			if o.finishing == nil {
				o.finishing = map[string]bool{}
			}
			o.finishing[p] = true
		}
		o.mu.Unlock()
		if busy {
			continue
		}
		o.Go(func(ctx context.Context) {
			defer func() {
				o.mu.Lock()
				delete(o.finishing, p)
				o.mu.Unlock()
			}()
			o.serial(ctx, func(ctx context.Context) { o.FinishPending(ctx, p) })
		})
	}
}

// FinishPending imports and delivers parent's pending finishes, oldest
// first, while it runs and its inbox has room; finishes for an
// orchestrator that no longer exists are refused (the child is kept).
func (o *Orchestrator) FinishPending(ctx context.Context, parentName string) {
	finishes, err := o.Store.Finishes(ctx, parentName)
	if err != nil {
		o.logger().Error("list pending finishes", "orchestrator", parentName, "err", err)
		return
	}
	for _, f := range finishes {
		parent, err := o.Store.Sandbox(ctx, parentName)
		if errors.Is(err, store.ErrNotFound) {
			if err := o.Store.RefuseFinish(ctx, f, vanishedDetail(parentName)); err != nil {
				o.logger().Error("refuse pending finish", "sandbox", f.Child, "err", err)
			}
			o.notify(f.Child)
			continue
		}
		if err != nil || parent.State != store.StateRunning {
			return
		}
		child, err := o.Store.Sandbox(ctx, f.Child)
		if err != nil {
			return // gone since: its finish went with it
		}
		imp := o.importDone(ctx, parent, child, workState{head: f.Head, branch: f.Branch})
		crashpoint.Hit(crashpoint.FinishImported)
		_, err = o.Store.DeliverMessage(ctx, store.Delivery{
			From: child.Name, To: parent.Name, ManifestID: f.ManifestID, Kind: f.Kind, Body: f.Body, InReplyTo: f.InReplyTo,
			Import: &imp, Journaled: true, StatusDetail: doneDetail(parent.Name, imp),
			DoneHead: f.Head, Cleanup: imp.OnDone == manifest.OnDoneDestroy, Finish: f.Seq,
		})
		if _, full := errors.AsType[*store.InboxFullError](err); full {
			return // again once it has read
		}
		if err != nil {
			o.logger().Error("deliver pending finish", "sandbox", child.Name, "orchestrator", parent.Name, "err", err)
			return
		}
		o.logger().Info("pending done report delivered", "sandbox", child.Name, "orchestrator", parent.Name)
		o.notify(parent.Name, child.Name)
		if imp.OnDone == manifest.OnDoneDestroy {
			o.destroyAfterDone(child.Name, f.Head)
		}
	}
}

// vanishedDetail refuses a done report whose orchestrator no longer exists.
func vanishedDetail(parent string) string {
	return fmt.Sprintf("your orchestrator `%s` no longer exists: the report was not delivered, this child is kept", parent)
}
