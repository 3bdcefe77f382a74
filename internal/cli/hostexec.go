package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/term"
	"agentbox/internal/untrusted"
	"agentbox/internal/wire"
)

// execOutputGrace is how long exec keeps copying output after the command
// ended: a process it left in the background may hold the stream open.
const execOutputGrace = 2 * time.Second

func newExecCmd(deps Deps) *cobra.Command {
	var state, user string
	var tty, raw bool
	var envs []string
	c := &cobra.Command{
		Use:   "exec NAME [-t] [--env K=V]... -- CMD...",
		Short: "Run a command inside a sandbox",
		Long: `Run a command inside a running sandbox, as its agent user, in its checkout
(/workspace). The broker runs it in the sandbox: it is one of the sandbox's
processes, limited with them and ended with them by 'jailbee stop' or
'jailbee destroy'. stdin, stdout and stderr are passed through and the exit
status is the command's (127: no such command). Ending exec (Ctrl-C) ends
the command; what the command started in the background keeps running.
Once the command has ended, exec returns within a few seconds even if what
it left running still holds its output or its terminal; with -t your
terminal's mode is restored.

  -t          give the command a new terminal, sized like yours, with your
              terminal in raw mode meanwhile (jailbee exec -t NAME -- bash);
              your keys, Ctrl-C included, go to the command. To leave a
              command that does not end, type ~. at the start of a line
              (after Enter), as in ssh: exec ends it and exits 1. ~~ there
              types one ~. SIGTERM or SIGHUP to exec ends the command
              the same way, with your terminal's mode restored.
  --env K=V   add a variable to the command's environment (repeatable)
  --raw       without -t, pass the output to your terminal byte for byte

Without -t, output that goes to your terminal is shown with every
character a terminal acts on (escape sequences, carriage returns, other
controls, bidi overrides) replaced by a space, newlines and tabs kept: a
commit message or file a sandbox wrote cannot set your window's title,
write your clipboard or rewrite what you see. Output to a pipe or a file
is passed byte for byte. With -t (a terminal session) the output is the
sandbox's, as it wrote it.

Inside, the broker socket is /run/jailbee/orchestration/broker.sock and the
inbox client is on PATH as 'jailbee'.`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: completeSandbox(&state, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return exitf(ExitUsage, "usage: exec NAME [-t] -- CMD...")
			}
			a := wire.ExecArgs{Name: args[0], Argv: args[1:], User: user, TTY: tty}
			for _, kv := range envs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return exitf(ExitUsage, "--env needs K=V, not %q", kv)
				}
				if a.Env == nil {
					a.Env = map[string]string{}
				}
				a.Env[k] = v
			}
			return runExec(cmd.Context(), state, a, deps, raw)
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVarP(&tty, "tty", "t", false, "give the command a terminal")
	c.Flags().BoolVar(&raw, "raw", false, "without -t, pass the output to your terminal byte for byte, escape sequences included")
	c.Flags().StringArrayVar(&envs, "env", nil, "K=V added to the command's environment")
	c.Flags().StringVar(&user, "user", "", "user inside the sandbox (the local backend has only its agent user)")
	return c
}

// runExec asks the broker to run a.Argv in the sandbox with new pipes (or
// a new terminal) as its streams, and copies them to and from this
// process's own. The user's own terminal is never passed into a sandbox.
// The command's exit status other than 0 is an *ExitError with it.
func runExec(ctx context.Context, state string, a wire.ExecArgs, deps Deps, raw bool) error {
	if _, ok := stdinTerminal(deps); a.TTY && !ok {
		return exitf(ExitUsage, "-t needs a terminal on stdin")
	}
	c, err := dialAdmin(ctx, state)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var escaped, signalled atomic.Bool
	var st *execStreams
	if a.TTY {
		// The escape hangs up, which ends the command (the broker's exec).
		st, err = ttyStreams(deps, &a, func() { escaped.Store(true); cancel() })
		// So does SIGTERM or SIGHUP (a closed terminal window), which
		// would otherwise end jb with the user's terminal left raw.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP)
		defer signal.Stop(sigs)
		go func() {
			select {
			case <-sigs:
				signalled.Store(true)
				cancel()
			case <-ctx.Done():
			}
		}()
	} else {
		st, err = pipeStreams(deps, raw)
	}
	if err != nil {
		return err
	}
	defer st.restore()
	var res wire.ExecResult
	err = c.CallFiles(ctx, "exec", a, st.child[:], &res)
	st.wait(err == nil)
	if err != nil && escaped.Load() {
		return exitf(ExitFailed, "ended with %c.: the command in the sandbox is ended", term.EscapeChar)
	}
	if err != nil && signalled.Load() {
		return exitf(ExitFailed, "ended by a signal: the command in the sandbox is ended")
	}
	if err != nil {
		return protocolExit(err)
	}
	if res.Exit != 0 {
		return &ExitError{Code: res.Exit}
	}
	return nil
}

// stdinTerminal returns deps.Stdin when it is a terminal.
func stdinTerminal(deps Deps) (*os.File, bool) {
	in, ok := deps.Stdin.(*os.File)
	return in, ok && term.IsTerminal(in)
}

// execStreams are the command's descriptors (sent to the broker, closed
// here once sent) and the copies between them and this process's streams.
type execStreams struct {
	child   [3]*os.File
	output  sync.WaitGroup // copies of the command's output
	closers []io.Closer    // our ends, closed when the copies end
	restore func()
	// stopResize (-t) ends the resizing of the command's terminal, which
	// must not outlive it.
	stopResize func()
}

// pipeStreams makes a pipe for each stream. Output that goes to a
// terminal is made printable (untrusted.TerminalWriter) unless raw.
func pipeStreams(deps Deps, raw bool) (*execStreams, error) {
	st := &execStreams{restore: func() {}}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	st.child[0] = inR
	st.closers = append(st.closers, inW)
	go func() {
		io.Copy(inW, deps.Stdin)
		inW.Close()
	}()
	for i, w := range []io.Writer{deps.Stdout, deps.Stderr} {
		r, cw, err := os.Pipe()
		if err != nil {
			st.closeAll()
			return nil, err
		}
		st.child[i+1] = cw
		st.closers = append(st.closers, r)
		st.output.Add(1)
		go func() {
			defer st.output.Done()
			if f, ok := w.(*os.File); ok && term.IsTerminal(f) && !raw {
				// The sandbox's bytes on the user's terminal: nothing in
				// them may act on it (-t and --raw are the ways to let it).
				tw := untrusted.NewTerminalWriter(w)
				io.Copy(tw, r)
				tw.Flush()
				return
			}
			io.Copy(w, r)
		}()
	}
	return st, nil
}

// ttyStreams makes a new terminal for the command: its slave is all three
// streams, its master is copied to and from this process's terminal, which
// is in raw mode until restore.
// Typing the escape ("~." at a line's start, term.CopyInput) calls
// onEscape.
func ttyStreams(deps Deps, a *wire.ExecArgs, onEscape func()) (*execStreams, error) {
	in, ok := stdinTerminal(deps)
	if !ok {
		return nil, exitf(ExitUsage, "-t needs a terminal on stdin")
	}
	master, slave, err := term.OpenPTY()
	if err != nil {
		return nil, exitf(ExitFailed, "%v", err)
	}
	term.CopySize(slave, in)
	restoreMode, err := term.MakeRaw(in)
	if err != nil {
		master.Close()
		slave.Close()
		return nil, exitf(ExitFailed, "cannot put the terminal in raw mode: %v", err)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	resizer := make(chan struct{})
	go func() {
		defer close(resizer)
		for range winch {
			term.CopySize(slave, in)
		}
	}()
	if t := os.Getenv("TERM"); t != "" {
		if a.Env == nil {
			a.Env = map[string]string{}
		}
		if _, set := a.Env["TERM"]; !set {
			a.Env["TERM"] = t
		}
	}
	st := &execStreams{child: [3]*os.File{slave, slave, slave}, closers: []io.Closer{master}, restore: restoreMode}
	st.stopResize = func() {
		signal.Stop(winch)
		close(winch)
		<-resizer
	}
	go term.CopyInput(master, in, onEscape)
	st.output.Add(1)
	go func() {
		defer st.output.Done()
		// Reading the master ends with EIO once every holder of the slave
		// (the command and what it left running) has closed it.
		io.Copy(deps.Stdout, master)
	}()
	return st, nil
}

// wait closes the command's descriptors (the broker has its own), then
// lets the output copies finish: to the end of the command's output, at
// most execOutputGrace after it ended (at once when it never ran). Closing
// our ends then stops the copies, and wait returns once they have: nothing
// is written to the caller's streams after exec returns.
func (st *execStreams) wait(ran bool) {
	if st.stopResize != nil {
		st.stopResize()
	}
	for _, f := range st.child {
		f.Close()
	}
	done := make(chan struct{})
	go func() { st.output.Wait(); close(done) }()
	grace := execOutputGrace
	if !ran {
		grace = 0
	}
	select {
	case <-done:
	case <-time.After(grace):
	}
	st.closeAll()
	<-done
}

func (st *execStreams) closeAll() {
	for _, c := range st.closers {
		c.Close()
	}
}
