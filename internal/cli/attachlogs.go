package cli

import (
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
keep running. Needs a terminal.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandbox(&state, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			a := wire.ExecArgs{Name: args[0], TTY: true, Dir: backend.WorkspacePath,
				Argv: []string{"tmux", "attach-session", "-t", agent.Session}}
			return runExec(cmd.Context(), state, a, deps)
		},
	}
	addStateFlag(c, &state)
	return c
}

func newLogsCmd(deps Deps) *cobra.Command {
	var state string
	c := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print the worker logs of a child's spawns",
		Long: `Print the worker log of each spawn of the child NAME, oldest first: the
steps its creation took (sandbox, checkout, agent start and readiness) and
what failed. The logs are in <state>/logs/ (owner only).`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandbox(&state, false),
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
