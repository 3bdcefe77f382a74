package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/engine"
	"agentbox/internal/managed/launch"
	"agentbox/internal/managed/provider"
	"agentbox/internal/untrusted"
)

// StateDirEnv replaces DefaultStateDir.
const StateDirEnv = "BRANCHBOX_STATE_DIR"

// DefaultStateDir holds every feature's launch record, generated inputs,
// replay ledger and worktree.
const DefaultStateDir = "/var/lib/branchbox"

// maxExecCapture bounds each stream `feature exec --json` collects.
const maxExecCapture = 1 << 20

func launchConfig(env *Env) launch.Config {
	root, ok := provider.Getenv(env.Environ, StateDirEnv)
	if !ok || root == "" {
		root = DefaultStateDir
	}
	return launch.Config{StateRoot: root, Runtime: env.Runtime, Checks: loadOptions(env), Log: env.Stderr, BeforeUp: env.BeforeUp}
}

// launchFailure turns a launch error into the exit status and, with
// --json, the object printed on stdout.
func launchFailure(env *Env, asJSON bool, err error) error {
	var le *launch.Error
	if !errors.As(err, &le) {
		le = &launch.Error{Code: launch.CodeInternal, Message: err.Error()}
	}
	code := ExitRefused
	if le.Code == launch.CodeUsage {
		code = ExitUsage
	}
	if asJSON {
		out := map[string]any{"error": map[string]string{"code": le.Code, "message": le.Message}}
		var se *launch.StartError
		if errors.As(err, &se) {
			out["runtime_teardown"] = se.Teardown
		}
		if werr := writeJSON(env.Stdout, out); werr != nil {
			return werr
		}
		return &exitError{code: code}
	}
	return &exitError{code: code, msg: err.Error()}
}

func newFeature(env *Env) *cobra.Command {
	f := &cobra.Command{
		Use:   "feature",
		Short: "Launch a managed Dev Container for an assignment, run in it, tear it down",
		Long: `A feature is one task branch in its own worktree and managed Dev Container.

  feature start NAME --repo REPO --runtime in-guest --runtime-manifest ABS [--json]
  feature exec-provider NAME --provider EXE [--inherit-env NAME]... -- [ARGS...]
  feature exec NAME [--json] [--] CMD [ARGS...]
  feature status NAME [--json]
  feature ls [--json]
  feature dispatch-tool NAME --lease L --request-id R [--wait-seconds N] [--json]
  feature teardown NAME --force [--json]

State lives in $` + StateDirEnv + ` (default ` + DefaultStateDir + `): one directory
per feature with its launch record, generated inputs, ledger and worktree.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return usage("a feature subcommand is required (start, exec-provider, exec, status, ls, dispatch-tool, teardown)")
		},
	}
	f.AddCommand(newFeatureStart(env), newFeatureExecProvider(env), newFeatureExec(env), newFeatureStatus(env),
		newFeatureList(env), newFeatureDispatchTool(env), newFeatureTeardown(env))
	return f
}

func newFeatureStart(env *Env) *cobra.Command {
	var repo, runtime, manifest string
	var asJSON bool
	c := &cobra.Command{
		Use:   "start NAME --repo REPO --runtime in-guest --runtime-manifest ABS [--json]",
		Short: "Launch the managed Dev Container an assignment describes",
		Long: `Launch the managed Dev Container the version 3 assignment at ABS describes,
for the repository whose main checkout is REPO, under the feature name NAME.

Before any container exists it checks: the assignment and every file it names;
a workspace consumer whose uid and gid both differ from this runtime's; the
repository's shared Git metadata (runtime-owned, nothing group- or
other-writable, no replaceable ancestor, no attributes filter); that the task
branch does not exist (branch_exists: never reused); the devcontainer config
and every Compose file; that service_images binds exactly the runnable
services; and that every assigned image is present on the engine (nothing is
ever pulled or built).

Then it creates the worktree on a new task branch at the assigned revision,
writes the checked Compose copies, a facade over them and the devcontainer
config to its state directory, delegates the worktree to the consumer, runs
'devcontainer up', checks the container user is the consumer, inspects the
container (privileges, namespaces, capabilities, devices, seccomp, mounts,
environment) and starts one loopback port proxy per published port. Any
failure tears the launch down before the command returns.

  --json   print the summary (or {"error":{"code","message"},"runtime_teardown"})

Exit status: 0 launched, 1 refused or failed, 2 usage error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if runtime != "in-guest" {
				return usage("--runtime must be in-guest (the only runtime this build launches)")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sum, err := launch.Start(ctx, launchConfig(env), launch.Request{Name: args[0], Repo: repo, Manifest: manifest})
			if err != nil {
				return launchFailure(env, asJSON, err)
			}
			if asJSON {
				return writeJSON(env.Stdout, sum)
			}
			fmt.Fprintf(env.Stdout, "feature %s: running\n  container  %s\n  user       %s\n  workspace  %s\n  worktree   %s\n  branch     %s\n  project    %s\n",
				sum.Name, engine.ShortID(sum.Runtime.ContainerID), sum.Runtime.ContainerUser, sum.Runtime.WorkspaceFolder, sum.Worktree, sum.Branch, sum.ComposeProjectName)
			for _, p := range sum.Runtime.PublishedPorts {
				fmt.Fprintf(env.Stdout, "  port       127.0.0.1:%d -> %d\n", p.Host, p.Runtime)
			}
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&repo, "repo", "", "the repository's main checkout (required)")
	fl.StringVar(&runtime, "runtime", "", "the runtime: in-guest (required)")
	fl.StringVar(&manifest, "runtime-manifest", "", "absolute path of the assignment (required)")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	for _, name := range []string{"repo", "runtime", "runtime-manifest"} {
		_ = c.MarkFlagRequired(name)
	}
	return c
}

func newFeatureExecProvider(env *Env) *cobra.Command {
	var exe string
	var inherit []string
	c := &cobra.Command{
		Use:   "exec-provider NAME --provider EXE [--inherit-env NAME]... -- [ARGS...]",
		Short: "Start the coding provider in a feature's container",
		Long: `Start the coding provider EXE in feature NAME's container, as the workspace
consumer's uid, in the workspace folder. It runs in a group of its lease's
own (gid 2147483646 minus the lease's index) with core dumps off, so the
consumer's other processes, and other leases' providers, cannot read its
environment through /proc.

EXE and the ordered --inherit-env names must exactly match one live
model-identity lease. The assignment and its files are validated again first,
and the assignment must be the very bytes feature start validated (their
SHA-256 is in the launch record): any other document at the manifest path, or
a record without the digest, is refused (code assignment_changed).
The provider's whole environment is:
  PATH=` + provider.SafePATH + `
  each --inherit-env name with its value from this process's environment
  each provider-environment value of the lease's consumer, read from its value
  file and its SHA-256 recomputed immediately before the start
Values reach the container through the docker process's environment, never a
command line. stdin, stdout and stderr are the provider's.

Exit status: 0 when the provider exits 0; 1 on a refusal or when the provider
fails; 2 on a usage error.`,
		Args: func(c *cobra.Command, args []string) error {
			if dash := c.ArgsLenAtDash(); len(args) < 1 || (dash < 0 && len(args) > 1) || dash > 1 {
				return fmt.Errorf("exec-provider takes NAME, then the provider's arguments after --")
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			cfg := launchConfig(env)
			code, err := launch.ExecProvider(context.Background(), cfg, args[0],
				provider.Request{Executable: exe, Inherit: inherit, Args: args[1:]}, env.Environ, env.Stdin, env.Stdout, env.Stderr)
			if err != nil {
				return launchFailure(env, false, err)
			}
			return providerExit(code)
		},
	}
	fl := c.Flags()
	fl.StringVar(&exe, "provider", "", "provider executable, exactly as its model-identity lease names it (required)")
	fl.StringArrayVar(&inherit, "inherit-env", nil, "environment name to inherit, repeated in the lease's exact order")
	_ = c.MarkFlagRequired("provider")
	return c
}

func newFeatureExec(env *Env) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "exec NAME [--json] [--] CMD [ARGS...]",
		Short: "Run a command in a feature's container",
		Long: `Run CMD in feature NAME's container as the workspace consumer, in the
workspace folder, with the container's own environment.

As with docker exec, the first word after NAME that is not exec's own flag
starts the command, and everything from it on is the command's; "--" before
CMD is accepted too (and needed when CMD itself starts with '-').

Without --json the command's stdin, stdout and stderr are this process's and
its exit status is passed through. With --json stdin is not read and one object
is printed: {"exit_code": N, "stdout": "...", "stderr": "..."} (each stream
kept up to 1 MiB); the exit status is then 0 however the command exited.

Exit status: the command's (or 0 with --json); 1 when the feature is not
running or docker exec fails; 2 on a usage error.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			name, cmd, err := execArgs(c, args)
			if err != nil || cmd == nil {
				return err
			}
			args = append([]string{name}, cmd...)
			cfg := launchConfig(env)
			if !asJSON {
				code, err := launch.Exec(context.Background(), cfg, args[0], args[1:], env.Stdin, env.Stdout, env.Stderr)
				if err != nil {
					return launchFailure(env, false, err)
				}
				if code != 0 {
					return &exitError{code: code}
				}
				return nil
			}
			var stdout, stderr bytes.Buffer
			code, err := launch.Exec(context.Background(), cfg, args[0], args[1:], nil,
				&engine.Capped{W: &stdout, N: maxExecCapture}, &engine.Capped{W: &stderr, N: maxExecCapture})
			if err != nil {
				return launchFailure(env, true, err)
			}
			return writeJSON(env.Stdout, launch.ExecResult{ExitCode: code, Stdout: stdout.String(), Stderr: stderr.String()})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print {exit_code, stdout, stderr}")
	// Flags end at NAME; execArgs reads exec's own flags between NAME and
	// the command.
	c.Flags().SetInterspersed(false)
	return c
}

// execArgs splits exec's arguments (flags before NAME already parsed)
// into NAME and the command: exec's own flags right after NAME are
// parsed too, then an optional "--", then the command. A nil command
// with a nil error means help was asked for and printed.
func execArgs(c *cobra.Command, args []string) (string, []string, error) {
	fl := c.Flags()
	if err := fl.Parse(args[1:]); err != nil {
		return "", nil, usage("%v", err)
	}
	if help, _ := fl.GetBool("help"); help {
		return "", nil, c.Help()
	}
	if fl.NArg() == 0 {
		return "", nil, usage("exec takes NAME, then the command")
	}
	return args[0], fl.Args(), nil
}

func newFeatureStatus(env *Env) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "status NAME [--json]",
		Short: "Show a feature's launch: phase, container, ports, paths",
		Long: `Show feature NAME's launch record and its container's state on the engine.
Phases: starting, running, failed (the launch failed and was torn down; the
record stays until 'feature teardown NAME --force').

Exit status: 0, 1 when there is no such feature, 2 on a usage error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			s, err := launch.GetStatus(context.Background(), launchConfig(env), args[0])
			if err != nil {
				return launchFailure(env, asJSON, err)
			}
			if asJSON {
				return writeJSON(env.Stdout, s)
			}
			fmt.Fprintf(env.Stdout, "feature %s: %s\n", untrusted.Printable(s.Name), untrusted.Printable(s.Phase))
			if s.Error != "" {
				fmt.Fprintf(env.Stdout, "  error      %s\n", untrusted.PrintableLines(s.Error))
			}
			if s.ContainerID != "" {
				fmt.Fprintf(env.Stdout, "  container  %.12s (%s)\n", untrusted.Printable(s.ContainerID), untrusted.Printable(s.ContainerState))
			}
			fmt.Fprintf(env.Stdout, "  workspace  %s\n  worktree   %s\n  branch     %s\n  project    %s\n  record     %s\n",
				untrusted.Printable(s.WorkspaceFolder), untrusted.Printable(s.Worktree), untrusted.Printable(s.Branch),
				untrusted.Printable(s.ComposeProject), untrusted.Printable(s.StatePath))
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newFeatureList(env *Env) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:     "ls [--json]",
		Aliases: []string{"list"},
		Short:   "List the features in the state directory",
		Long: `List every feature in the state directory, sorted by name, each as
'feature status' reports it: phase (starting, running, failed; damaged when
its record cannot be read), the container and its state on the engine, the
published ports and the branch.

  --json  print an array of 'feature status --json' objects ([] when there
          is none)

Exit status: 0, 1 when the engine or the state directory cannot be read,
2 on a usage error.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			list, err := launch.List(context.Background(), launchConfig(env))
			if err != nil {
				return launchFailure(env, asJSON, err)
			}
			if asJSON {
				return writeJSON(env.Stdout, list)
			}
			tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPHASE\tCONTAINER\tPORTS\tBRANCH")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", untrusted.Printable(s.Name), untrusted.Printable(s.Phase),
					untrusted.Printable(containerCell(s)), portsCell(s.PublishedPorts), untrusted.Printable(orDash(s.Branch)))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return c
}

// providerExit is the outcome of a provider that exited with code: as
// `managed exec-provider` reports it, a negative code (a signal ended the
// process) included.
func providerExit(code int) error {
	switch {
	case code == 0:
		return nil
	case code < 0:
		return &exitError{code: ExitRefused, msg: "the provider was killed by a signal"}
	}
	return &exitError{code: ExitRefused, msg: fmt.Sprintf("the provider exited with status %d", code)}
}

// containerCell is a listed feature's short container id and its state.
func containerCell(s launch.Status) string {
	if s.ContainerID == "" {
		return "-"
	}
	if s.ContainerState == "" {
		return engine.ShortID(s.ContainerID)
	}
	return engine.ShortID(s.ContainerID) + " (" + s.ContainerState + ")"
}

func portsCell(ports []assignment.Port) string {
	var cells []string
	for _, p := range ports {
		cells = append(cells, fmt.Sprintf("127.0.0.1:%d->%d", p.Host, p.Runtime))
	}
	return orDash(strings.Join(cells, ","))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newFeatureTeardown(env *Env) *cobra.Command {
	var force, asJSON bool
	c := &cobra.Command{
		Use:   "teardown NAME --force [--json]",
		Short: "Remove everything a feature's launch created and report any residue",
		Long: `Remove everything feature NAME's launch created: its containers, networks and
volumes, port proxies, tool-request spool volumes, the lease materializations
of its assignment, the replay ledger, the generated inputs and the worktree
(the task branch and its commits stay). Then the engine and every path are
looked at again; the receipt lists what is left by kind (container, network,
volume, port-proxy, tool-request-volume, lease-materialization,
tool-request-ledger, compose-inputs, worktree) and says residue_free only when
nothing is. The record goes only then.

--force is required: the consumer could change the worktree and the shared
Git metadata, and no dirty-worktree check runs; commit what you keep first.

  --json  print {"name", "runtime_teardown": {provider, runtime_id, verified,
          residue_free, residue: [{kind, identifiers}]}}

Exit status: 0 residue-free, 1 residue left or no such feature, 2 usage error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if !force {
				return &exitError{code: ExitRefused, msg: "in-guest teardown requires --force (uncommitted work in the worktree is lost)"}
			}
			r, err := launch.Teardown(context.Background(), launchConfig(env), args[0])
			if err != nil {
				return launchFailure(env, asJSON, err)
			}
			if asJSON {
				if err := writeJSON(env.Stdout, map[string]any{"name": args[0], "runtime_teardown": r}); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(env.Stdout, "feature %s: torn down, residue_free=%v\n", args[0], r.ResidueFree)
				for _, res := range r.Residue {
					fmt.Fprintf(env.Stdout, "  residue %s: %v\n", res.Kind, res.Identifiers)
				}
			}
			if !r.ResidueFree {
				return &exitError{code: ExitRefused, msg: map[bool]string{true: "", false: "residue is left (see the receipt)"}[asJSON]}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&force, "force", false, "required: tear down without a dirty-worktree check")
	c.Flags().BoolVar(&asJSON, "json", false, "print the receipt as JSON")
	return c
}
