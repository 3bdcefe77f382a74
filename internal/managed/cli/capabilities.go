package cli

import (
	"github.com/spf13/cobra"
)

// Capabilities is what `branchbox runtime-capabilities` reports: the
// guarantees this exact build implements. The two contract flags of the
// reference say that `feature start` implements the managed workspace
// contract (distinct consumer, delegation, final inspection) and the
// preloaded Compose sanitization; an orchestrator must not launch managed
// workspaces on a runtime that reports them false.
type Capabilities struct {
	SchemaVersion                  int      `json:"schema_version"`
	ManagedWorkspaceContractV1     bool     `json:"managed_workspace_contract_v1"`
	PreloadedComposeSanitizationV1 bool     `json:"preloaded_compose_sanitization_v1"`
	AssignmentVersions             []string `json:"assignment_versions"`
	ProviderExecModes              []string `json:"provider_exec_modes"`
}

// CurrentCapabilities returns this build's capabilities.
func CurrentCapabilities() Capabilities {
	return Capabilities{
		SchemaVersion:                  1,
		ManagedWorkspaceContractV1:     true,
		PreloadedComposeSanitizationV1: true,
		AssignmentVersions:             []string{"1", "2", "3"},
		ProviderExecModes:              []string{"host-process", "container"},
	}
}

func newCapabilities(env *Env) *cobra.Command {
	return &cobra.Command{
		Use:   "runtime-capabilities",
		Short: "Print this runtime's capabilities as JSON",
		Long: `Print the managed-runtime guarantees this build implements, as one JSON object:

  schema_version                     1
  managed_workspace_contract_v1      true: 'feature start' launches managed workspaces
  preloaded_compose_sanitization_v1  true: Compose inputs are checked and run
                                     behind a generated facade on preloaded images
  assignment_versions                the assignment versions validated
  provider_exec_modes                how a provider can start: host-process
                                     ('managed exec-provider') and container
                                     ('feature exec-provider')

Exit status: 0, or 2 on a usage error.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return writeJSON(env.Stdout, CurrentCapabilities())
		},
	}
}
