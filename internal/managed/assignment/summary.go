package assignment

import (
	"slices"
	"sort"
	"time"
)

// Summary is the non-secret view of a validated assignment that `branchbox
// managed validate` prints. It holds no value, capability, digest or source
// path: names, ids, targets, expiries and states only.
type Summary struct {
	Version           string            `json:"version"`
	RunID             string            `json:"run_id"`
	AssignmentLeaseID string            `json:"assignment_lease_id"`
	OuterRuntimeID    string            `json:"outer_runtime_id"`
	Repository        Repository        `json:"repository"`
	Workspace         string            `json:"workspace"`
	TaskBranch        string            `json:"task_branch"`
	TunnelPlacement   string            `json:"tunnel_placement"`
	PublishedPorts    []Port            `json:"published_ports"`
	ServiceImages     map[string]string `json:"service_images,omitempty"`
	PortProxyImage    string            `json:"port_proxy_image,omitempty"`
	WorkspaceConsumer *Identity         `json:"workspace_consumer,omitempty"`
	WorkspaceFolder   string            `json:"workspace_folder,omitempty"`
	OmittedServices   []string          `json:"omitted_services,omitempty"`
	Leases            []LeaseSummary    `json:"leases"`
}

// LeaseSummary is one lease in a Summary.
type LeaseSummary struct {
	LeaseID              string     `json:"lease_id"`
	Scope                Scope      `json:"scope"`
	Consumer             string     `json:"consumer"`
	Executable           string     `json:"executable,omitempty"`
	InheritedEnvironment []string   `json:"inherited_environment,omitempty"`
	EnvironmentNames     []string   `json:"environment_names,omitempty"`
	Targets              []string   `json:"targets,omitempty"`
	ConsumerUID          uint32     `json:"consumer_uid,omitempty"`
	EndpointLeaseID      string     `json:"endpoint_lease_id,omitempty"`
	RequestSpoolTarget   string     `json:"request_spool_target,omitempty"`
	ReplayPolicy         string     `json:"replay_policy,omitempty"`
	ExpiresAt            *time.Time `json:"expires_at,omitempty"`
	Live                 bool       `json:"live"`
	State                string     `json:"state"`
}

// Summarize returns the non-secret summary of a validated assignment, with
// each lease's liveness at now.
func (a *Assignment) Summarize(now time.Time) Summary {
	s := Summary{
		Version:           a.Version,
		RunID:             a.RunID,
		AssignmentLeaseID: a.LeaseID,
		OuterRuntimeID:    a.OuterRuntimeID,
		Repository:        a.Repository,
		Workspace:         a.Workspace,
		TaskBranch:        a.TaskBranch,
		TunnelPlacement:   a.TunnelPlacement,
		PublishedPorts:    append([]Port{}, a.PublishedPorts...),
		ServiceImages:     a.ServiceImages,
		PortProxyImage:    a.PortProxyImage,
		WorkspaceConsumer: a.WorkspaceConsumer,
		WorkspaceFolder:   a.WorkspaceFolder,
		OmittedServices:   a.OmittedServices,
		Leases:            []LeaseSummary{},
	}
	for _, l := range a.Leases {
		ls := LeaseSummary{
			LeaseID:              l.LeaseID,
			Scope:                l.Scope,
			Consumer:             l.Consumer,
			Executable:           l.Executable,
			InheritedEnvironment: slices.Clone(l.InheritedEnvironment),
			ConsumerUID:          l.ConsumerUID,
			EndpointLeaseID:      l.EndpointLeaseID,
			RequestSpoolTarget:   l.RequestSpoolTarget,
			ReplayPolicy:         l.ReplayPolicy,
			ExpiresAt:            l.ExpiresAt,
			Live:                 l.Live(now),
			State:                l.State,
		}
		for _, m := range l.Materializations {
			if m.EnvironmentName != "" {
				ls.EnvironmentNames = append(ls.EnvironmentNames, m.EnvironmentName)
			}
			if m.TargetPath != "" {
				ls.Targets = append(ls.Targets, m.TargetPath)
			}
		}
		sort.Strings(ls.EnvironmentNames)
		s.Leases = append(s.Leases, ls)
	}
	return s
}
