// Package cli is branchbox's command tree (cobra): `managed validate`,
// `managed exec-provider`, `managed example`, the `feature` commands
// (start, exec-provider, exec, status, dispatch-tool, teardown),
// `tool-endpoint serve` and `runtime-capabilities`. cmd/branchbox only
// calls Main.
//
// Exit statuses: 0 success, 1 refusal (an assignment or a request broke a
// rule, or the provider failed), 2 usage error (unknown command or flag,
// missing or extra argument), 75 dispatch-tool found nothing pending (or
// the request id held by another dispatch): retryable.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/leasecheck"
	"agentbox/internal/managed/provider"
	"agentbox/internal/version"
)

// Exit statuses.
const (
	ExitOK      = 0
	ExitRefused = 1
	ExitUsage   = 2
)

// Env is everything a command takes from its process, so tests can run the
// tree in-process.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Environ is the caller's environment ("NAME=value" entries); inherited
	// provider names and BRANCHBOX_MANAGED_ROOT are read from it.
	Environ []string
	Now     func() time.Time
	// Runtime is the runtime's effective uid and gid.
	Runtime assignment.Identity
	// BeforeUp, for tests, runs between a launch's generated inputs and
	// the Dev Containers CLI (see launch.Config).
	BeforeUp func(inputs string) error
}

// ProcessEnv returns the Env of the current process.
func ProcessEnv() Env {
	return Env{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		Environ: os.Environ(),
		Now:     time.Now,
		Runtime: assignment.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())},
	}
}

// Main runs the command line args (without the program name) and returns
// the exit status.
func Main(args []string, env Env) int {
	root := newRoot(&env)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return ExitOK
	}
	var ex *exitError
	if errors.As(err, &ex) {
		if ex.msg != "" {
			fmt.Fprintf(env.Stderr, "branchbox: %s\n", ex.msg)
		}
		return ex.code
	}
	// Anything else comes from cobra's own parsing: a usage error.
	fmt.Fprintf(env.Stderr, "branchbox: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
	return ExitUsage
}

// exitError ends a command with a status and an optional message for
// stderr (empty when the command already reported, e.g. in JSON).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func refused(err error) error {
	return &exitError{code: ExitRefused, msg: "refused: " + err.Error()}
}

func usage(format string, args ...any) error {
	return fmt.Errorf(format, args...) // cobra-style: reported as usage
}

func newRoot(env *Env) *cobra.Command {
	root := &cobra.Command{
		Use:   "branchbox",
		Short: "BranchBox managed runtime: assignments, managed Dev Containers, providers and tool requests",
		Long: `branchbox is the managed runtime inside the guest. An outer orchestrator
hands it a signed, digest-bound assignment stored in
/run/branchbox/managed/<run-id>/; branchbox validates the assignment and every
file it names ('managed validate'), launches the managed Dev Container it
describes on a Docker engine ('feature start'), starts the coding provider
with exactly the environment its lease allows ('feature exec-provider', or
'managed exec-provider' on this host), relays the agent's tool requests to a
trusted endpoint ('feature dispatch-tool', 'tool-endpoint serve'), and tears
the launch down ('feature teardown'); 'feature ls' lists the launches.
'branchbox managed example DIR' writes a run to try the validation with
(with --launchable, one ready for 'feature start').

Environment:
  BRANCHBOX_MANAGED_ROOT  replaces the managed root /run/branchbox/managed
                          (the lease target namespace /run/branchbox/leases
                          inside the container never changes)
  BRANCHBOX_STATE_DIR     replaces the state directory /var/lib/branchbox
                          (one directory per feature: its launch record,
                          generated inputs, replay ledger and worktree)

Exit status: 0 success, 1 refusal, 2 usage error (and 75 from
'feature dispatch-tool' when nothing was pending, or another dispatch of
the request id still ran: retryable).`,
		Version:       version.String(),
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return usage("a command is required")
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	managed := &cobra.Command{
		Use:   "managed",
		Short: "Validate managed assignments, start providers under their leases, write an example run",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return usage("a managed subcommand is required (validate, exec-provider, example)")
		},
	}
	managed.AddCommand(newValidate(env), newExecProvider(env), newExample(env))
	root.AddCommand(managed, newFeature(env), newCapabilities(env), newToolEndpoint(env))
	return root
}

// loadOptions builds the on-disk check options from the environment.
func loadOptions(env *Env) leasecheck.Options {
	root, _ := provider.Getenv(env.Environ, leasecheck.ManagedRootEnv)
	return leasecheck.Options{ManagedRoot: root, Now: env.Now(), Runtime: env.Runtime}
}
