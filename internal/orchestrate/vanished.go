package orchestrate

import (
	"context"
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
