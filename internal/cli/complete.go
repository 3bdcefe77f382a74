package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/wire"
)

// completionTimeout bounds the broker's answer to a completion: a shell
// waits on it while the user types.
const completionTimeout = 2 * time.Second

// completeSandbox completes a command's NAME argument (its first) with the
// broker's sandbox names, each described by its role and state. A broker
// that cannot be reached completes nothing, silently: the shell shows no
// error. Later arguments complete as files when moreFiles (exec's command),
// else as nothing.
func completeSandbox(state *string, moreFiles bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			if moreFiles {
				return nil, cobra.ShellCompDirectiveDefault
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return sandboxCompletions(cmd.Context(), *state, toComplete, ""), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeOrchestrator completes a flag naming an orchestrator (new --parent).
func completeOrchestrator(state *string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return sandboxCompletions(cmd.Context(), *state, toComplete, wire.RoleOrchestrator), cobra.ShellCompDirectiveNoFileComp
	}
}

// sandboxCompletions are the names starting with prefix of the broker's
// sandboxes of role ("": any); none when the broker does not answer.
func sandboxCompletions(ctx context.Context, state, prefix string, role wire.Role) []cobra.Completion {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	var list []wire.SandboxInfo
	if adminCall(ctx, state, "ls", nil, &list) != nil {
		return nil
	}
	var out []cobra.Completion
	for _, s := range list {
		if !strings.HasPrefix(s.Name, prefix) || (role != "" && s.Role != role) {
			continue
		}
		desc := string(s.Role) + ", " + s.State
		if s.Parent != nil {
			desc = "child of " + *s.Parent + ", " + s.State
		}
		out = append(out, cobra.CompletionWithDesc(s.Name, desc))
	}
	return out
}
