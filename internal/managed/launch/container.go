package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/docker/docker/api/types/container"

	"agentbox/internal/crashpoint"
	"agentbox/internal/managed/devcontainer"
	"agentbox/internal/managed/engine"
	"agentbox/internal/managed/provider"
)

// maxCLIOutput bounds what is kept of a CLI's output for a message.
const maxCLIOutput = 64 << 10

// devcontainerUp runs `devcontainer up` on the generated config, from an
// environment of its own: the fixed PATH, a HOME in the feature's
// directory (TMPDIR too), and the launch's Compose project name (the CLI takes
// COMPOSE_PROJECT_NAME before anything else). It returns the container id
// the CLI reports, also when it reports a failure after creating one.
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
	cmd.Env = []string{
		"PATH=" + provider.SafePATH,
		"HOME=" + filepath.Join(l.dir, homeDir),
		"TMPDIR=" + filepath.Join(l.dir, homeDir), // the CLI's own Compose files go with the feature
		"COMPOSE_PROJECT_NAME=" + l.rec.ComposeProject,
	}
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
		return result.ContainerID, fail(CodeEngine, "devcontainer up: %s%s", result.Message, lastLines(stderr.String(), 12))
	case ctx.Err() != nil:
		return "", fail(CodeEngine, "devcontainer up did not finish within %s", devcontainerUpTimeout)
	default:
		return "", fail(CodeEngine, "devcontainer up: %v%s", runErr, lastLines(stderr.String(), 12))
	}
}

// checkUser resolves the user the provider runs as (remoteUser, else
// containerUser, else the image's Config.User), runs `id -u` and `id -g`
// as that user in the container (one exec), and refuses root or anything but the
// signed consumer.
func (l *launcher) checkUser(ctx context.Context, dc *devcontainer.Config, imageUser string) (string, error) {
	user := dc.User()
	if user == "" {
		user = imageUser
	}
	if user == "" || user == "root" || user == "0" || strings.HasPrefix(user, "0:") {
		return "", fail(CodeUser, "the container user is root: set remoteUser, containerUser or the service's user to the workspace consumer")
	}
	uid, gid, err := userIDs(ctx, l.eng, l.rec.ContainerID, user)
	if err != nil {
		return "", fail(CodeUser, "resolve the container user %q: %v", user, err)
	}
	for _, c := range []struct {
		what      string
		got, want uint32
	}{{"uid", uid, l.rec.Consumer.UID}, {"gid", gid, l.rec.Consumer.GID}} {
		if c.got == 0 || c.got != c.want {
			return "", fail(CodeUser, "the container user %q has %s %d, not the workspace consumer's %d", user, c.what, c.got, c.want)
		}
	}
	return user, nil
}

// userIDs runs `id -u && id -g` as user in container id (one exec
// through the Engine API, bounded by execTimeout) and returns the uid and
// gid it prints.
func userIDs(ctx context.Context, eng *engine.Engine, id, user string) (uid, gid uint32, err error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	out, code, err := eng.Exec(ctx, id, user, "/bin/sh", "-c", "id -u && id -g")
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

// execArgs is the docker CLI's exec command line.
func execArgs(id, user, workdir string, env []string, interactive bool, cmd []string) []string {
	args := []string{"exec"}
	if interactive {
		args = append(args, "--interactive")
	}
	args = append(args, "--user", user)
	if workdir != "" {
		args = append(args, "--workdir", workdir)
	}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		args = append(args, "--env", name)
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
// frame, as a message suffix.
func lastLines(s string, n int) string {
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "at ") {
			lines = append(lines, line)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\n  " + strings.Join(lines, "\n  ")
}
