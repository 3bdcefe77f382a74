package launch

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/engine"
)

// Summary is `feature start --json`'s output (the reference's shape,
// plus name, branch and worktree).
type Summary struct {
	Name               string  `json:"name"`
	Branch             string  `json:"branch"`
	Worktree           string  `json:"worktree"`
	ComposeProjectName string  `json:"compose_project_name"`
	Runtime            Runtime `json:"runtime"`
}

// Runtime describes the launched container.
type Runtime struct {
	Provider        string            `json:"provider"`
	RuntimeID       string            `json:"runtime_id"`
	PublishedPorts  []assignment.Port `json:"published_ports"`
	ContainerID     string            `json:"container_id"`
	WorkspaceFolder string            `json:"workspace_folder"`
	ContainerUser   string            `json:"container_user"`
	ConfigPath      string            `json:"config_path"`
	InGuest         InGuest           `json:"in_guest"`
}

// InGuest is the assignment's side of the summary.
type InGuest struct {
	RunID              string         `json:"run_id"`
	AssignmentLeaseID  string         `json:"assignment_lease_id"`
	OuterRuntimeID     string         `json:"outer_runtime_id"`
	RepositoryRevision string         `json:"repository_revision"`
	TaskBranch         string         `json:"task_branch"`
	TunnelPlacement    string         `json:"tunnel_placement"`
	ProjectDocker      string         `json:"project_docker"`
	Leases             []LeaseSummary `json:"leases"`
	StatePath          string         `json:"state_path"`
}

// LeaseSummary is one lease, without a value, digest or source path.
type LeaseSummary struct {
	LeaseID   string `json:"lease_id"`
	Scope     string `json:"scope"`
	Consumer  string `json:"consumer"`
	ExpiresAt string `json:"expires_at,omitempty"`
	State     string `json:"state"`
}

func summarize(stateRoot string, rec *Record, a *assignment.Assignment, now time.Time) *Summary {
	ports := rec.PublishedPorts
	if ports == nil {
		ports = []assignment.Port{}
	}
	s := &Summary{
		Name: rec.Name, Branch: rec.TaskBranch, Worktree: rec.Worktree,
		ComposeProjectName: rec.ComposeProject,
		Runtime: Runtime{
			Provider: ProviderInGuest, RuntimeID: rec.OuterRuntimeID, PublishedPorts: ports,
			ContainerID: rec.ContainerID, WorkspaceFolder: rec.WorkspaceFolder, ContainerUser: rec.ContainerUser,
			ConfigPath: configPath(featureDir(stateRoot, rec.Name)),
			InGuest: InGuest{
				RunID: rec.RunID, AssignmentLeaseID: rec.AssignmentLeaseID, OuterRuntimeID: rec.OuterRuntimeID,
				RepositoryRevision: rec.Revision, TaskBranch: rec.TaskBranch,
				TunnelPlacement: assignment.TunnelPlacementOuter, ProjectDocker: "disabled",
				Leases: []LeaseSummary{}, StatePath: RecordPath(stateRoot, rec.Name),
			},
		},
	}
	for _, l := range a.Leases {
		ls := LeaseSummary{LeaseID: l.LeaseID, Scope: string(l.Scope), Consumer: l.Consumer, State: l.State}
		if l.ExpiresAt != nil {
			ls.ExpiresAt = l.ExpiresAt.UTC().Format(time.RFC3339)
		}
		s.Runtime.InGuest.Leases = append(s.Runtime.InGuest.Leases, ls)
	}
	return s
}

// Status is `feature status --json`'s output.
type Status struct {
	Name            string `json:"name"`
	Phase           string `json:"phase"`
	Error           string `json:"error,omitempty"`
	ComposeProject  string `json:"compose_project_name"`
	Branch          string `json:"branch"`
	Worktree        string `json:"worktree"`
	WorkspaceFolder string `json:"workspace_folder"`
	ContainerID     string `json:"container_id,omitempty"`
	ContainerUser   string `json:"container_user,omitempty"`
	// ContainerState is the engine's state of the container ("running",
	// "exited", ...; "missing" when the engine has none).
	ContainerState string            `json:"container_state,omitempty"`
	PublishedPorts []assignment.Port `json:"published_ports"`
	Proxies        int               `json:"port_proxies"`
	StatePath      string            `json:"state_path"`
}

// GetStatus reports feature name from its record and the engine.
func GetStatus(ctx context.Context, cfg Config, name string) (*Status, error) {
	rec, err := Load(cfg.StateRoot, name)
	if err != nil {
		return nil, err
	}
	eng, err := openEngine()
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	return status(ctx, eng, cfg.StateRoot, rec)
}

// PhaseDamaged is what List reports for a feature whose record cannot be
// read; Error says why.
const PhaseDamaged = "damaged"

// List reports every feature of the state directory, sorted by name, as
// GetStatus does; a directory with no record (nothing was launched under
// its name) is left out, and a record that cannot be read is listed as
// damaged.
func List(ctx context.Context, cfg Config) ([]Status, error) {
	entries, err := os.ReadDir(filepath.Join(cfg.StateRoot, "features"))
	if errors.Is(err, fs.ErrNotExist) {
		return []Status{}, nil
	}
	if err != nil {
		return nil, fail(CodeInternal, "read the state directory: %v", err)
	}
	eng, err := openEngine()
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	out := []Status{}
	for _, e := range entries { // sorted by name
		if !e.IsDir() || CheckName(e.Name()) != nil {
			continue
		}
		rec, err := Load(cfg.StateRoot, e.Name())
		var le *Error
		if errors.As(err, &le) && le.Code == CodeNotFound {
			continue
		}
		if err != nil {
			out = append(out, Status{Name: e.Name(), Phase: PhaseDamaged, Error: err.Error(),
				PublishedPorts: []assignment.Port{}, StatePath: RecordPath(cfg.StateRoot, e.Name())})
			continue
		}
		s, err := status(ctx, eng, cfg.StateRoot, rec)
		if err != nil {
			return nil, err
		}
		out = append(out, *s)
	}
	return out, nil
}

func openEngine() (*engine.Engine, error) {
	eng, err := engine.Open()
	if err != nil {
		return nil, &Error{Code: CodeEngine, Message: err.Error()}
	}
	return eng, nil
}

// status is rec's Status, with its container's state on the engine while
// the launch runs.
func status(ctx context.Context, eng *engine.Engine, stateRoot string, rec *Record) (*Status, error) {
	ports := rec.PublishedPorts
	if ports == nil {
		ports = []assignment.Port{}
	}
	s := &Status{
		Name: rec.Name, Phase: rec.Phase, Error: rec.Error, ComposeProject: rec.ComposeProject,
		Branch: rec.TaskBranch, Worktree: rec.Worktree, WorkspaceFolder: rec.WorkspaceFolder,
		ContainerID: rec.ContainerID, ContainerUser: rec.ContainerUser,
		PublishedPorts: ports, Proxies: len(rec.Proxies), StatePath: RecordPath(stateRoot, rec.Name),
	}
	if rec.ContainerID == "" || rec.Phase != PhaseRunning {
		return s, nil
	}
	c, err := eng.Inspect(ctx, rec.ContainerID)
	switch {
	case err == engine.ErrNotFound:
		s.ContainerState = "missing"
	case err != nil:
		return nil, &Error{Code: CodeEngine, Message: err.Error()}
	case c.State != nil:
		s.ContainerState = c.State.Status
	}
	return s, nil
}
