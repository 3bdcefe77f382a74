// Package assignment decodes and validates the orchestrator's managed
// runtime assignment (versions "1", "2" and "3" of the managed runtime
// manifest). It is pure: bytes in, a typed value or a precise *Error out.
// It does no I/O and reads no clock; the time is a parameter.
//
// The on-disk half of the contract (modes, owners, digests, symlinks) lives
// in package leasecheck, which calls Parse and then checks each path the
// validated value names; content rules for the files (value, capability and
// dotenv syntax) are pure and live here so both halves share them.
package assignment

import "time"

// Versions.
const (
	Version1 = "1" // legacy: fixed provider allowlist, no managed bindings
	Version2 = "2" // managed bindings: identities, shared channels, spools
	Version3 = "3" // version 2 plus a distinct workspace consumer
)

// Fixed paths of the contract. The managed root can be replaced (see
// Options.ManagedRoot); the lease target namespace cannot: it names paths
// inside the container.
const (
	DefaultManagedRoot       = "/run/branchbox/managed"
	LeaseTargetRoot          = "/run/branchbox/leases"
	ProjectEnvironmentTarget = LeaseTargetRoot + "/project-env"
	SharedTargetRoot         = LeaseTargetRoot + "/shared"
	ToolEndpointTargetRoot   = LeaseTargetRoot + "/tool-endpoints"
	ToolRequestTargetRoot    = LeaseTargetRoot + "/tool-requests"
	// MaterializationsDir is the directory below the run directory holding
	// every file materialization, each a direct child.
	MaterializationsDir = "materializations"
	// CapabilityFile is the name of a tool-request capability target below
	// its request spool target.
	CapabilityFile = ".capability"
	// WorkspacesRoot is the container directory workspace_folder lives in.
	WorkspacesRoot = "/workspaces"
	// ReservedWorkspaceFolder is reserved for the main Git metadata mount.
	ReservedWorkspaceFolder = "/workspaces/main"
)

// TunnelPlacementOuter is the only tunnel placement: tunnels stay outside.
const TunnelPlacementOuter = "outer"

// ReplayPolicyExactDigest is the only tool-request replay policy.
const ReplayPolicyExactDigest = "exact-digest-replay-v1"

// Scope is a lease scope.
type Scope string

// The scopes. The spec names the first eight; provider-credential comes
// from the reference notes.
const (
	ScopeModelIdentity         Scope = "model-identity"
	ScopeSourceControlIdentity Scope = "source-control-identity"
	ScopeProjectEnvironment    Scope = "project-environment"
	ScopeProviderEnvironment   Scope = "provider-environment"
	ScopeSharedDirectory       Scope = "shared-directory"
	ScopeToolEndpoint          Scope = "tool-endpoint"
	ScopeToolRequest           Scope = "tool-request"
	ScopePlatformTunnel        Scope = "platform-tunnel"
	ScopeProviderCredential    Scope = "provider-credential"
)

// Scopes lists every scope, in the order of the reference.
var Scopes = []Scope{
	ScopeModelIdentity, ScopeSourceControlIdentity, ScopeProjectEnvironment,
	ScopeProviderEnvironment, ScopeSharedDirectory, ScopeToolEndpoint,
	ScopeToolRequest, ScopePlatformTunnel, ScopeProviderCredential,
}

func knownScope(s string) bool {
	for _, sc := range Scopes {
		if string(sc) == s {
			return true
		}
	}
	return false
}

// BindsRunSource reports whether the scope's sources are run-owned
// directories or sockets (shared-directory, tool-endpoint) rather than
// owner-only files below the materializations directory.
func (s Scope) BindsRunSource() bool {
	return s == ScopeSharedDirectory || s == ScopeToolEndpoint
}

// Lease states reported per lease: where its materializations go.
const (
	StatePrimaryEnvFile          = "primary-env-file"
	StateProviderEnv             = "provider-env"
	StatePrimaryReadOnlyDir      = "primary-read-only-directory"
	StatePrimaryReadOnlyEndpoint = "primary-read-only-endpoint"
	StateTrustedRelayEndpoint    = "trusted-relay-endpoint"
	StateConsumerRequestSpool    = "consumer-request-spool"
	StateOuter                   = "outer"
	StateMaterialized            = "materialized"
)

// SourceKind is what a materialization source must be on disk.
type SourceKind string

// Source kinds.
const (
	// SourceFile: an owner-only regular file, a direct child of the run's
	// materializations directory, matching its SHA-256.
	SourceFile SourceKind = "file"
	// SourceSharedDirectory: a directory of mode exactly 0755.
	SourceSharedDirectory SourceKind = "shared-directory"
	// SourceEndpoint: a 0700 directory or an owner-only socket.
	SourceEndpoint SourceKind = "endpoint"
	// SourceSocket: an owner-only socket (an endpoint linked to a spool).
	SourceSocket SourceKind = "socket"
)

// Identity is a numeric uid and gid.
type Identity struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Repository is the assigned repository.
type Repository struct {
	Path     string `json:"path"`
	Revision string `json:"revision"`
}

// Port is one published port.
type Port struct {
	Host    uint16 `json:"host"`
	Runtime uint16 `json:"runtime"`
}

// Assignment is a validated assignment.
type Assignment struct {
	Version           string
	RunID             string
	LeaseID           string // the assignment's own lease (lease_id)
	OuterRuntimeID    string
	Workspace         string
	WorkspaceFolder   string   // "" when absent (version 3 only)
	OmittedServices   []string // nil when absent; set with WorkspaceFolder
	Repository        Repository
	TaskBranch        string
	TunnelPlacement   string
	PublishedPorts    []Port
	ServiceImages     map[string]string // nil or empty when absent
	PortProxyImage    string            // "" when absent
	WorkspaceConsumer *Identity         // version 3 only, required there
	Leases            []Lease

	// RunDir is ManagedRoot/RunID: the directory the assignment must be
	// stored in and every source must be below.
	RunDir string
}

// Lease is one validated lease.
type Lease struct {
	LeaseID              string
	Scope                Scope
	Consumer             string
	Executable           string   // model-identity only
	InheritedEnvironment []string // model-identity only, strictly ascending
	ExpiresAt            *time.Time
	ConsumerUID          uint32 // tool-request only (non-zero there)
	EndpointLeaseID      string // tool-request only
	RequestSpoolTarget   string // tool-request only
	ReplayPolicy         string // tool-request only, optional
	Materializations     []Materialization

	// State is where this lease's materializations go (see the State
	// constants); a tool endpoint linked to a spool is a trusted relay.
	State string
}

// Materialization is one validated materialization.
type Materialization struct {
	SourcePath      string
	TargetPath      string // "" for provider-environment
	EnvironmentName string // provider-environment only
	SHA256          string // "" for shared-directory and tool-endpoint
	// Kind is what the source must be on disk.
	Kind SourceKind
	// Field is the JSON location, e.g. "leases[2].materializations[0]", for
	// messages about this materialization.
	Field string
}

// Live reports whether the lease is live at now: no expiry, or an expiry
// strictly after now.
func (l *Lease) Live(now time.Time) bool {
	return l.ExpiresAt == nil || l.ExpiresAt.After(now)
}

// FileMaterializations reports whether a lease of this scope materializes
// files below the materializations directory.
func (s Scope) FileMaterializations() bool {
	return !s.BindsRunSource()
}

// LeaseByID returns the lease with the given id, or nil.
func (a *Assignment) LeaseByID(id string) *Lease {
	for i := range a.Leases {
		if a.Leases[i].LeaseID == id {
			return &a.Leases[i]
		}
	}
	return nil
}

// LeaseField is the JSON location of lease i.
func LeaseField(i int) string { return index("leases", i) }
