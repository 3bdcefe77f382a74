package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/docker/docker/api/types/container"

	"agentbox/internal/crashpoint"
	"agentbox/internal/managed/devcontainer"
	"agentbox/internal/managed/engine"
	"agentbox/internal/managed/inspect"
	"agentbox/internal/managed/provider"
	"agentbox/internal/untrusted"
)

// maxCLIOutput bounds what is kept of a CLI's output for a message.
const maxCLIOutput = 64 << 10

// devcontainerUp runs `devcontainer up` on the generated config, from an
// environment of its own (cliEnv). The containers exist and passed
// inspection: the CLI finds the primary's by its Compose labels and
// starts the project without recreating anything. It returns the
// container id the CLI reports, also when it reports a failure after
// creating one.
func (l *launcher) devcontainerUp(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, devcontainerUpTimeout)
	defer cancel()
	cli := l.cfg.DevcontainerCLI
	if cli == "" {
		cli = "devcontainer"
	}
	path, err := lookPath(cli)
	if err != nil {
		return "", fail(CodeEngine, "the Dev Containers CLI %q is not installed (npm install -g @devcontainers/cli)", cli)
	}
	cmd := exec.CommandContext(ctx, path, "up",
		"--workspace-folder", l.rec.Worktree,
		"--config", configPath(l.dir),
		"--docker-path", dockerCLI(l.cfg))
	cmd.Dir = filepath.Join(l.dir, inputsDir)
	cmd.Env = l.cliEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &engine.Capped{W: &stdout, N: maxCLIOutput}
	cmd.Stderr = &engine.Capped{W: &stderr, N: maxCLIOutput}
	runErr := cmd.Run()
	var result struct {
		Outcome     string `json:"outcome"`
		ContainerID string `json:"containerId"`
		Message     string `json:"message"`
		Description string `json:"description"`
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	jsonErr := json.Unmarshal([]byte(lines[len(lines)-1]), &result)
	switch {
	case jsonErr == nil && result.Outcome == "success" && result.ContainerID != "":
		return result.ContainerID, nil
	case jsonErr == nil && result.Outcome != "":
		return result.ContainerID, fail(CodeEngine, "devcontainer up: %s%s", untrusted.Printable(result.Message), lastLines(stderr.String(), 12))
	case ctx.Err() != nil:
		return "", fail(CodeEngine, "devcontainer up did not finish within %s", devcontainerUpTimeout)
	default:
		return "", fail(CodeEngine, "devcontainer up: %v%s", runErr, lastLines(stderr.String(), 12))
	}
}

// refuseRootUser refuses, before any container exists, a devcontainer
// config whose user is root by name or number.
func refuseRootUser(dc *devcontainer.Config) error {
	key, user := dc.UserKey()
	if user == "root" || user == "0" || strings.HasPrefix(user, "0:") || strings.HasPrefix(user, "root:") {
		return &Error{Code: CodeUser, Message: dc.Refuse(key, "the container user is root: set remoteUser or containerUser to the workspace consumer, or leave them out").Error()}
	}
	return nil
}

// checkUser runs `id -u` and `id -g` in the primary container as the
// workspace consumer ("uid:gid", the user every exec of the launch uses)
// and refuses anything but the consumer's ids: the engine, not the
// config, says who the processes are. A user the devcontainer config
// names (remoteUser, else containerUser) must be the consumer too; it is resolved in the
// container by the consumer, never run as.
func (l *launcher) checkUser(ctx context.Context, dc *devcontainer.Config) (string, error) {
	key, configUser := dc.UserKey()
	user := consumerUser(l.rec.Consumer)
	uid, gid, err := userIDs(ctx, l.eng, l.rec.ContainerID, user)
	if err != nil {
		return "", fail(CodeUser, "run as the workspace consumer %s: %v", user, err)
	}
	if uid == 0 || uid != l.rec.Consumer.UID || gid != l.rec.Consumer.GID {
		return "", fail(CodeUser, "the container user has uid %d gid %d, not the workspace consumer's %s", uid, gid, user)
	}
	if configUser == "" || configUser == user {
		return user, nil
	}
	name, _, _ := strings.Cut(configUser, ":")
	uid, gid, err = userIDs(ctx, l.eng, l.rec.ContainerID, user, name)
	if err != nil {
		return "", &Error{Code: CodeUser, Message: dc.Refuse(key, "%q is not a user of the container", name).Error()}
	}
	if uid != l.rec.Consumer.UID || gid != l.rec.Consumer.GID {
		return "", &Error{Code: CodeUser, Message: dc.Refuse(key, "%q has uid %d gid %d, not the workspace consumer's %s", name, uid, gid, user).Error()}
	}
	return user, nil
}

// createContainers runs `docker compose create` on the generated inputs
// (the checked copies, then the facade) for the primary service: its
// container and those of the services it depends on are created, none
// is started. The environment is the
// CLI's own, as for devcontainer up.
func (l *launcher) createContainers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, devcontainerUpTimeout)
	defer cancel()
	in := filepath.Join(l.dir, inputsDir)
	args := []string{"compose", "--project-name", l.rec.ComposeProject}
	for _, f := range l.composeFiles {
		args = append(args, "--file", f)
	}
	// The primary and what it depends on: the services the CLI's up
	// (runServices) starts.
	args = append(args, "create", "--no-build", "--pull", "never", "--no-recreate", "--", l.primaryService)
	cmd := exec.CommandContext(ctx, dockerCLI(l.cfg), args...)
	cmd.Dir = in
	cmd.Env = l.cliEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &engine.Capped{W: &stderr, N: maxCLIOutput}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fail(CodeEngine, "docker compose create did not finish within %s", devcontainerUpTimeout)
		}
		return fail(CodeEngine, "docker compose create: %v%s", err, lastLines(stderr.String(), 12))
	}
	return nil
}

// cliEnv is the environment of the CLIs a launch runs: the fixed PATH, a
// HOME in the feature's directory (TMPDIR too) and the launch's Compose
// project name (the Dev Containers CLI takes COMPOSE_PROJECT_NAME before
// anything else).
func (l *launcher) cliEnv() []string {
	home := filepath.Join(l.dir, homeDir)
	return []string{
		"PATH=" + provider.SafePATH,
		"HOME=" + home,
		"TMPDIR=" + home, // the CLI's own Compose files go with the feature
		"COMPOSE_PROJECT_NAME=" + l.rec.ComposeProject,
	}
}

// inspectProject lists every container of the launch's Compose project
// and inspects each: at most one per runnable service, each keeping its
// expectation (the primary's, or every other service's), and nothing
// else in the project. Before start (running false) every container must
// be created and never started; after (running true) the primary must
// run. It returns the containers' ids by service and the primary's
// inspection.
func (l *launcher) inspectProject(ctx context.Context, want expectations, running bool) (map[string]string, container.InspectResponse, error) {
	var primary container.InspectResponse
	list, err := l.eng.ProjectContainers(ctx, l.rec.ComposeProject)
	if err != nil {
		return nil, primary, &Error{Code: CodeEngine, Message: err.Error()}
	}
	byService := make(map[string]string, len(list))
	for _, id := range slices.Sorted(maps.Keys(list)) {
		svc := list[id]
		switch {
		case !slices.Contains(want.runnable, svc):
			return nil, primary, fail(CodeInspection, "final inspection: container %s of the project is not a bound service's", engine.ShortID(id))
		case byService[svc] != "":
			return nil, primary, fail(CodeInspection, "final inspection: service %q has more than one container", svc)
		}
		byService[svc] = id
		c, err := l.eng.Inspect(ctx, id)
		if err != nil {
			return nil, primary, fail(CodeEngine, "inspect the container of service %q: %v", svc, err)
		}
		if c.ContainerJSONBase == nil || c.State == nil {
			return nil, primary, fail(CodeInspection, "final inspection: the container of service %q has no state to verify", svc)
		}
		if !running && (c.State.Status != "created" || c.State.StartedAt != "" && c.State.StartedAt != neverStarted) {
			return nil, primary, fail(CodeInspection, "final inspection: the container of service %q started before it was inspected", svc)
		}
		expect := want.service
		if svc == want.primaryService {
			expect, primary = want.primary, c
		}
		if err := inspect.Check(c, expect); err != nil {
			return nil, primary, fail(CodeInspection, "service %q: %v", svc, err)
		}
	}
	if byService[want.primaryService] == "" {
		return nil, primary, fail(CodeInspection, "final inspection: the primary service %q has no container", want.primaryService)
	}
	if running && !primary.State.Running {
		return nil, primary, fail(CodeInspection, "final inspection: the primary container is not running")
	}
	return byService, primary, nil
}

// neverStarted is the engine's StartedAt of a container that never ran.
const neverStarted = "0001-01-01T00:00:00Z"

// userIDs runs `id -u && id -g` as user in container id (one exec
// through the Engine API, bounded by execTimeout) and returns the uid and
// gid it prints: user's own, or those of the user named by of.
func userIDs(ctx context.Context, eng *engine.Engine, id, user string, of ...string) (uid, gid uint32, err error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	// The name is an argument of the script, never part of its text.
	out, code, err := eng.Exec(ctx, id, user, append([]string{"/bin/sh", "-c", `id -u -- "$@" && id -g -- "$@"`, "sh"}, of...)...)
	if err != nil || code != 0 {
		return 0, 0, errors.New("id failed in the container")
	}
	fields := strings.Fields(string(out))
	if len(fields) != 2 {
		return 0, 0, errors.New("id printed no uid and gid")
	}
	var ids [2]uint32
	for i, f := range fields {
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return 0, 0, errors.New("id printed no number")
		}
		ids[i] = uint32(n)
	}
	return ids[0], ids[1], nil
}

// startProxies starts one loopback port proxy per published port, on the
// primary container's network, recording each before the next.
func (l *launcher) startProxies(ctx context.Context, c container.InspectResponse) error {
	rec := l.rec
	if len(rec.PublishedPorts) == 0 {
		return nil
	}
	if c.NetworkSettings == nil || len(c.NetworkSettings.Networks) == 0 {
		return fail(CodeEngine, "the primary container has no network for its port proxies")
	}
	nets := make([]string, 0, len(c.NetworkSettings.Networks))
	for n := range c.NetworkSettings.Networks {
		nets = append(nets, n)
	}
	sort.Strings(nets)
	target := c.NetworkSettings.Networks[nets[0]].IPAddress
	if target == "" {
		return fail(CodeEngine, "the primary container has no address on %s", nets[0])
	}
	for _, p := range rec.PublishedPorts {
		id, err := l.eng.StartProxy(ctx, engine.Proxy{
			Project: rec.ComposeProject, Image: l.checked.Assignment.PortProxyImage,
			Network: nets[0], Target: target, Host: p.Host, Runtime: p.Runtime,
			Name: fmt.Sprintf("%s-proxy-%d", rec.ComposeProject, p.Host),
		})
		if id != "" {
			rec.Proxies = append(rec.Proxies, id)
			if saveErr := l.save(); saveErr != nil && err == nil {
				err = saveErr
			}
		}
		if err != nil {
			return &Error{Code: CodeEngine, Message: err.Error()}
		}
		crashpoint.Hit(crashpoint.LaunchProxyStarted)
		l.logf("port proxy 127.0.0.1:%d -> %s:%d", p.Host, rec.ComposeProject, p.Runtime)
	}
	return nil
}

// execArgs is the docker CLI's exec command line: each of names gets the
// docker CLI's own value for it, each of blank an empty value; no value
// is ever on the command line.
func execArgs(id, user, workdir string, names, blank []string, interactive bool, cmd []string) []string {
	args := []string{"exec"}
	if interactive {
		args = append(args, "--interactive")
	}
	args = append(args, "--user", user)
	if workdir != "" {
		args = append(args, "--workdir", workdir)
	}
	for _, n := range names {
		args = append(args, "--env", n)
	}
	for _, n := range blank {
		args = append(args, "--env", n+"=")
	}
	return append(append(args, id), cmd...)
}

func dockerCLI(cfg Config) string {
	if cfg.DockerCLI != "" {
		return cfg.DockerCLI
	}
	if p, err := lookPath("docker"); err == nil {
		return p
	}
	return "docker"
}

// lookPath finds a bare name in the fixed PATH only, never the caller's;
// a path is used as given.
func lookPath(name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	if p, ok := provider.LookPath(name); ok {
		return p, nil
	}
	return "", exec.ErrNotFound
}

// lastLines is the last n lines of s that are not a JavaScript stack
// frame, as a message suffix, each made printable (untrusted.Printable):
// a CLI's output holds the output of what the repository runs (its
// lifecycle commands, its images' messages), and the message goes to the
// operator's terminal and into the launch record.
func lastLines(s string, n int) string {
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		line = untrusted.Printable(line)
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "at ") {
			lines = append(lines, line)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\n  " + strings.Join(lines, "\n  ")
}
