// Package cli is the jailbee command tree: the broker, the host commands
// and the in-sandbox `inbox` client. It holds no broker logic; cmd/jailbee
// passes in the backends.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"agentbox/internal/backend"
	"agentbox/internal/inbox"
	"agentbox/internal/untrusted"
	"agentbox/internal/version"
	"agentbox/internal/wire"
)

// Exit statuses (the spec's "Error codes and exit statuses").
const (
	ExitOK          = 0
	ExitFailed      = 1 // refused, failed, or a host command error
	ExitUsage       = 2
	ExitTimeout     = 3
	ExitUnreachable = 4 // broker unreachable, or version mismatch
)

// ExitError carries an exit status; Msg (if any) goes to stderr.
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return e.Msg }

func exitf(code int, format string, args ...any) error {
	return &ExitError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// BackendOptions configures the broker's backend.
type BackendOptions struct {
	Kind     string // "local" or "incus"
	StateDir string
	// NoLimits runs sandboxes without per-sandbox resource limits.
	NoLimits bool
	// IncusProject, IncusPool and Image: the Incus project, storage pool
	// and image alias ("" = the defaults).
	IncusProject, IncusPool, Image string
	// AgentBinaries are the installed agents' binaries by the name they
	// run as, bound read-only on every sandbox's PATH.
	AgentBinaries map[string]string
}

// ImageOptions are `jailbee image build`'s.
type ImageOptions struct {
	Alias, IncusProject string
	Force               bool
	Progress            io.Writer
}

// Deps are what cmd/jailbee provides.
type Deps struct {
	OpenBackend func(BackendOptions) (backend.Backend, error)
	// BuildImage builds the Incus sandbox image.
	BuildImage func(ctx context.Context, o ImageOptions) error
	Stdin      io.Reader
	Stdout     io.Writer
	Stderr     io.Writer
}

// Run runs the command line args (without the program name) and returns
// the exit status.
func Run(ctx context.Context, name string, args []string, deps Deps) int {
	root := NewRoot(name, deps)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Msg != "" {
			fmt.Fprintf(deps.Stderr, "%s: %s\n", name, untrusted.PrintableLines(ee.Msg))
		}
		return ee.Code
	}
	// Anything cobra itself reports (unknown flag, missing args) is usage.
	fmt.Fprintf(deps.Stderr, "%s: %s\n", name, untrusted.PrintableLines(err.Error()))
	return ExitUsage
}

// NewRoot builds the command tree.
func NewRoot(name string, deps Deps) *cobra.Command {
	root := &cobra.Command{
		Use:   name,
		Short: "Run coding agents in sandboxes, one per branch, through an orchestration broker",
		Long: `jailbee runs coding agents in sandboxes, one per git branch. The broker on the
host serves one Unix socket per sandbox; agents inside use 'jailbee inbox' to
message their orchestrator or children. 'jb' is the same program.

Shell completion: 'jailbee completion bash|zsh|fish --help' says how to load
it; sandbox names complete from the running broker.`,
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(deps.Stdin)
	root.SetOut(deps.Stdout)
	root.SetErr(deps.Stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return exitf(ExitUsage, "%v (see '%s --help')", err, c.CommandPath())
	})
	root.AddCommand(newBrokerCmd(deps), newNewCmd(deps), newLsCmd(deps), newPsCmd(deps), newUsageCmd(deps), newRightsCmd(deps), newExecCmd(deps),
		newStartCmd(deps), newStopCmd(deps), newDestroyCmd(deps), newFetchCmd(deps), newAttachCmd(deps), newLogsCmd(deps), newInboxCmd(deps),
		newImageCmd(deps), newAgentCmd(deps), newOutboxCmd(deps))
	return root
}

// StateDirEnv names the state dir for the broker and host commands.
const StateDirEnv = "JAILBEE_STATE_DIR"

// defaultStateDir is ${XDG_STATE_HOME:-~/.local/state}/jailbee.
func defaultStateDir() string {
	if d := os.Getenv(StateDirEnv); d != "" {
		return d
	}
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = "/"
		}
		base = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(base, "jailbee")
}

func addStateFlag(c *cobra.Command, dst *string) {
	c.Flags().StringVar(dst, "state", "", "broker state dir (default $"+StateDirEnv+" or ${XDG_STATE_HOME:-~/.local/state}/jailbee)")
	c.MarkFlagDirname("state")
}

func stateDir(flag string) (string, error) {
	d := flag
	if d == "" {
		d = defaultStateDir()
	}
	abs, err := filepath.Abs(d)
	if err != nil {
		return "", exitf(ExitUsage, "bad state dir")
	}
	return abs, nil
}

// protocolExit maps a client call error to an exit status and message.
func protocolExit(err error) error {
	var we *wire.Error
	switch {
	case errors.As(err, &we) && we.Code == wire.CodeVersion:
		return exitf(ExitUnreachable, "%s (jb apply / restart the broker to align versions)", untrusted.PrintableLines(we.Detail))
	case errors.As(err, &we) && we.Code == wire.CodeBusy:
		return exitf(ExitUnreachable, "broker busy: %s", untrusted.PrintableLines(we.Detail))
	case errors.As(err, &we):
		// The detail may quote what a sandbox sent (a name, a path).
		return exitf(ExitFailed, "%s", untrusted.PrintableLines(we.Detail))
	case errors.Is(err, inbox.ErrUnreachable):
		return exitf(ExitUnreachable, "%v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return exitf(ExitTimeout, "timed out")
	default:
		return exitf(ExitFailed, "%v", err)
	}
}
