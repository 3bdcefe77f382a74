package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/managed/endpoint"
	"agentbox/internal/managed/provider"
	"agentbox/internal/managed/spool"
)

// ToolRequestIDEnv names the request id in a tool handler's environment.
const ToolRequestIDEnv = "BRANCHBOX_TOOL_REQUEST_ID"

// toolHandlerTimeout bounds one run of the handler.
const toolHandlerTimeout = 30 * time.Second

func newToolEndpoint(env *Env) *cobra.Command {
	te := &cobra.Command{
		Use:   "tool-endpoint",
		Short: "Serve a trusted tool endpoint on a Unix socket",
		Long: `A tool endpoint answers the tool requests branchbox's dispatcher relays to it,
on a Unix socket outside any container.

  tool-endpoint serve --socket PATH --handler CMD [--max-requests N] [-- ARGS...]`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return usage("a tool-endpoint subcommand is required (serve)")
		},
	}
	te.AddCommand(newToolEndpointServe(env))
	return te
}

func newToolEndpointServe(env *Env) *cobra.Command {
	var socket, handler string
	var maxRequests int
	c := &cobra.Command{
		Use:   "serve --socket PATH --handler CMD [--max-requests N] [-- ARGS...]",
		Short: "Answer relayed tool requests on a Unix socket by running a handler",
		Long: `Listen on a Unix socket at PATH and answer each tool request the dispatcher
relays, by running the handler CMD (with the ARGS after --) once per request.

The socket: a socket file already at PATH that nothing listens on is replaced;
any other file there (or a live socket) is left in place and serve exits 1.
The socket is bound in a private temporary directory next to PATH, made mode
0600 and only then linked at PATH, so nothing connects before that; it is
removed when serve stops.

One connection carries one request: the frame, one line of compact JSON
  {"version":"1","run_id":..,"lease_id":..,"consumer":..,"request_id":..,"payload":..}
(at most ` + fmt.Sprint(spool.MaxRequestBytes) + ` bytes, read within 30 s; exactly these six fields, the
ids non-empty strings, or the connection closes unanswered). The answer is
  {"version":"1","run_id":..,"lease_id":..,"consumer":..,"request_id":..,"payload":<the handler's output>}
with the request's ids, compact, followed by a newline; then the connection
closes. At most 16 requests are handled at a time.

The handler runs with:
  stdin    the frame and a newline
  env      only PATH=` + provider.SafePATH + `
           and ` + ToolRequestIDEnv + `=<the request id>
  stdout   at most ` + fmt.Sprint(spool.MaxResponseBytes) + ` bytes, one JSON value: the response's payload
  stderr   discarded
  dir      serve's working directory
  timeout  30 s, then its process group is killed
A bare CMD is looked up only in that PATH. A handler that exits non-zero, is
killed, times out, or prints anything but one JSON value (or a response over
` + fmt.Sprint(spool.MaxResponseBytes) + ` bytes) gets no response sent: the connection closes, which the
dispatcher sees as a transport failure.

serve logs to stderr one line per request, its request id and outcome (never
a payload or the handler's output).

  --max-requests N   stop after N answered requests (0, the default: never)

SIGINT and SIGTERM stop it: handlers still running are killed, and the socket
is removed.

Exit status: 0 when stopped by a signal or after N answered requests; 1 when
the handler is not an executable file or the socket cannot be served; 2 on a
usage error.`,
		Args: func(c *cobra.Command, args []string) error {
			if dash := c.ArgsLenAtDash(); (dash < 0 && len(args) > 0) || dash > 0 {
				return fmt.Errorf("handler arguments must follow --")
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			if socket == "" || handler == "" {
				return usage("--socket and --handler must not be empty")
			}
			if maxRequests < 0 {
				return usage("--max-requests must be 0 (unlimited) or more")
			}
			exe, err := resolveHandler(handler)
			if err != nil {
				return refused(err)
			}
			ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stopSignals()
			ctx, stop := context.WithCancel(ctx)
			defer stop()
			var mu sync.Mutex
			logf := func(format string, a ...any) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(env.Stderr, "branchbox tool-endpoint: "+format+"\n", a...)
			}
			var answered atomic.Int64
			h := func(ctx context.Context, frame []byte) ([]byte, error) {
				payload, err := runToolHandler(ctx, exe, args, frame)
				if err != nil || maxRequests == 0 {
					return payload, err
				}
				switch n := answered.Add(1); {
				case n > int64(maxRequests):
					return nil, errors.New("--max-requests reached")
				case n == int64(maxRequests):
					stop() // Serve still writes this response before it returns
				}
				return payload, nil
			}
			if err := endpoint.Serve(ctx, socket, h, logf); err != nil {
				return &exitError{code: ExitRefused, msg: err.Error()}
			}
			logf("stopped")
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&socket, "socket", "", "path of the Unix socket to listen on (required)")
	f.StringVar(&handler, "handler", "", "command run once per request (required)")
	f.IntVar(&maxRequests, "max-requests", 0, "stop after this many answered requests (0: never)")
	_ = c.MarkFlagRequired("socket")
	_ = c.MarkFlagRequired("handler")
	return c
}

// resolveHandler returns the handler's absolute path: a name with a slash
// as given (made absolute), a bare name looked up in provider.SafePATH. It
// must be a regular file with an execute bit.
func resolveHandler(name string) (string, error) {
	isExe := func(p string) bool {
		fi, err := os.Stat(p)
		return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
	}
	if filepath.Base(name) != name {
		p, err := filepath.Abs(name)
		if err == nil && isExe(p) {
			return p, nil
		}
	} else {
		for _, dir := range filepath.SplitList(provider.SafePATH) {
			if p := filepath.Join(dir, name); isExe(p) {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("the handler %q is not an executable file", name)
}

// cappedOutput keeps at most max bytes and notes whether more came.
type cappedOutput struct {
	buf  bytes.Buffer
	max  int
	over bool
}

// Write takes all of p (so the handler runs to its end) and keeps what
// fits.
func (w *cappedOutput) Write(p []byte) (int, error) {
	n := len(p)
	if room := w.max - w.buf.Len(); n > room {
		w.over = true
		p = p[:max(room, 0)]
	}
	w.buf.Write(p)
	return n, nil
}

// runToolHandler runs the handler once for frame and returns its output,
// one JSON value. Its errors never hold the frame or the output.
func runToolHandler(ctx context.Context, exe string, args []string, frame []byte) ([]byte, error) {
	ids, err := endpoint.FrameIDs(frame)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithTimeout(ctx, toolHandlerTimeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, exe, args...)
	cmd.Env = []string{"PATH=" + provider.SafePATH, ToolRequestIDEnv + "=" + ids.RequestID}
	stdin := make([]byte, 0, len(frame)+1)
	cmd.Stdin = bytes.NewReader(append(append(stdin, frame...), '\n'))
	out := &cappedOutput{max: spool.MaxResponseBytes}
	cmd.Stdout = out
	// Its own process group, all killed on the timeout or a stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return nil, errors.New("the handler was stopped: the endpoint is stopping")
	case runCtx.Err() != nil:
		return nil, fmt.Errorf("the handler did not finish within %s", toolHandlerTimeout)
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return nil, fmt.Errorf("the handler exited with status %d", ee.ExitCode())
	case errors.As(err, &ee):
		return nil, errors.New("the handler was killed by a signal")
	case errors.Is(err, exec.ErrWaitDelay):
		return nil, errors.New("the handler left a process holding its output open")
	case err != nil:
		return nil, fmt.Errorf("the handler could not run: %v", err)
	case out.over:
		return nil, fmt.Errorf("the handler's output is over %d bytes", spool.MaxResponseBytes)
	case !json.Valid(out.buf.Bytes()):
		return nil, errors.New("the handler's output is not one JSON value")
	}
	return out.buf.Bytes(), nil
}
