package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/backend"
	"agentbox/internal/untrusted"
	"agentbox/internal/wire"
)

// agentLogs prints the panes of name's agents (`logs --agent`), and with
// follow the lines that change in them until ctx ends.
func agentLogs(ctx context.Context, state, name string, follow bool, out io.Writer, deps Deps) error {
	p := paneFollower{out: out, seen: map[string][]string{}}
	for {
		panes, err := capturePanes(ctx, state, name, deps)
		if err != nil {
			if follow && ctx.Err() != nil {
				return nil
			}
			return err
		}
		p.print(panes)
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(followInterval):
		}
	}
}

// agentAnswerTimeout bounds one look at a sandbox's tmux from a host
// command: the sandbox may have stopped its tmux server, and tmux would
// then never answer.
const agentAnswerTimeout = 30 * time.Second

// noAgentAnswer is the refusal of a tmux that did not answer in time.
func noAgentAnswer(name string) error {
	return exitf(ExitFailed, "the agent session in %s did not answer in %s (its tmux may be stopped)", name, agentAnswerTimeout)
}

// capturePanes captures every pane of the agents' tmux session in the
// sandbox name, through the broker's exec.
func capturePanes(ctx context.Context, state, name string, deps Deps) ([]agent.Pane, error) {
	out := &untrusted.Buffer{Max: agent.MaxCaptureOutput}
	d := deps
	d.Stdin = strings.NewReader("")
	d.Stdout = out
	d.Stderr = io.Discard
	cctx, cancel := context.WithTimeout(ctx, agentAnswerTimeout)
	defer cancel()
	err := runExec(cctx, state, wire.ExecArgs{Name: name, Argv: agent.CaptureAllArgv(), Dir: backend.WorkspacePath}, d)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		return nil, noAgentAnswer(name)
	}
	var ee *ExitError
	if errors.As(err, &ee) && ee.Msg == "" {
		// The capture ran and failed: tmux found no session.
		return nil, exitf(ExitFailed, "no agent session in %s (only a spawned child's agents run in one)", name)
	}
	if err != nil {
		return nil, err
	}
	return agent.ParsePanes(out.Bytes()), nil
}

// paneFollower prints captured panes, each line once while it stays as
// it was: lines seen in an earlier capture of the same window are left
// out.
type paneFollower struct {
	out  io.Writer
	seen map[string][]string // lines printed, by window
	last string              // the window printed last
}

func (p *paneFollower) print(panes []agent.Pane) {
	for _, pane := range panes {
		old, known := p.seen[pane.Window]
		k := sharedLines(old, pane.Lines)
		p.seen[pane.Window] = pane.Lines
		if known && k == len(pane.Lines) {
			continue
		}
		if !known || pane.Window != p.last {
			fmt.Fprintf(p.out, "== window %s\n", pane.Window)
			p.last = pane.Window
		}
		for _, l := range pane.Lines[k:] {
			fmt.Fprintln(p.out, l)
		}
	}
}

// sharedLines is how many of cur's first lines were already printed as
// old's: the longest prefix of cur that old ends with or starts with (a
// pane whose history was trimmed at its top lost old's first lines).
func sharedLines(old, cur []string) int {
	best := 0
	for d := range old {
		k := 0
		for d+k < len(old) && k < len(cur) && old[d+k] == cur[k] {
			k++
		}
		if d+k == len(old) {
			return max(best, k) // old's rest is cur's start: cur only added lines
		}
		best = max(best, k)
	}
	return best
}
