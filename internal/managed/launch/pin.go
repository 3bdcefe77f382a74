package launch

import (
	"errors"
	"fmt"

	"agentbox/internal/managed/leasecheck"
)

// pinnedAssignment loads the assignment a running feature was started
// with, for the commands that act on it later (exec-provider,
// dispatch-tool): the bytes at the record's manifest path must be exactly
// the ones `feature start` validated (their SHA-256, recorded at start),
// they and their files pass every check again, and the launch rule and the
// launch's identity (run, assignment lease, outer runtime, repository,
// revision, task branch, workspace consumer) hold as at start. A record
// without the digest (written by an older branchbox) is refused: nothing
// can tell whether its assignment was replaced since.
func pinnedAssignment(cfg Config, rec *Record) (*leasecheck.Checked, error) {
	if rec.AssignmentSHA256 == "" {
		return nil, fail(CodeAssignmentChanged, "feature %q was started by an older branchbox, whose launch record holds no assignment digest: "+
			"whether its assignment changed since the start cannot be told, so it is refused; tear it down (branchbox feature teardown %s --force) and start it again",
			rec.Name, rec.Name)
	}
	opts := cfg.Checks
	opts.PinnedSHA256 = rec.AssignmentSHA256
	checked, err := leasecheck.Load(rec.ManifestPath, opts)
	if errors.Is(err, leasecheck.ErrChanged) {
		return nil, &Error{Code: CodeAssignmentChanged, Message: fmt.Sprintf("feature %q: %v; a running feature acts only under the assignment it was started with", rec.Name, err)}
	}
	if err != nil {
		return nil, &Error{Code: CodeAssignment, Message: err.Error()}
	}
	a := checked.Assignment
	if err := a.RequireManagedLaunch(cfg.Runtime); err != nil {
		return nil, &Error{Code: CodeAssignment, Message: err.Error()}
	}
	for _, c := range []struct {
		field string
		same  bool
	}{
		{"run_id", a.RunID == rec.RunID},
		{"assignment_lease_id", a.LeaseID == rec.AssignmentLeaseID},
		{"outer_runtime_id", a.OuterRuntimeID == rec.OuterRuntimeID},
		{"repository.path", a.Repository.Path == rec.Repo},
		{"repository.revision", a.Repository.Revision == rec.Revision},
		{"task_branch", a.TaskBranch == rec.TaskBranch},
		{"workspace_consumer", a.WorkspaceConsumer != nil && *a.WorkspaceConsumer == rec.Consumer},
	} {
		if !c.same {
			return nil, fail(CodeAssignmentChanged, "feature %q: %s: the assignment does not match the launch record", rec.Name, c.field)
		}
	}
	return checked, nil
}
