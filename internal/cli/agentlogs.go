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
	err := runExec(cctx, state, wire.ExecArgs{Name: name, Argv: agent.CaptureAllArgv(), Dir: backend.WorkspacePath}, d, false)
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
// out. What it keeps is bounded by the latest capture: the windows in it
// (a window gone from it is forgotten, however often the sandbox renames
// its windows) and a copy of their lines (not the capture's buffers).
type paneFollower struct {
	out  io.Writer
	seen map[string][]string // lines printed, by window of the latest capture
	last string              // the window printed last
}

func (p *paneFollower) print(panes []agent.Pane) {
	present := make(map[string]bool, len(panes))
	for _, pane := range panes {
		present[pane.Window] = true
		old, known := p.seen[pane.Window]
		k := sharedLines(old, pane.Lines)
		p.seen[pane.Window] = cloneLines(pane.Lines)
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
	for w := range p.seen {
		if !present[w] {
			delete(p.seen, w)
		}
	}
}

// cloneLines is a copy of lines that shares no memory with them: one
// string holding their bytes, and a slice of exactly their number.
func cloneLines(lines []string) []string {
	n := 0
	for _, l := range lines {
		n += len(l)
	}
	var b strings.Builder
	b.Grow(n)
	for _, l := range lines {
		b.WriteString(l)
	}
	all := b.String()
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i], all = all[:len(l)], all[len(l):]
	}
	return out
}

// sharedLines is how many of cur's first lines were already printed as
// old's: the longest prefix of cur that old holds as a run of lines
// (old ends with it when cur only added lines; a pane whose history was
// trimmed at its top lost old's first lines). It takes time linear in the
// lines (Knuth-Morris-Pratt over line numbers), where comparing cur at
// every line of old took len(old)*len(cur) comparisons.
func sharedLines(old, cur []string) int {
	if len(old) == 0 || len(cur) == 0 {
		return 0
	}
	// Number the distinct lines of cur; a line of old that is not one of
	// them matches nothing (-1).
	ids := make(map[string]int32, len(cur))
	c := make([]int32, len(cur))
	for i, l := range cur {
		id, ok := ids[l]
		if !ok {
			id = int32(len(ids))
			ids[l] = id
		}
		c[i] = id
	}
	// fail[i]: the longest proper prefix of c[:i+1] that is also its suffix.
	fail := make([]int32, len(c))
	for i, k := 1, int32(0); i < len(c); i++ {
		for k > 0 && c[i] != c[k] {
			k = fail[k-1]
		}
		if c[i] == c[k] {
			k++
		}
		fail[i] = k
	}
	// Run old through the automaton: after each line, q is the longest
	// prefix of cur that old's lines so far end with.
	best, q := 0, int32(0)
	for _, l := range old {
		id, ok := ids[l]
		if !ok {
			q = 0
			continue
		}
		for q > 0 && c[q] != id {
			q = fail[q-1]
		}
		if c[q] == id {
			q++
		}
		best = max(best, int(q))
		if int(q) == len(c) {
			return best // all of cur
		}
	}
	return best
}
