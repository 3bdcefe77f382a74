package orchestrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/crashpoint"
	"agentbox/internal/gitx"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// importTimeout bounds one import: the child's objects through the
// broker's pipe into the orchestrator's repository.
const importTimeout = 10 * time.Minute

// ImportRefPrefix is where an import puts a child's branch in its
// orchestrator's repository: ImportRefPrefix + <child> + "/" + <branch>.
const ImportRefPrefix = manifest.ImportRefPrefix

// childManifest runs an orchestrator's manifest about one of its children
// whose work happens outside the store (import, stop, destroy): the id is
// journaled before act runs, so a resend returns the recorded status and
// never acts twice. act returns the done detail; a *Refusal becomes the
// refused status; any other error is a failure the broker logs, reported
// with a detail that carries nothing the child controls.
func (o *Orchestrator) childManifest(ctx context.Context, req wire.Caller, m *manifest.Manifest, child string,
	act func(sb store.Sandbox) (string, error)) (store.Sent, error) {
	return o.childManifestDelivering(ctx, req, m, child, func(sb store.Sandbox) (string, *store.Delivery, error) {
		detail, err := act(sb)
		return detail, nil, err
	})
}

// childManifestDelivering is childManifest for an act that, when it
// succeeds, may have a message for the child: the message and the done
// status are written in one transaction.
func (o *Orchestrator) childManifestDelivering(ctx context.Context, req wire.Caller, m *manifest.Manifest, child string,
	act func(sb store.Sandbox) (string, *store.Delivery, error)) (store.Sent, error) {
	prev, found, err := o.Store.BeginManifest(ctx, req.Sandbox, m.ID, string(m.Type))
	if err != nil || found {
		return prev, err
	}
	state, detail := wire.StateDone, ""
	var msg *store.Delivery
	sb, err := o.childOf(ctx, req, child)
	if err == nil && sb.State == store.StateCreating {
		err = refusef("`%s` is being created: wait for its spawn's final status", sb.Name)
	}
	if err == nil {
		detail, msg, err = act(sb)
	}
	if r, ok := AsRefusal(err); ok {
		state, detail = wire.StateRefused, r.Detail
	} else if err != nil {
		o.logger().Error("manifest failed", "sandbox", req.Sandbox, "manifest", m.ID, "type", m.Type, "child", child, "err", err)
		state, detail = wire.StateFailed, fmt.Sprintf("%s of `%s` failed (see the broker log)", m.Type, child)
	}
	if state != wire.StateDone || msg == nil {
		return o.Store.FinishManifest(ctx, req.Sandbox, m.ID, state, detail)
	}
	msg.Journaled, msg.StatusDetail = true, detail
	sent, err := o.Store.DeliverMessage(ctx, *msg)
	if err == nil {
		o.notify(msg.To)
	}
	return sent, err
}

func (o *Orchestrator) logger() *slog.Logger {
	if o.Log != nil {
		return o.Log
	}
	return slog.Default()
}

// importChild fetches the child's HEAD into the orchestrator's repository
// at refs/jailbee/from/<child>/<branch>; nothing is merged. A stopped
// child's sandbox is started for the transfer and stopped again.
func (o *Orchestrator) importChild(ctx context.Context, orch string, child store.Sandbox) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, importTimeout)
	defer cancel()
	if child.State == store.StateStopped {
		stop, err := o.startStopped(ctx, child.Name)
		if err != nil {
			return "", fmt.Errorf("start `%s` for the import: %w", child.Name, err)
		}
		defer stop()
	}
	src := o.checkout(child.Name)
	branch, head, err := gitx.Head(ctx, src)
	if errors.Is(err, backend.ErrNotRunning) {
		return "", refusef("`%s` is not running and was not stopped by the broker: start it again to import it", child.Name)
	}
	if err != nil {
		return "", refusef("cannot read the HEAD of `%s`: its repository does not answer", child.Name)
	}
	if branch == "" {
		branch = child.Branch // detached: named after the branch it was made for
	}
	ref := ImportRefPrefix + child.Name + "/" + branch
	if err := gitx.Transfer(ctx, src, head, o.checkout(orch), ref, gitx.TransferOptions{}); err != nil {
		return "", fmt.Errorf("import %s: %w", child.Name, err)
	}
	crashpoint.Hit(crashpoint.ImportTransferred)
	if err := o.Store.SetImported(ctx, child.Name, head); err != nil {
		return "", err
	}
	return fmt.Sprintf("imported as %s at %s", ref, short(head)), nil
}

// Import runs an import manifest.
func (o *Orchestrator) Import(ctx context.Context, req wire.Caller, m *manifest.Manifest) (store.Sent, error) {
	return o.childManifest(ctx, req, m, m.Import.Child, func(sb store.Sandbox) (string, error) {
		return o.importChild(ctx, req.Sandbox, sb)
	})
}

// StopChild runs a stop manifest: the child's processes end and its slot
// frees; its HEAD and dirtiness are recorded for destroy.
func (o *Orchestrator) StopChild(ctx context.Context, req wire.Caller, m *manifest.Manifest) (store.Sent, error) {
	return o.childManifest(ctx, req, m, m.Stop.Child, func(sb store.Sandbox) (string, error) {
		if sb.State == store.StateQueued {
			return "", refusef("`%s` is queued: it has not started", sb.Name)
		}
		if err := o.StopSandbox(ctx, sb.Name); err != nil {
			return "", err
		}
		return fmt.Sprintf("child `%s` stopped", sb.Name), nil
	})
}

// DestroyChild runs a destroy manifest: refused, unless force, when the
// child's work could be lost (as host destroy).
func (o *Orchestrator) DestroyChild(ctx context.Context, req wire.Caller, m *manifest.Manifest) (store.Sent, error) {
	return o.childManifest(ctx, req, m, m.Destroy.Child, func(sb store.Sandbox) (string, error) {
		if _, err := o.destroy(ctx, sb.Name, m.Destroy.Force, fmt.Sprintf("by your destroy `%s`", m.ID)); err != nil {
			return "", err
		}
		return fmt.Sprintf("child `%s` destroyed", sb.Name), nil
	})
}
