package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"agentbox/internal/managed/leasecheck"
	"agentbox/internal/managed/provider"
)

func newExecProvider(env *Env) *cobra.Command {
	var assignmentPath, exe string
	var inherit []string
	c := &cobra.Command{
		Use:   "exec-provider --assignment PATH --provider EXE [--inherit-env NAME]... -- [ARGS...]",
		Short: "Start a provider with exactly the environment its lease allows",
		Long: `Start the coding provider EXE as a child process on this host (host-process
mode), after validating the assignment at PATH and every file it names.

EXE and the ordered --inherit-env names must exactly match one live
model-identity lease (version 2 and 3: its executable and its
inherited_environment list, in order; version 1: one of the fixed providers
claude, codex or gemini with exactly its one fixed name, ANTHROPIC_API_KEY,
OPENAI_API_KEY or GEMINI_API_KEY).

The provider starts from an empty environment plus:
  PATH=` + provider.SafePATH + `
  each --inherit-env name with its value from this process's environment
  each provider-environment value of that lease's consumer, read from its value
  file immediately before the start, its SHA-256 recomputed from those bytes

A bare EXE is looked up only in that fixed PATH. The executable is opened
without following a symbolic link anywhere on its path; it and every directory
above it must be owned by root or the runtime's uid and writable by no one else
(a directory may be, with the sticky bit), and the file checked is the one
executed (through /proc/self/fd/3; a binary's argv[0] stays EXE, a #! script
sees /proc/self/fd/3 as its own path, $0). Arguments after -- go to the
provider.

Exit status: 0 when the provider exits 0; 1 on a refusal, when the provider
cannot start, or when it exits non-zero or is killed; 2 on a usage error.`,
		Args: func(c *cobra.Command, args []string) error {
			if dash := c.ArgsLenAtDash(); (dash < 0 && len(args) > 0) || dash > 0 {
				return fmt.Errorf("provider arguments must follow --")
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			now := env.Now()
			opts := loadOptions(env)
			checked, err := leasecheck.Load(assignmentPath, opts)
			if err != nil {
				return refused(err)
			}
			plan, err := provider.Authorize(checked, provider.Request{Executable: exe, Inherit: inherit, Args: args}, now)
			if err != nil {
				return refused(err)
			}
			code, err := plan.Run(context.Background(), env.Environ, env.Stdin, env.Stdout, env.Stderr)
			if errors.Is(err, provider.ErrStart) {
				return &exitError{code: ExitRefused, msg: err.Error()}
			}
			if err != nil {
				return refused(err)
			}
			return providerExit(code)
		},
	}
	f := c.Flags()
	f.StringVar(&assignmentPath, "assignment", "", "absolute path of the assignment (required)")
	f.StringVar(&exe, "provider", "", "provider executable, exactly as its model-identity lease names it (required)")
	f.StringArrayVar(&inherit, "inherit-env", nil, "environment name to inherit, repeated in the lease's exact order")
	_ = c.MarkFlagRequired("assignment")
	_ = c.MarkFlagRequired("provider")
	return c
}
