package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/inbox"
)

// adminCall sends one request to the broker's admin socket.
func adminCall(ctx context.Context, stateFlag, op string, args, result any) error {
	dir, err := stateDir(stateFlag)
	if err != nil {
		return err
	}
	c, err := inbox.Dial(ctx, filepath.Join(dir, broker.AdminSock))
	if err != nil {
		return exitf(ExitUnreachable, "no broker is running for this state dir (start one with 'jailbee broker')")
	}
	defer c.Close()
	if err := c.Call(ctx, op, args, result); err != nil {
		return protocolExit(err)
	}
	return nil
}

func newNewCmd(deps Deps) *cobra.Command {
	var state, repo, branch, parent, grantFile string
	var orchestrator bool
	c := &cobra.Command{
		Use:   "new NAME --repo PATH [--branch B] (--orchestrator [--grant FILE] | --parent ORCH)",
		Short: "Create an orchestrator sandbox, or a child of one, from a host repository",
		Long: `Create a sandbox whose checkout is a clone of the repository at branch B
(default: the repository's current branch; a branch that does not exist yet
starts at the repository's HEAD).

  --orchestrator   an orchestrator with the default grant, or --grant FILE
                   (a grant document, see docs/protocol.md)
  --parent ORCH    a child of the orchestrator ORCH (--repo defaults to ORCH's)`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if orchestrator == (parent != "") {
				return exitf(ExitUsage, "give exactly one of --orchestrator and --parent")
			}
			a := broker.NewArgs{Name: args[0], Branch: branch, Parent: parent, Role: "child"}
			if orchestrator {
				a.Role = "orchestrator"
				if repo == "" {
					return exitf(ExitUsage, "--repo is required")
				}
			}
			if grantFile != "" {
				if !orchestrator {
					return exitf(ExitUsage, "--grant is only for --orchestrator")
				}
				g, err := os.ReadFile(grantFile)
				if err != nil {
					return exitf(ExitFailed, "cannot read the grant file")
				}
				if !json.Valid(g) {
					return exitf(ExitFailed, "the grant file is not JSON")
				}
				a.Grant = g
			}
			if repo != "" {
				abs, err := filepath.Abs(repo)
				if err != nil {
					return exitf(ExitUsage, "bad --repo")
				}
				a.Repo = abs
			}
			var res struct {
				Name, UUID, Branch string
			}
			if err := adminCall(cmd.Context(), state, "new", a, &res); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created %s (branch %s)\n", res.Name, res.Branch)
			return nil
		},
	}
	addStateFlag(c, &state)
	c.Flags().StringVar(&repo, "repo", "", "host repository to clone")
	c.Flags().StringVar(&branch, "branch", "", "branch to check out (default: the repository's current branch)")
	c.Flags().BoolVar(&orchestrator, "orchestrator", false, "create an orchestrator")
	c.Flags().StringVar(&grantFile, "grant", "", "grant document for the orchestrator")
	c.Flags().StringVar(&parent, "parent", "", "create a child of this orchestrator")
	return c
}

func newLsCmd(deps Deps) *cobra.Command {
	var state string
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List sandboxes",
		Long:  "List sandboxes. --json prints an array of {name, role, parent, state, branch, uuid, socket}.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var list []broker.SandboxInfo
			if err := adminCall(cmd.Context(), state, "ls", nil, &list); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, list)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tROLE\tPARENT\tSTATE\tBRANCH")
			for _, s := range list {
				parent := "-"
				if s.Parent != nil {
					parent = *s.Parent
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.Role, parent, s.State, s.Branch)
			}
			return tw.Flush()
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newExecCmd(deps Deps) *cobra.Command {
	var state, user string
	c := &cobra.Command{
		Use:   "exec NAME [--user U] -- CMD...",
		Short: "Run a command inside a sandbox",
		Long: `Run a command inside a sandbox with stdin, stdout and stderr passed through;
the exit status is the command's. The broker socket is reachable inside at
/run/jailbee/orchestration/broker.sock and the inbox client is on PATH as
'jailbee'. The command runs as the sandbox's agent user unless --user names
another (root: uid 0 inside, without capabilities).`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return exitf(ExitUsage, "usage: exec NAME [--user U] -- CMD...")
			}
			var info broker.ExecInfo
			if err := adminCall(cmd.Context(), state, "exec_info", map[string]string{"name": args[0]}, &info); err != nil {
				return err
			}
			be, err := deps.OpenBackend(BackendOptions{Kind: info.Backend, StateDir: info.StateDir, Insecure: info.Insecure})
			if err != nil {
				return exitf(ExitFailed, "%v", err)
			}
			code, err := be.Exec(cmd.Context(), args[0], backend.ExecOptions{
				Argv: args[1:], User: user,
				Stdin: cmd.InOrStdin(), Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr(),
			})
			if errors.Is(err, backend.ErrNotRunning) {
				return exitf(ExitFailed, "sandbox `%s` is not running", args[0])
			}
			if err != nil {
				return exitf(ExitFailed, "exec: %v", err)
			}
			if code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		},
	}
	addStateFlag(c, &state)
	c.Flags().StringVar(&user, "user", "", "user inside the sandbox (default: the agent user)")
	return c
}

func newDestroyCmd(deps Deps) *cobra.Command {
	var state string
	var force bool
	c := &cobra.Command{
		Use:   "destroy NAME [--force]",
		Short: "Destroy a sandbox and its inbox",
		Long: `Destroy a sandbox: its listener, socket directory, checkout and inbox.
Refused when the checkout has uncommitted changes, or for an orchestrator
that still has children, unless --force (which destroys the children too).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res struct {
				Destroyed int `json:"destroyed"`
			}
			if err := adminCall(cmd.Context(), state, "destroy", broker.DestroyArgs{Name: args[0], Force: force}, &res); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "destroyed %s\n", args[0])
			return nil
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&force, "force", false, "destroy despite uncommitted changes or children")
	return c
}

func writeJSON(w interface{ Write([]byte) (int, error) }, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
