package managedtest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ConsumerUID is the workspace consumer (uid and gid) of launch
// documents: the test service image's user dev.
const ConsumerUID = 1000

// Probe is the test service image's helper (see package dockertest):
// launch documents sign it as the provider executable.
const Probe = "/usr/local/bin/agentbox-probe"

// DevcontainerJSON is a launch repository's devcontainer config:
// Compose-based, run as dev, with comments and a trailing comma.
const DevcontainerJSON = `{
	// comments are allowed
	"name": "launch test",
	"dockerComposeFile": ["../compose.yaml"],
	"service": "app",
	"workspaceFolder": "/workspaces/ignored",
	"remoteUser": "dev",
	"postCreateCommand": "true",
}
`

// ComposeYAML is a launch repository's Compose file: two runnable
// services, with a build, a host volume and a port the facade resets,
// and one connector.
const ComposeYAML = `services:
  app:
    build: .
    image: example/app:dev
    command: ["sleep", "infinity"]
    environment:
      APP_MODE: test
    volumes:
      - ./data:/data
    ports:
      - "8080:8080"
  db:
    image: example/db:dev
    command: ["sleep", "infinity"]
  tunnel:
    image: cloudflare/cloudflared:latest
`

// LaunchFiles are a launch repository's files.
func LaunchFiles() map[string]string {
	return map[string]string{
		".devcontainer/devcontainer.json": DevcontainerJSON,
		"compose.yaml":                    ComposeYAML,
		"README":                          "a test repository\n",
	}
}

// Images are the local images a launch document binds.
type Images struct {
	Service, Proxy string // content ids (sha256:...)
	ProxyPort      uint16 // the published host port
}

// LaunchDoc is a version 3 launch assignment of Base's leases for the
// repository at repo (revision rev): both runnable services on
// img.Service, one port (img.ProxyPort -> 8080) through img.Proxy, the
// consumer ConsumerUID, and Probe as the provider executable.
func LaunchDoc(repo, rev string, img Images) map[string]any {
	doc := Base()
	doc["version"] = "3"
	doc["workspace_consumer"] = map[string]any{"uid": ConsumerUID, "gid": ConsumerUID}
	doc["service_images"] = map[string]any{"app": img.Service, "db": img.Service}
	doc["port_proxy_image"] = img.Proxy
	doc["published_ports"] = []any{map[string]any{"host": int(img.ProxyPort), "runtime": 8080}}
	doc["repository"] = map[string]any{"path": repo, "revision": rev}
	doc["workspace"] = filepath.Dir(repo)
	Lease(doc, 0)["executable"] = Probe
	return doc
}

// MakeRepo creates a repository at dir holding files in one commit with
// fixed dates, so the same files give the same revision, and returns it.
func MakeRepo(t testing.TB, dir string, files map[string]string) string {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(content), 0o644))
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-q", "-m", "snapshot"}} {
		_, err := Git(dir, args...)
		must(t, err)
	}
	rev, err := Git(dir, "rev-parse", "HEAD")
	must(t, err)
	return rev
}

// Git runs git in dir with a fixed identity and dates and no user or
// system configuration, and returns its trimmed stdout.
func Git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid",
		"GIT_AUTHOR_DATE=2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2026-01-01T00:00:00Z",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", errors.New("git " + strings.Join(args, " ") + ": " + err.Error() + ": " + stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}
