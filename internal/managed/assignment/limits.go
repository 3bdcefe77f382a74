package assignment

// Limits. Each is a named bound with the reason for its value; tests check
// each at the limit and one past it.
const (
	// MaxAssignmentBytes bounds the assignment document. A real assignment
	// is a few KiB; 1 MiB leaves room for 64 leases of long paths while
	// keeping the bounded read cheap.
	MaxAssignmentBytes = 1 << 20

	// MaxJSONDepth bounds object/array nesting. The schema is 4 levels deep
	// (document, leases, lease, materializations, materialization); 16 is
	// generous and keeps the decoder's recursion shallow.
	MaxJSONDepth = 16

	// MaxIDBytes bounds run_id, lease_id, outer_runtime_id and
	// endpoint_lease_id (reference: 1-128 opaque characters).
	MaxIDBytes = 128

	// MaxLabelBytes bounds consumer and executable labels (reference).
	MaxLabelBytes = 128

	// MaxPathBytes bounds every path field (Linux PATH_MAX).
	MaxPathBytes = 4096

	// MaxTaskBranchBytes bounds task_branch (a Git ref name component
	// chain; Git itself has no hard limit, 255 matches common filesystems).
	MaxTaskBranchBytes = 255

	// MaxLeases bounds the lease list (our choice; the spec and reference
	// name no bound, and no real assignment carries more than a dozen).
	MaxLeases = 64

	// MaxPublishedPorts bounds published_ports (our choice, see MaxLeases).
	MaxPublishedPorts = 64

	// MaxServiceImages bounds service_images (reference: 64).
	MaxServiceImages = 64

	// MaxServiceNameBytes bounds a Compose service name key (reference).
	MaxServiceNameBytes = 128

	// MaxImageRefBytes bounds an image reference (reference: 512).
	MaxImageRefBytes = 512

	// MaxImageTagBytes bounds a tag (Docker's own limit).
	MaxImageTagBytes = 128

	// MaxOmittedServices and MaxOmittedServiceBytes bound omitted_services
	// (reference: 32 names of 1-64 characters).
	MaxOmittedServices     = 32
	MaxOmittedServiceBytes = 64

	// MaxWorkspaceFolderBytes, MaxWorkspaceFolderSegments and
	// MaxWorkspaceSegmentBytes bound workspace_folder (reference: at most
	// 200 characters, 1-4 segments of 1-64 characters below /workspaces/).
	MaxWorkspaceFolderBytes    = 200
	MaxWorkspaceFolderSegments = 4
	MaxWorkspaceSegmentBytes   = 64

	// MaxInheritedEnvironment bounds one model identity's inherited names
	// (reference: 16).
	MaxInheritedEnvironment = 16

	// MaxProviderEnvironmentBindings bounds provider-environment
	// materializations across the whole assignment (reference: 16).
	MaxProviderEnvironmentBindings = 16

	// MaxEnvNameBytes bounds an environment name (reference: 128).
	MaxEnvNameBytes = 128

	// MinProviderValueBytes and MaxProviderValueBytes bound a
	// provider-environment value file (reference: 8 B - 16 KiB). The lower
	// bound refuses empty and trivially guessable values.
	MinProviderValueBytes = 8
	MaxProviderValueBytes = 16 << 10

	// MinCapabilityBytes and MaxCapabilityBytes bound a tool-request
	// capability file (reference: 32-128 bytes of [A-Za-z0-9._-]).
	MinCapabilityBytes = 32
	MaxCapabilityBytes = 128

	// MaxProjectEnvironmentBytes, MaxProjectEnvironmentEntries and
	// MaxProjectEnvironmentValueBytes bound the project-environment dotenv
	// file (reference: at most 64 KiB, 1-256 entries, values 16 KiB).
	MaxProjectEnvironmentBytes      = 64 << 10
	MaxProjectEnvironmentEntries    = 256
	MaxProjectEnvironmentValueBytes = 16 << 10

	// MaxProviderCredentialBytes bounds a provider-credential file (our
	// choice: credential files are small; 64 KiB holds any JSON token file).
	MaxProviderCredentialBytes = 64 << 10

	// MaxUID bounds uid and gid values: 1..2^31-1, the range every Linux
	// tool handles as a positive signed integer (reference).
	MaxUID = 1<<31 - 1
)
