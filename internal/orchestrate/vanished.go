package orchestrate

import (
	"context"
	"encoding/json"
	"fmt"

	"agentbox/internal/manifest"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// HasInstance reports whether sb's record says its backend instance
// exists: made and not being destroyed. A record in another state has
// none yet (queued, creating) or is on its way out (destroying).
func HasInstance(sb store.Sandbox) bool {
	switch sb.State {
	case store.StateRunning, store.StateReady, store.StateStopped, store.StateFailed:
		return true
	}
	return false
}

// ForgetVanished removes the record of a sandbox whose instance was
// deleted outside jailbee (the broker's round saw it gone): its socket
// goes, and a child's orchestrator is told, kind blocked, since the work
// the child never reported is gone with it. The caller runs it in order
// with the broker's other mutations, having seen the instance gone there.
func (o *Orchestrator) ForgetVanished(ctx context.Context, sb store.Sandbox) error {
	if o.Unserve != nil {
		o.Unserve(sb.Name)
	}
	if err := o.Store.DeleteSandbox(ctx, sb.Name); err != nil {
		return err
	}
	o.logger().Warn("a sandbox was deleted outside jailbee: its record was removed", "sandbox", sb.Name, "role", sb.Role)
	if sb.Role != wire.RoleChild {
		return nil
	}
	if _, err := o.Store.Sandbox(ctx, sb.Parent); err != nil {
		return nil // its orchestrator is gone too
	}
	body := fmt.Sprintf("`%s` was deleted outside jailbee (its sandbox is gone): its record was removed, and any work it never reported is lost", sb.Name)
	if _, err := o.Store.DeliverHostMessage(ctx, sb.Parent, sb.Name, manifest.MsgBlocked, body); err != nil {
		return fmt.Errorf("tell %s: %w", sb.Parent, err)
	}
	o.notify(sb.Parent)
	return nil
}

// RecordEnded records stopped a sandbox recorded running whose unit ended
// without a stop (the broker's round saw it down: the OOM killer took its
// supervisor, say), after cleaning up what the unit left. The orchestrator
// of a child that had not reported done is told, kind blocked, unless its
// agent's end was told already. The caller runs it in order with the
// broker's other mutations, having seen the unit down there.
func (o *Orchestrator) RecordEnded(ctx context.Context, sb store.Sandbox) error {
	if err := o.StopSandbox(ctx, sb.Name); err != nil {
		return err
	}
	o.logger().Warn("a sandbox's unit ended without a stop (out of memory?): recorded stopped", "sandbox", sb.Name)
	if sb.Role != wire.RoleChild {
		return nil
	}
	defer o.startQueued(ctx, sb.Parent) // its slot is free
	var seen agentSeen
	json.Unmarshal([]byte(sb.Agent), &seen)
	if sb.DoneHead != "" || seen.Ended {
		return nil
	}
	body := fmt.Sprintf("`%s` stopped on its own (its sandbox's supervisor ended: out of memory?), with every process in it, before it reported done: it is recorded stopped; restart, import or destroy it", sb.Name)
	if _, err := o.Store.DeliverHostMessage(ctx, sb.Parent, sb.Name, manifest.MsgBlocked, body); err != nil {
		return fmt.Errorf("tell %s: %w", sb.Parent, err)
	}
	o.notify(sb.Parent)
	return nil
}
