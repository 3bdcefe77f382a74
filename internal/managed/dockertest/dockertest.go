// Package dockertest gives tests the real Docker engine that
// scripts/docker-setup.sh installs and starts (.ci/run runs it, then sets
// BRANCHBOX_TEST_DOCKER=1): the engine, the Docker Compose v2 CLI plugin,
// the Dev Containers CLI and two local images, imported without any
// registry:
//
//   - ServiceImageTag: Debian bookworm minbase with a user dev (uid and
//     gid 1000, home /home/dev) and /usr/local/bin/agentbox-probe (package
//     probe: vsock, seccomp and env checks from inside a container);
//   - ProxyImageTag: only /tcp-proxy (package tcpproxy), its entrypoint,
//     run as `/tcp-proxy LISTEN_PORT TARGET_HOST:TARGET_PORT`.
//
// Tests call Require (and ImageID for the images they run). When something
// is missing they skip, unless BRANCHBOX_TEST_DOCKER=1, where they fail:
// CI must not pass by skipping.
package dockertest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// ServiceImageTag is the local test image for services and workspaces.
	ServiceImageTag = "agentbox-test/service:1"
	// ProxyImageTag is the local image of branchbox's port proxies.
	ProxyImageTag = "agentbox-test/tcp-proxy:1"
	// Env, set to 1, makes a missing engine, tool or image fail tests
	// instead of skipping them.
	Env = "BRANCHBOX_TEST_DOCKER"
)

// checkTimeout bounds each of Require's commands: a wedged engine fails
// (or skips) the tests instead of hanging them.
const checkTimeout = 30 * time.Second

var (
	requireOnce sync.Once
	requireErr  error
)

// Require skips or fails t unless the Docker engine answers, `docker
// compose` is the v2 plugin and the Dev Containers CLI runs. The check
// runs once per test binary.
func Require(t testing.TB) {
	t.Helper()
	requireOnce.Do(func() { requireErr = check() })
	if requireErr != nil {
		missing(t, requireErr.Error())
	}
}

func check() error {
	var problems []string
	if _, err := run("docker", "info", "--format", "{{.ServerVersion}}"); err != nil {
		problems = append(problems, "docker engine: "+err.Error())
	}
	if v, err := run("docker", "compose", "version", "--short"); err != nil {
		problems = append(problems, "docker compose: "+err.Error())
	} else if !strings.HasPrefix(strings.TrimPrefix(v, "v"), "2.") {
		problems = append(problems, fmt.Sprintf("docker compose: version %q, want 2.x", v))
	}
	if _, err := run("devcontainer", "--version"); err != nil {
		problems = append(problems, "devcontainer CLI: "+err.Error())
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// run runs a command with checkTimeout and returns its trimmed stdout.
func run(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("timed out after %v", checkTimeout)
		}
		if s := strings.TrimSpace(stderr.String()); s != "" {
			err = fmt.Errorf("%w: %s", err, s)
		}
		return "", err
	}
	return strings.TrimSpace(stdout.String()), nil
}

// missing fails t under BRANCHBOX_TEST_DOCKER=1 and skips it otherwise.
func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(Env) == "1" {
		t.Fatalf("dockertest: %s (%s=1: Docker tests must run)", why, Env)
	}
	t.Skipf("dockertest: %s; run `bash scripts/docker-setup.sh` (as root), then set %s=1", why, Env)
}

var imageIDPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ImageID returns the local content id (sha256:<64 hex>) of the image
// tagged tag, skipping or failing t (as Require does) when it is missing.
func ImageID(t testing.TB, tag string) string {
	t.Helper()
	Require(t)
	id, err := run("docker", "image", "inspect", "--format", "{{.Id}}", tag)
	if err != nil {
		missing(t, fmt.Sprintf("image %s: %v", tag, err))
	}
	if !imageIDPattern.MatchString(id) {
		t.Fatalf("dockertest: image %s has id %q, not sha256:<64 hex>", tag, id)
	}
	return id
}

// Docker runs the docker CLI with args and returns its trimmed stdout,
// failing t with its stderr when it fails. It has no timeout of its own
// (containers may take long); the test binary's -timeout bounds it.
func Docker(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command("docker", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String())
}
