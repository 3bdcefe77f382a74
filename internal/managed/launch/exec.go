package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"

	"agentbox/internal/managed/engine"
	"agentbox/internal/managed/policy"
	"agentbox/internal/managed/provider"
)

// running loads feature name and checks with eng that its container
// still runs. It also returns the names of the container's own
// environment as the engine records it (what docker exec starts from).
func running(ctx context.Context, eng *engine.Engine, cfg Config, name string) (*Record, []string, error) {
	rec, err := Load(cfg.StateRoot, name)
	if err != nil {
		return nil, nil, err
	}
	if rec.Phase != PhaseRunning || rec.ContainerID == "" {
		return nil, nil, fail(CodeNotRunning, "feature %q is not running (phase %s)", name, rec.Phase)
	}
	c, err := eng.Inspect(ctx, rec.ContainerID)
	if err != nil || c.State == nil || !c.State.Running {
		return nil, nil, fail(CodeNotRunning, "feature %q: its container is not running", name)
	}
	var names []string
	if c.Config != nil {
		for _, kv := range c.Config.Env {
			if n, _, _ := strings.Cut(kv, "="); n != "" {
				names = append(names, n)
			}
		}
	}
	return rec, names, nil
}

// runningRecord is running with an engine client of its own, for the
// commands that need the engine for nothing else.
func runningRecord(ctx context.Context, cfg Config, name string) (*Record, []string, error) {
	eng, err := engine.Open()
	if err != nil {
		return nil, nil, &Error{Code: CodeEngine, Message: err.Error()}
	}
	defer eng.Close()
	return running(ctx, eng, cfg, name)
}

// daemonEnvNames are what the engine adds to an exec's environment
// besides the container's configured variables (HOSTNAME from the
// repository's Compose hostname).
var daemonEnvNames = []string{"HOSTNAME"}

// blankedEnv is the names the exec sets empty: every variable of the
// container's own environment (containerEnv) and the engine's additions
// that is not one of the provider's names (signed): docker exec starts
// from the container's environment, which the repository's Compose file
// writes, and the shell and env that start the provider hold the values,
// so a loader or shell variable there (LD_PRELOAD naming a library of
// the workspace) must never reach them with its value.
func blankedEnv(containerEnv, signed []string) []string {
	var out []string
	for _, n := range append(slices.Clone(containerEnv), daemonEnvNames...) {
		if !slices.Contains(signed, n) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// providerScript runs as the container's /bin/sh: it sets the umask,
// turns core dumps off (the consumer may still signal the provider, and a
// core file in the workspace would hold its environment) and has env
// start the provider (its arguments are "$@": the names to unset, "--",
// the provider and its arguments). env unsets every name but PATH and
// the provider's own rather than starting from an empty environment
// (env -i NAME="$NAME"): that would put each value on env's command
// line, which every process of the container may read in
// /proc/PID/cmdline.
const providerScript = `umask 0022; ulimit -c 0; exec /usr/bin/env "$@"`

// shellEnvNames are what the container's runtime (HOME from the
// container's passwd, TERM with a terminal) and a shell (dash, bash,
// BusyBox ash) may add to the environment of what they start.
var shellEnvNames = []string{"HOME", "TERM", "PWD", "OLDPWD", "SHLVL", "_"}

// providerArgv is the exec's command: providerScript, with $0 the
// signed executable, then env's arguments: -u for each of unset (the
// blanked names and shellEnvNames, never one of signed), "--", path and
// args.
func providerArgv(exe, path string, args, signed, unset []string) []string {
	argv := []string{"/bin/sh", "-c", providerScript, exe}
	var seen []string
	for _, n := range append(slices.Clone(unset), shellEnvNames...) {
		if !slices.Contains(signed, n) && !slices.Contains(seen, n) {
			seen = append(seen, n)
			argv = append(argv, "-u", n)
		}
	}
	return append(append(argv, "--", path), args...)
}

// ExecProvider starts the coding provider in feature name's container as
// the workspace consumer: the executable and the ordered inherited names
// must match one live model-identity lease of the assignment (validated
// again now, files included), and the provider's whole environment is the
// fixed PATH, those names with the caller's values and its consumer's
// provider-environment values, read and digest-checked immediately before.
// It returns the provider's exit status.
func ExecProvider(ctx context.Context, cfg Config, name string, req provider.Request, caller []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	rec, containerEnv, err := runningRecord(ctx, cfg, name)
	if err != nil {
		return 0, err
	}
	checked, err := pinnedAssignment(cfg, rec)
	if err != nil {
		return 0, err
	}
	plan, err := provider.AuthorizeElsewhere(checked, req, cfg.Checks.Now)
	if err != nil {
		return 0, &Error{Code: CodeAssignment, Message: err.Error()}
	}
	env, err := plan.Environment(caller)
	if err != nil {
		return 0, &Error{Code: CodeAssignment, Message: err.Error()}
	}
	names := make([]string, len(env))
	for i, kv := range env {
		names[i], _, _ = strings.Cut(kv, "=")
	}
	blank := blankedEnv(containerEnv, names)
	argv := providerArgv(plan.Grant().Executable, plan.Path(), plan.Args(), names, blank)
	// env's PATH is the fixed one: the docker CLI is found the same way.
	// The consumer's uid in a group of the lease's own: see
	// policy.ProviderGID.
	user := fmt.Sprintf("%d:%d", rec.Consumer.UID, policy.ProviderGID(rec.Consumer.GID, plan.Grant().Identity))
	args := execArgs(rec.ContainerID, user, rec.WorkspaceFolder, names, blank, true, argv)
	code, err := runDocker(ctx, cfg, args, env, stdin, stdout, stderr)
	clear(env)
	return code, err
}

// ExecResult is `feature exec --json`'s output.
type ExecResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// Exec runs argv in feature name's container as the workspace consumer,
// in the workspace folder, with the container's own environment.
func Exec(ctx context.Context, cfg Config, name string, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	rec, _, err := runningRecord(ctx, cfg, name)
	if err != nil {
		return 0, err
	}
	if len(argv) == 0 {
		return 0, fail(CodeUsage, "a command is required")
	}
	args := execArgs(rec.ContainerID, rec.ContainerUser, rec.WorkspaceFolder, nil, nil, stdin != nil, argv)
	return runDocker(ctx, cfg, args, []string{"PATH=" + provider.SafePATH}, stdin, stdout, stderr)
}

// runDocker runs the docker CLI with args and environment env and returns
// the exit status of what it ran.
func runDocker(ctx context.Context, cfg Config, args, env []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	cmd := exec.CommandContext(ctx, dockerCLI(cfg), args...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return 0, fail(CodeEngine, "docker exec: %v", err)
	}
	return 0, nil
}
