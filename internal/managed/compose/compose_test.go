package compose_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"agentbox/internal/managed/compose"
)

const base = `services:
  app:
    image: app@sha256:0000000000000000000000000000000000000000000000000000000000000000
    environment:
      MODE: dev
`

// check parses one file compose.yaml with data.
func check(t *testing.T, data string) (*compose.Project, error) {
	t.Helper()
	return compose.Check(context.Background(), t.TempDir(), []compose.File{{Path: "compose.yaml", Data: []byte(data)}})
}

func TestCheckRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, rule string
	}{
		{"include", "include:\n  - other.yaml\n" + base, "include"},
		{"extends", base + "  web:\n    extends:\n      file: other.yaml\n      service: app\n", "extends"},
		{"provider", base + "  ai:\n    provider:\n      type: model\n", "provider"},
		{"volumes_from", base + "  web:\n    image: x\n    volumes_from: [app]\n", "volumes_from"},
		{"privileged", base + "    privileged: true\n", "privileged"},
		{"host pid", base + "    pid: host\n", "the host's pid namespace"},
		{"host ipc", base + "    ipc: host\n", "the host's ipc namespace"},
		{"host network", base + "    network_mode: host\n", "the host's network"},
		{"host cgroup", base + "    cgroup: host\n", "the host's cgroup namespace"},
		{"host uts", base + "    uts: host\n", "the host's uts namespace"},
		{"host userns", base + "    userns_mode: host\n", "the host's user namespace"},
		{"cap_add ALL", base + "    cap_add: [ALL]\n", "cap_add ALL"},
		{"cap_add SYS_ADMIN", base + "    cap_add: [CHOWN, SYS_ADMIN]\n", "cap_add SYS_ADMIN"},
		{"cap_add CAP_NET_ADMIN", base + "    cap_add: [CAP_NET_ADMIN]\n", "cap_add CAP_NET_ADMIN"},
		{"cap_add sys_ptrace", base + "    cap_add: [sys_ptrace]\n", "cap_add sys_ptrace"},
		{"service secrets", base + "    secrets: [token]\nsecrets:\n  token:\n    file: ./token\n", "service secrets"},
		{"service configs", base + "    configs: [conf]\nconfigs:\n  conf:\n    file: ./conf\n", "service configs"},
		{"external volume", base + "volumes:\n  data:\n    external: true\n", "an external volume"},
		{"docker socket bind", base + "    volumes:\n      - /var/run/docker.sock:/var/run/docker.sock\n", "a container-engine socket (docker.sock)"},
		{"containerd socket", base + "    volumes:\n      - /run/containerd/containerd.sock:/c.sock\n", "a container-engine socket (containerd.sock)"},
		{"podman socket in a label", base + "    labels:\n      x: /run/podman/podman.sock\n", "a container-engine socket (podman.sock)"},
		{"DOCKER_HOST", base + "      DOCKER_HOST: tcp://1.2.3.4:2375\n", "a container-engine variable (DOCKER_HOST)"},
		{"DOCKER_HOST in a list", "services:\n  app:\n    image: x\n    environment:\n      - DOCKER_HOST=unix:///x\n", "a container-engine variable (DOCKER_HOST)"},
		{"CONTAINERD_ADDRESS in a command", base + "    command: sh -c 'echo CONTAINERD_ADDRESS'\n", "a container-engine variable (CONTAINERD_ADDRESS)"},
		{"${VAR}", base + "    image: app:${TAG}\n", "interpolation (write $$ for a literal $)"},
		{"$VAR", base + "    command: echo $HOME\n", "interpolation (write $$ for a literal $)"},
		{"$_VAR", base + "    command: echo $_X\n", "interpolation (write $$ for a literal $)"},
		{"interpolated key", base + "      ${KEY}: v\n", "interpolation (write $$ for a literal $)"},
		{"valueless list entry", "services:\n  app:\n    image: x\n    environment:\n      - TOKEN\n", `a valueless entry "TOKEN"`},
		{"valueless map entry", base + "      TOKEN:\n", `a valueless entry "TOKEN"`},
		{"not a mapping", "- a\n- b\n", "not a mapping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := check(t, tc.yaml)
			var r *compose.Refusal
			if !errors.As(err, &r) || r.Rule != tc.rule {
				t.Fatalf("Check = %v, want the refusal %q", err, tc.rule)
			}
		})
	}
}

func TestCheckAccepts(t *testing.T) {
	for _, tc := range []struct{ name, yaml string }{
		{"plain", base},
		{"an escaped dollar", base + "    command: sh -c 'echo $$HOME costs $$5'\n"},
		{"a lone dollar", base + "    command: echo 5$ and $ and $1\n"},
		{"harmless caps", base + "    cap_add: [CHOWN, NET_BIND_SERVICE]\n    cap_drop: [ALL]\n"},
		{"empty value", base + "      EMPTY: ''\n"},
		{"list entry with a value", "services:\n  app:\n    image: x\n    environment:\n      - A=1\n      - B=\n"},
		{"a named volume", base + "    volumes:\n      - data:/data\nvolumes:\n  data: {}\n"},
		{"a word that contains an engine variable", base + "      MY_DOCKER_HOSTNAME: x\n"},
		{"private cgroup", base + "    cgroup: private\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := check(t, tc.yaml); err != nil {
				t.Fatalf("Check: %v", err)
			}
		})
	}
}

// TestConnectorsAndRunnable: outer tunnel connectors (by name, image or
// the tun device) are set apart; the rest are the runnable services.
func TestConnectorsAndRunnable(t *testing.T) {
	p, err := check(t, `services:
  app: {image: a}
  db: {image: postgres}
  cloudflared: {image: x}
  Tailscale: {image: x}
  my-tunnel: {image: x}
  edge: {image: "cloudflare/cloudflared:2024.1"}
  vpn: {image: "ghcr.io/tailscale/tailscale@sha256:0000000000000000000000000000000000000000000000000000000000000000"}
  wg:
    image: x
    devices: ["/dev/net/tun:/dev/net/tun"]
  tunneler: {image: x}
`)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"Tailscale", "cloudflared", "edge", "my-tunnel", "vpn", "wg"}; !reflect.DeepEqual(p.Connectors, want) {
		t.Errorf("connectors %q, want %q", p.Connectors, want)
	}
	if want := []string{"app", "db", "tunneler"}; !reflect.DeepEqual(p.Runnable, want) {
		t.Errorf("runnable %q, want %q", p.Runnable, want)
	}
}

// TestLaterFilesMerge: files are merged in order, as Compose does, and
// each is checked as written.
func TestLaterFilesMerge(t *testing.T) {
	files := []compose.File{
		{Path: "compose.yaml", Data: []byte(base)},
		{Path: "compose.override.yaml", Data: []byte("services:\n  app:\n    command: [sleep, infinity]\n  worker: {image: w}\n")},
	}
	p, err := compose.Check(context.Background(), t.TempDir(), files)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Runnable, []string{"app", "worker"}) || p.Model.Services["app"].Command[0] != "sleep" {
		t.Fatalf("merged: %q %v", p.Runnable, p.Model.Services["app"].Command)
	}
	files[1].Data = []byte("services:\n  app:\n    privileged: true\n")
	var r *compose.Refusal
	if _, err := compose.Check(context.Background(), t.TempDir(), files); !errors.As(err, &r) || r.Rule != "privileged" {
		t.Fatalf("a refused key in a later file: %v", err)
	}
}

func TestInputs(t *testing.T) {
	wt := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		p := filepath.Join(wt, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := compose.Inputs(wt, compose.DevcontainerFiles{}); err == nil || !strings.Contains(err.Error(), "no Compose file") {
		t.Fatalf("no file: %v", err)
	}
	// The first default name that exists, in order.
	write("docker-compose.yml", base)
	write("compose.yml", base)
	files, err := compose.Inputs(wt, compose.DevcontainerFiles{})
	if err != nil || len(files) != 1 || files[0].Path != "compose.yml" || string(files[0].Data) != base {
		t.Fatalf("default names: %+v %v", files, err)
	}
	// The devcontainer's, relative to its directory, in its order.
	write(".devcontainer/compose.dev.yaml", base)
	dc := compose.DevcontainerFiles{Set: true, Dir: ".devcontainer", Files: []string{"../compose.yml", "compose.dev.yaml"}}
	files, err = compose.Inputs(wt, dc)
	if err != nil || len(files) != 2 || files[0].Path != "compose.yml" || files[1].Path != ".devcontainer/compose.dev.yaml" {
		t.Fatalf("devcontainer files: %+v %v", files, err)
	}
	for _, tc := range []struct {
		name  string
		dc    compose.DevcontainerFiles
		setup func()
		want  string
	}{
		{"an explicit empty list", compose.DevcontainerFiles{Set: true}, nil, "empty list"},
		{"an absolute path", compose.DevcontainerFiles{Set: true, Files: []string{"/etc/passwd"}}, nil, "relative"},
		{"outside by ..", compose.DevcontainerFiles{Set: true, Dir: ".devcontainer", Files: []string{"../../x.yaml"}}, nil, "outside the worktree"},
		{"a symlink out", compose.DevcontainerFiles{Set: true, Files: []string{"out.yaml"}}, func() {
			os.Symlink("/etc/hostname", filepath.Join(wt, "out.yaml"))
		}, "does not resolve inside the worktree"},
		{"a directory", compose.DevcontainerFiles{Set: true, Files: []string{".devcontainer"}}, nil, "not a regular file"},
		{"missing", compose.DevcontainerFiles{Set: true, Files: []string{"nope.yaml"}}, nil, "does not exist"},
		{"not UTF-8", compose.DevcontainerFiles{Set: true, Files: []string{"latin1.yaml"}}, func() {
			write("latin1.yaml", "services:\n  caf\xe9: {image: x}\n")
		}, "not UTF-8"},
		{"one byte over the limit", compose.DevcontainerFiles{Set: true, Files: []string{"big.yaml"}}, func() {
			write("big.yaml", "#"+strings.Repeat("x", compose.MaxFileBytes))
		}, "over 8388608 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			if _, err := compose.Inputs(wt, tc.dc); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Inputs = %v, want an error with %q", err, tc.want)
			}
		})
	}
	// A symlink that stays inside is followed; a file at the limit is read.
	os.Symlink("compose.yml", filepath.Join(wt, "link.yaml"))
	write("limit.yaml", "#"+strings.Repeat("x", compose.MaxFileBytes-1))
	files, err = compose.Inputs(wt, compose.DevcontainerFiles{Set: true, Files: []string{"link.yaml", "limit.yaml"}})
	if err != nil || string(files[0].Data) != base || len(files[1].Data) != compose.MaxFileBytes {
		t.Fatalf("inside symlink and a file at the limit: %v", err)
	}
}

// FuzzCheck: whatever a repository's Compose file holds, Check answers
// (a project or an error) without panicking, and a project it returns
// splits its services into runnable and connectors.
func FuzzCheck(f *testing.F) {
	f.Add([]byte(base))
	f.Add([]byte("services:\n  a: {image: x, environment: [A=$$B]}\n"))
	f.Add([]byte("include: [x]\n"))
	f.Add([]byte("services: &a\n  b: *a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := compose.Check(context.Background(), t.TempDir(), []compose.File{{Path: "compose.yaml", Data: data}})
		if err == nil && len(p.Runnable)+len(p.Connectors) != len(p.Services) {
			t.Fatalf("services %q split into %q and %q", p.Services, p.Runnable, p.Connectors)
		}
	})
}
