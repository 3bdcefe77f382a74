package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"

	"agentbox/internal/agent"
	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/wire"
)

func newAttachCmd(deps Deps) *cobra.Command {
	var state string
	c := &cobra.Command{
		Use:   "attach NAME",
		Short: "Attach your terminal to a child's agent session (tmux)",
		Long: `Attach your terminal to the tmux session the sandbox's agents run in (one
window per agent). Detach with tmux's prefix, then d (C-b d): the agents
keep running. Needs a terminal. A sandbox with no agent session (one
started again with 'jailbee start': its agent is not) is refused, with
how to start one.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := hasAgentSession(cmd.Context(), state, args[0]); err != nil {
				return err
			}
			a := wire.ExecArgs{Name: args[0], TTY: true, Dir: backend.WorkspacePath,
				Argv: []string{"tmux", "attach-session", "-t", agent.Session}}
			return runExec(cmd.Context(), state, a, deps)
		},
	}
	addStateFlag(c, &state)
	return c
}

// hasAgentSession refuses to attach to a sandbox whose agents' tmux
// session does not exist (tmux would only say "no sessions").
func hasAgentSession(ctx context.Context, state, name string) error {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return exitf(ExitFailed, "%v", err)
	}
	defer null.Close()
	c, err := dialAdmin(ctx, state)
	if err != nil {
		return err
	}
	defer c.Close()
	var res wire.ExecResult
	a := wire.ExecArgs{Name: name, Dir: backend.WorkspacePath, Argv: agent.HasSessionArgv()}
	if err := c.CallFiles(ctx, "exec", a, []*os.File{null, null, null}, &res); err != nil {
		return protocolExit(err)
	}
	if res.Exit != 0 {
		return exitf(ExitFailed, "%s has no agent session: no agent runs in it. A spawned child's agent is started by its orchestrator with a restart (`jailbee inbox send restart --child %s --agent-only` while it runs); `jailbee start` starts none", name, name)
	}
	return nil
}

func newLogsCmd(deps Deps) *cobra.Command {
	var state string
	c := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print the worker logs of a child's spawns",
		Long: `Print the worker log of each spawn of the child NAME, oldest first: the
steps its creation took (sandbox, checkout, agent start and readiness) and
what failed. The logs are in <state>/logs/ (owner only).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := stateDir(state)
			if err != nil {
				return err
			}
			if backend.ValidateName(args[0]) != nil {
				return exitf(ExitUsage, "invalid sandbox name %q", truncateArg(args[0]))
			}
			logs, _ := filepath.Glob(filepath.Join(dir, broker.LogDir, args[0]+".*.log"))
			if len(logs) == 0 {
				return exitf(ExitFailed, "no worker log for %s in %s (only spawned children have one)", args[0], filepath.Join(dir, broker.LogDir))
			}
			sort.Slice(logs, func(i, j int) bool { return modTime(logs[i]) < modTime(logs[j]) })
			out := cmd.OutOrStdout()
			for _, l := range logs {
				fmt.Fprintf(out, "== %s\n", filepath.Base(l))
				f, err := os.Open(l)
				if err != nil {
					return exitf(ExitFailed, "%v", err)
				}
				io.Copy(out, f)
				f.Close()
			}
			return nil
		},
	}
	addStateFlag(c, &state)
	return c
}

func modTime(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.ModTime().UnixNano()
}
