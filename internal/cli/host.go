package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"agentbox/internal/broker"
	"agentbox/internal/inbox"
	"agentbox/internal/untrusted"
	"agentbox/internal/wire"
)

// maxGrantFileBytes bounds a --grant file: a grant document is a few
// hundred bytes.
const maxGrantFileBytes = 64 << 10

// dialAdmin connects to the broker's admin socket in the state dir.
func dialAdmin(ctx context.Context, stateFlag string) (*inbox.Client, error) {
	dir, err := stateDir(stateFlag)
	if err != nil {
		return nil, err
	}
	c, err := inbox.Dial(ctx, filepath.Join(dir, broker.AdminSock))
	if err != nil {
		return nil, exitf(ExitUnreachable, "no broker is running for the state dir %s (start one with 'jailbee broker --state %s', or name another with --state or $%s)", dir, dir, StateDirEnv)
	}
	return c, nil
}

// adminCall sends one request to the broker's admin socket.
func adminCall(ctx context.Context, stateFlag, op string, args, result any) error {
	c, err := dialAdmin(ctx, stateFlag)
	if err != nil {
		return err
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
		Long: `Create a running sandbox whose checkout holds branch B of the repository
(default: the repository's current branch; a branch that does not exist yet
starts at the repository's HEAD). The checkout is filled by git inside the
sandbox, from the repository's objects for that commit only.

  --orchestrator   an orchestrator with the default grant, or --grant FILE
                   (a grant document, see docs/grants.md)
  --parent ORCH    a child of the orchestrator ORCH (--repo defaults to ORCH's);
                   one child per branch per orchestrator

NAME: lowercase letters, digits and dashes, at most 64, not starting with a dash.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if orchestrator == (parent != "") {
				return exitf(ExitUsage, "give exactly one of --orchestrator and --parent")
			}
			a := wire.NewArgs{Name: args[0], Branch: branch, Parent: parent, Role: wire.RoleChild}
			if orchestrator {
				a.Role = wire.RoleOrchestrator
				if repo == "" {
					return exitf(ExitUsage, "--repo is required with --orchestrator")
				}
			}
			if grantFile != "" {
				if !orchestrator {
					return exitf(ExitUsage, "--grant is only for --orchestrator")
				}
				g, err := readGrantFile(grantFile)
				if err != nil {
					return err
				}
				a.Grant = g
			}
			if repo != "" {
				abs, err := filepath.Abs(repo)
				if err != nil {
					return exitf(ExitUsage, "bad --repo")
				}
				if fi, err := os.Stat(abs); err != nil {
					return exitf(ExitFailed, "no such directory: %s", abs)
				} else if !fi.IsDir() {
					return exitf(ExitFailed, "not a directory: %s", abs)
				}
				a.Repo = abs
			}
			var res wire.NewResult
			if err := adminCall(cmd.Context(), state, "new", a, &res); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created %s (branch %s)\n", res.Name, res.Branch)
			return nil
		},
	}
	addStateFlag(c, &state)
	c.Flags().StringVar(&repo, "repo", "", "host repository to start from")
	c.Flags().StringVar(&branch, "branch", "", "branch to check out (default: the repository's current branch)")
	c.Flags().BoolVar(&orchestrator, "orchestrator", false, "create an orchestrator")
	c.Flags().StringVar(&grantFile, "grant", "", "grant document for the orchestrator (docs/grants.md)")
	c.Flags().StringVar(&parent, "parent", "", "create a child of this orchestrator")
	c.RegisterFlagCompletionFunc("parent", completeOrchestrator(&state))
	c.ValidArgsFunction = cobra.NoFileCompletions // NAME is new
	return c
}

// readGrantFile reads a --grant document; the broker validates it.
func readGrantFile(path string) (json.RawMessage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, exitf(ExitFailed, "cannot read the grant file %s: %v", path, errors.Unwrap(err))
	}
	defer f.Close()
	data := make([]byte, maxGrantFileBytes+1)
	n, _ := f.Read(data)
	if n > maxGrantFileBytes {
		return nil, exitf(ExitFailed, "the grant file %s is larger than %d bytes", path, maxGrantFileBytes)
	}
	if !json.Valid(data[:n]) {
		return nil, exitf(ExitFailed, "the grant file %s is not JSON (docs/grants.md)", path)
	}
	return data[:n], nil
}

func newLsCmd(deps Deps) *cobra.Command {
	var state string
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List sandboxes",
		Long: `List sandboxes. STATE is the broker's record: running or stopped; for a
spawned child also queued, creating, ready (its agent is up), done (its done
report was accepted) or failed. UNIT says whether the sandbox's processes
are up. LAST STATUS is a spawned child's latest status for its spawn or last
restart, as its orchestrator got it. TOKENS is the sandbox's model usage,
input plus output tokens ('jailbee usage' has the detail). --json prints an
array of {name, role, parent, state, running, branch, uuid, socket,
last_status, tokens}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var list []wire.SandboxInfo
			if err := adminCall(cmd.Context(), state, "ls", nil, &list); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, list)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tROLE\tPARENT\tSTATE\tUNIT\tBRANCH\tTOKENS\tLAST STATUS")
			for _, s := range list {
				parent := "-"
				if s.Parent != nil {
					parent = *s.Parent
				}
				unit := "down"
				if s.Running {
					unit = "up"
				}
				tokens := "-"
				if s.Tokens > 0 {
					tokens = humanCount(s.Tokens)
				}
				last := "-"
				if st := s.LastStatus; st != nil {
					last = clip(st.Ref+" "+st.State+": "+st.Detail, maxStatusColumn)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Role, parent, s.State, unit, s.Branch, tokens, last)
			}
			return tw.Flush()
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// maxStatusColumn bounds the LAST STATUS column of ls, in runes (--json
// has the whole status).
const maxStatusColumn = 72

// clip shortens s to at most n runes, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func newDestroyCmd(deps Deps) *cobra.Command {
	var state string
	var force bool
	c := &cobra.Command{
		Use:   "destroy NAME [--force]",
		Short: "Destroy a sandbox, its processes and its inbox",
		Long: `Destroy a sandbox: every process in it, its socket directory, checkout, home
and inbox. Without --force it is refused when work could be lost: uncommitted
changes, a detached or unreadable HEAD, commits never imported (HEAD is not
the commit the sandbox started from or was last imported at: 'jailbee fetch
NAME' imports them into your repository), a sandbox that
is not running (its work cannot be checked), or an orchestrator that still
has children. --force destroys anyway, children included. A child queued for
a slot has no work (no --force needed): its orchestrator gets its spawn's (or
restart's) final status, failed, and a child's slot goes to the queue.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandbox(&state, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res wire.DestroyResult
			if err := adminCall(cmd.Context(), state, "destroy", wire.DestroyArgs{Name: args[0], Force: force}, &res); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "destroyed %s\n", args[0])
			return nil
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&force, "force", false, "destroy despite unsaved work or children")
	return c
}

func newFetchCmd(Deps) *cobra.Command {
	var state, repo, branch string
	c := &cobra.Command{
		Use:   "fetch NAME [--repo DIR] [--branch B]",
		Short: "Bring a sandbox's branch into your repository",
		Long: `Bring a sandbox's branch (default: the branch it was made for) into your
repository (default: the one it was made from) at
refs/jailbee/sandboxes/NAME/BRANCH, and print that ref and its commit.
Nothing else in your repository moves: merge or check out the ref yourself.

The commits come through the broker from git upload-pack inside the sandbox;
git on the host reads nothing the sandbox controls but the objects, checked
as from any untrusted remote (at most 4 GiB). A stopped sandbox is started
for the fetch and stopped again. When the commit fetched is the sandbox's
HEAD, it counts as imported: 'jailbee destroy NAME' no longer refuses for
unimported commits.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a := wire.FetchArgs{Name: args[0], Branch: branch}
			if repo != "" {
				abs, err := filepath.Abs(repo)
				if err != nil {
					return exitf(ExitUsage, "bad --repo")
				}
				a.Repo = abs
			}
			var res wire.FetchResult
			if err := adminCall(cmd.Context(), state, "fetch", a, &res); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", res.Ref, res.SHA)
			return nil
		},
	}
	addStateFlag(c, &state)
	c.Flags().StringVar(&repo, "repo", "", "host repository to fetch into (default: the one the sandbox was made from)")
	c.Flags().StringVar(&branch, "branch", "", "the sandbox's branch to fetch (default: the branch it was made for)")
	return c
}

// newStartStopCmd builds `start` and `stop`; done is the past tense.
func newStartStopCmd(op, done, short, long string) *cobra.Command {
	var state string
	c := &cobra.Command{
		Use:               op + " NAME",
		Short:             short,
		Long:              long,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandbox(&state, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res wire.StartResult // stop's is empty
			if err := adminCall(cmd.Context(), state, op, wire.NameArgs{Name: args[0]}, &res); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", done, args[0])
			if res.Note != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", args[0], res.Note)
			}
			return nil
		},
	}
	addStateFlag(c, &state)
	return c
}

func newStartCmd(Deps) *cobra.Command {
	return newStartStopCmd("start", "started", "Start a stopped sandbox",
		`Start a stopped sandbox again (its checkout and home are as it left them,
its /tmp empty). Only the sandbox starts: none of the processes it ran
before its stop does. A spawned child's agent is started by its
orchestrator with a restart (--agent-only while the child runs), as the
output says.`)
}

func newStopCmd(Deps) *cobra.Command {
	return newStartStopCmd("stop", "stopped", "Stop a sandbox: end every process in it",
		"Stop a sandbox: every process in it ends, whoever started it (agents, services,\ncommands from 'jailbee exec'). Its checkout, home and inbox stay; a child's\nslot goes to its orchestrator's queue.")
}

// writeJSON prints v as indented JSON. Its strings may be a sandbox's
// (names, statuses, a proposal's body), printed to the user's terminal:
// JSON escapes C0 controls but leaves C1 controls (U+009B is a CSI,
// U+009D an OSC to a terminal in UTF-8) and format characters (bidi
// overrides, zero-width) as they are, so those are written as \u
// escapes: the same JSON, nothing a terminal acts on.
func writeJSON(w interface{ Write([]byte) (int, error) }, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(untrusted.EscapeJSON(buf.Bytes()))
	return err
}
