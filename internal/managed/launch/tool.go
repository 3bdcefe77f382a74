package launch

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/compose"
	"agentbox/internal/managed/dispatch"
	"agentbox/internal/managed/engine"
	"agentbox/internal/managed/leasecheck"
	"agentbox/internal/managed/spool"
)

// Codes of dispatch-tool's failures, beside the launch's.
const (
	CodeNotPending = "not_pending" // nothing to dispatch by the deadline: retryable
	CodeDispatch   = "dispatch"    // a terminal dispatch failure
)

// spoolOf binds tool-request lease i of the checked assignment to its
// spool: the volume's host directory, the binding and the capability
// (read and digest-checked now), the endpoint's socket and the lease's
// directory in the feature's ledger.
func spoolOf(ctx context.Context, eng *engine.Engine, rec *Record, checked *leasecheck.Checked, i int, featureDir string) (*dispatch.Spool, error) {
	a := checked.Assignment
	l := &a.Leases[i]
	ep := a.LeaseByID(l.EndpointLeaseID)
	if ep == nil || len(ep.Materializations) != 1 || len(l.Materializations) != 1 {
		return nil, fail(CodeAssignment, "tool-request lease %q: no linked endpoint socket or capability", l.LeaseID)
	}
	capability, err := checked.ReadValue(assignment.ValueBinding{Lease: i, Index: 0})
	if err != nil {
		return nil, &Error{Code: CodeAssignment, Message: err.Error()}
	}
	dir, err := eng.VolumeDir(ctx, compose.SpoolVolumeName(a.RunID, l.LeaseID))
	if err != nil {
		return nil, fail(CodeEngine, "the spool volume of lease %q: %v", l.LeaseID, err)
	}
	return &dispatch.Spool{
		Dir: dir,
		Layout: dispatch.Layout{
			Binding:    spool.NewBinding(a.RunID, l.LeaseID, l.EndpointLeaseID, l.Consumer, l.RequestSpoolTarget, l.ReplayPolicy).Marshal(),
			Capability: capability,
			UID:        int(l.ConsumerUID),
			GID:        int(rec.Consumer.GID),
		},
		IDs:      spool.IDs{RunID: a.RunID, LeaseID: l.LeaseID, Consumer: l.Consumer},
		Endpoint: ep.Materializations[0].SourcePath,
		Ledger:   filepath.Join(featureDir, ledgerDir, l.LeaseID),
		Replay:   l.ReplayPolicy == assignment.ReplayPolicyExactDigest,
	}, nil
}

// initSpools lays out every tool-request lease's spool volume, after the
// containers were created and inspected (their user among the rules) and
// before any starts: id -u runs later, in the started container.
func (l *launcher) initSpools(ctx context.Context) error {
	a := l.checked.Assignment
	first := true
	for i := range a.Leases {
		if a.Leases[i].Scope != assignment.ScopeToolRequest {
			continue
		}
		if first {
			first = false
			remapped, err := l.eng.UsernsRemap(ctx)
			if err != nil {
				return &Error{Code: CodeEngine, Message: err.Error()}
			}
			if remapped {
				return fail(CodeEngine, "the engine maps containers into a user namespace: the spool's owners would not be the consumer's")
			}
		}
		sp, err := spoolOf(ctx, l.eng, l.rec, l.checked, i, l.dir)
		if err != nil {
			return err
		}
		if err := dispatch.Init(sp.Dir, sp.Layout); err != nil {
			return fail(CodeEngine, "lease %q: %v", a.Leases[i].LeaseID, err)
		}
		l.logf("spool of lease %s ready", a.Leases[i].LeaseID)
	}
	return nil
}

// DispatchResult is one dispatched request.
type DispatchResult struct {
	IDs      spool.IDs
	Response *spool.Response
	Cached   bool
}

// DispatchTool dispatches request id of tool-request lease leaseID in
// feature name: the assignment and its files are validated again, the
// container user checked against the lease's consumer_uid again, then
// package dispatch does the rest, waiting up to wait.
func DispatchTool(ctx context.Context, cfg Config, name, leaseID, id string, wait time.Duration) (*DispatchResult, error) {
	eng, err := engine.Open()
	if err != nil {
		return nil, &Error{Code: CodeEngine, Message: err.Error()}
	}
	defer eng.Close()
	rec, _, err := running(ctx, eng, cfg, name)
	if err != nil {
		return nil, err
	}
	checked, err := pinnedAssignment(cfg, rec)
	if err != nil {
		return nil, err
	}
	a := checked.Assignment
	i := -1
	for k := range a.Leases {
		if a.Leases[k].LeaseID == leaseID && a.Leases[k].Scope == assignment.ScopeToolRequest {
			i = k
		}
	}
	if i < 0 {
		return nil, fail(CodeDispatch, "--lease names no tool-request lease of the assignment")
	}
	if !a.Leases[i].Live(cfg.Checks.Now) {
		return nil, fail(CodeDispatch, "tool-request lease %q has expired", leaseID)
	}
	if err := checkConsumer(ctx, eng, rec, a.Leases[i].ConsumerUID); err != nil {
		return nil, err
	}
	sp, err := spoolOf(ctx, eng, rec, checked, i, featureDir(cfg.StateRoot, name))
	if err != nil {
		return nil, err
	}
	out, err := sp.Dispatch(ctx, id, wait)
	switch {
	case errors.Is(err, dispatch.ErrNotPending):
		return nil, fail(CodeNotPending, "request %q is not pending", id)
	case errors.Is(err, dispatch.ErrBusy):
		// Retryable, as not pending is: the other dispatch's answer is
		// the ledger's to give once it ends.
		return nil, fail(CodeNotPending, "request %q is being dispatched by another run; run again for its answer", id)
	case err != nil:
		return nil, &Error{Code: CodeDispatch, Message: err.Error()}
	}
	ids := sp.IDs
	ids.RequestID = id
	return &DispatchResult{IDs: ids, Response: out.Response, Cached: out.Cached}, nil
}

// checkConsumer requires the container user's uid to be the signed
// consumer uid (never root).
func checkConsumer(ctx context.Context, eng *engine.Engine, rec *Record, uid uint32) error {
	got, _, err := userIDs(ctx, eng, rec.ContainerID, rec.ContainerUser)
	if err != nil {
		return fail(CodeUser, "resolve the container user: %v", err)
	}
	if got == 0 || got != uid {
		return fail(CodeUser, "the container user is not the tool-request consumer uid %d", uid)
	}
	return nil
}
