package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/agent"
	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/wire"
)

// followInterval is how often `logs -f` looks for new output: a person
// reads along, a second late is soon enough.
const followInterval = time.Second

func newAttachCmd(deps Deps) *cobra.Command {
	var state string
	c := &cobra.Command{
		Use:   "attach NAME",
		Short: "Attach your terminal to a child's agent session (tmux)",
		Long: `Attach your terminal to the tmux session the sandbox's agents run in (one
window per agent). Detach with tmux's prefix, then d (C-b d): the agents
keep running. If the session stops answering its keys, ~. typed at the
start of a line (after Enter) leaves it, as in ssh; the agents keep
running then too (~~ there types one ~). Needs a terminal ('jailbee logs NAME --agent' prints the
agents' panes without one). A sandbox with no agent session (one started
again with 'jailbee start': its agent is not) is refused, with how to
start one.

The session's output reaches your terminal as the sandbox wrote it, as
with 'jailbee exec -t': escape sequences in it can set your window's title
and, where your terminal allows it, write your clipboard (OSC 52). Keep
clipboard writes off for untrusted sessions, or read the panes with
'jailbee logs NAME --agent', which prints them without control bytes.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandbox(&state, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, ok := stdinTerminal(deps); !ok {
				return exitf(ExitUsage, "attach needs a terminal (to print the agent's pane: jailbee logs %s --agent)", truncateArg(args[0]))
			}
			if err := hasAgentSession(cmd.Context(), state, args[0]); err != nil {
				return err
			}
			a := wire.ExecArgs{Name: args[0], TTY: true, Dir: backend.WorkspacePath,
				Argv: []string{"tmux", "attach-session", "-t", agent.Session}}
			return runExec(cmd.Context(), state, a, deps, false)
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
	cctx, cancel := context.WithTimeout(ctx, agentAnswerTimeout)
	defer cancel()
	if err := c.CallFiles(cctx, "exec", a, []*os.File{null, null, null}, &res); err != nil {
		if ctx.Err() == nil && cctx.Err() != nil {
			return noAgentAnswer(name)
		}
		return protocolExit(err)
	}
	if res.Exit != 0 {
		return exitf(ExitFailed, "%s has no agent session: no agent runs in it. A spawned child's agent is started by its orchestrator with a restart (`jailbee inbox send restart --child %s --agent-only` while it runs); `jailbee start` starts none", name, name)
	}
	return nil
}

func newLogsCmd(deps Deps) *cobra.Command {
	var state string
	var agentPane, follow bool
	c := &cobra.Command{
		Use:   "logs NAME [--agent] [-f]",
		Short: "Print the worker logs of a child's spawns, or its agent's output",
		Long: `Print the worker log of each spawn of the child NAME, oldest first: the
steps its creation took (sandbox, checkout, agent start and readiness) and
what failed. The logs are in <state>/logs/ (owner only): at most 1 MiB
each, the newest 256 of all sandboxes kept.

  --agent   print instead what the sandbox's agents show: each window of
            its tmux session (one per agent), its scrollback and screen,
            under a line '== window NAME' (control characters dropped);
            a tmux that does not answer in 30 s (the sandbox may have
            stopped it) fails the command
  -f        follow: go on printing what is added until interrupted
            (Ctrl-C); with --agent, the panes are read every second and
            the lines that changed since are printed (a line the agent
            redraws is printed again)`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandbox(&state, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			if backend.ValidateName(args[0]) != nil {
				return exitf(ExitUsage, "invalid sandbox name %q", truncateArg(args[0]))
			}
			out := cmd.OutOrStdout()
			if agentPane {
				return agentLogs(cmd.Context(), state, args[0], follow, out, deps)
			}
			return workerLogs(cmd.Context(), state, args[0], follow, out)
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&agentPane, "agent", false, "print the agents' tmux panes instead of the worker logs")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "go on printing what is added")
	return c
}

// workerLogs prints the worker logs of name's spawns, oldest first, and
// with follow what is added to them (or a new spawn's) until ctx ends.
func workerLogs(ctx context.Context, state, name string, follow bool, out io.Writer) error {
	dir, err := stateDir(state)
	if err != nil {
		return err
	}
	dir = filepath.Join(dir, broker.LogDir)
	logs := listLogs(dir, name)
	if len(logs) == 0 {
		return exitf(ExitFailed, "no worker log for %s in %s (only spawned children have one)", name, dir)
	}
	offsets := map[string]int64{}
	for _, l := range logs {
		fmt.Fprintf(out, "== %s\n", filepath.Base(l))
		if offsets[l], err = copyLog(out, l, 0); err != nil {
			return exitf(ExitFailed, "%v", err)
		}
	}
	last := logs[len(logs)-1]
	for follow {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(followInterval):
		}
		for _, l := range listLogs(dir, name) {
			if fi, err := os.Stat(l); err != nil || fi.Size() <= offsets[l] {
				continue
			}
			if l != last {
				fmt.Fprintf(out, "== %s\n", filepath.Base(l))
				last = l
			}
			if offsets[l], err = copyLog(out, l, offsets[l]); err != nil {
				return exitf(ExitFailed, "%v", err)
			}
		}
	}
	return nil
}

// listLogs lists name's worker logs in dir, oldest first.
func listLogs(dir, name string) []string {
	logs, _ := filepath.Glob(filepath.Join(dir, name+".*.log"))
	sort.Slice(logs, func(i, j int) bool { return modTime(logs[i]) < modTime(logs[j]) })
	return logs
}

// copyLog copies the log at path from offset from to its end, and
// returns the offset it reached.
func copyLog(out io.Writer, path string, from int64) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return from, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return from, err
	}
	n, err := io.Copy(out, f)
	return from + n, err
}

func modTime(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.ModTime().UnixNano()
}
