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

// check parses one file compose.yaml with data and applies the key
// allow-list to its runnable services, as a launch does.
func check(t *testing.T, data string) (*compose.Project, error) {
	t.Helper()
	p, err := compose.Check(context.Background(), t.TempDir(), []compose.File{{Path: "compose.yaml", Data: []byte(data)}})
	if err != nil {
		return nil, err
	}
	return p, p.CheckRunnable()
}

// Rules of a service key outside the allow-list and of a top-level key
// outside topKeys: the refusal's Where names the file and the key path.
const (
	notAllowed = "not allowed in a managed launch"
	topKey     = "top-level key not allowed in a managed launch"
)

func TestCheckRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, where, rule string
	}{
		{"include", "include:\n  - other.yaml\n" + base, "compose.yaml: include", "not allowed in a managed launch (it reads other files)"},
		{"extends", base + "  web:\n    extends:\n      file: other.yaml\n      service: app\n", "compose.yaml: services.web.extends", notAllowed},
		{"provider", base + "  ai:\n    provider:\n      type: model\n", "compose.yaml: services.ai.provider", notAllowed},
		{"volumes_from", base + "  web:\n    image: x\n    volumes_from: [app]\n", "compose.yaml: services.web.volumes_from", notAllowed},
		{"privileged", base + "    privileged: true\n", "compose.yaml: services.app.privileged", notAllowed},
		{"host pid", base + "    pid: host\n", "compose.yaml: services.app.pid", notAllowed},
		{"host ipc", base + "    ipc: host\n", "compose.yaml: services.app.ipc", notAllowed},
		{"host network", base + "    network_mode: host\n", "compose.yaml: services.app.network_mode", notAllowed},
		{"host cgroup", base + "    cgroup: host\n", "compose.yaml: services.app.cgroup", notAllowed},
		{"private cgroup", base + "    cgroup: private\n", "compose.yaml: services.app.cgroup", notAllowed},
		{"host uts", base + "    uts: host\n", "compose.yaml: services.app.uts", notAllowed},
		{"host userns", base + "    userns_mode: host\n", "compose.yaml: services.app.userns_mode", notAllowed},
		{"cap_add ALL", base + "    cap_add: [ALL]\n", "compose.yaml: services.app.cap_add", notAllowed},
		{"cap_add harmless", base + "    cap_add: [CHOWN, NET_BIND_SERVICE]\n", "compose.yaml: services.app.cap_add", notAllowed},
		{"device rules", base + "    device_cgroup_rules: [\"b *:* rwm\"]\n", "compose.yaml: services.app.device_cgroup_rules", notAllowed},
		{"devices", base + "    devices: [\"/dev/sda:/dev/sda\"]\n", "compose.yaml: services.app.devices", notAllowed},
		{"sysctls", base + "    sysctls: {net.ipv4.ip_forward: 1}\n", "compose.yaml: services.app.sysctls", notAllowed},
		{"cgroup_parent", base + "    cgroup_parent: /system.slice\n", "compose.yaml: services.app.cgroup_parent", notAllowed},
		{"runtime", base + "    runtime: runsc\n", "compose.yaml: services.app.runtime", notAllowed},
		{"security_opt", base + "    security_opt: [seccomp:unconfined]\n", "compose.yaml: services.app.security_opt", notAllowed},
		{"network of a service", base + "  side:\n    image: x\n    network_mode: service:app\n", "compose.yaml: services.side.network_mode", notAllowed},
		{"pid of a service", base + "  side:\n    image: x\n    pid: service:app\n", "compose.yaml: services.side.pid", notAllowed},
		{"labels", base + "    labels: {io.branchbox.project: other}\n", "compose.yaml: services.app.labels", notAllowed},
		{"group_add", base + "    group_add: [disk]\n", "compose.yaml: services.app.group_add", notAllowed},
		{"post_start hook", base + "    post_start:\n      - command: id\n        user: root\n        privileged: true\n", "compose.yaml: services.app.post_start", notAllowed},
		{"container_name", base + "    container_name: fixed\n", "compose.yaml: services.app.container_name", notAllowed},
		{"networks", base + "    networks: [default]\n", "compose.yaml: services.app.networks", notAllowed},
		{"cap_add by a merge key", "x-evil: &evil\n  cap_add: [SYS_MODULE]\n" + base + "    <<: *evil\n", "compose.yaml: services.app.cap_add", notAllowed},
		{"cap_add with !override", base + "    cap_add: !override [SYS_RAWIO]\n", "compose.yaml: services.app.cap_add", notAllowed},
		{"depends_on a connector", base + "    depends_on: [tunnel]\n  tunnel:\n    image: x\n", "compose.yaml: services.app.depends_on.tunnel", `"tunnel" is not a bound service`},
		{"top-level networks", base + "networks:\n  default:\n    external: true\n", "compose.yaml: networks", topKey},
		{"top-level name", "name: other\n" + base, "compose.yaml: name", topKey},
		{"service secrets", base + "    secrets: [token]\nsecrets:\n  token:\n    file: ./token\n", "compose.yaml: secrets", topKey},
		{"service configs", base + "    configs: [conf]\nconfigs:\n  conf:\n    file: ./conf\n", "compose.yaml: configs", topKey},
		{"external volume", base + "volumes:\n  data:\n    external: true\n", "compose.yaml: volumes.data", "a volume definition (a managed launch mounts none of the repository's volumes; declare it empty)"},
		{"volume driver options", base + "volumes:\n  data:\n    driver_opts: {type: none, o: bind, device: /}\n", "compose.yaml: volumes.data", "a volume definition (a managed launch mounts none of the repository's volumes; declare it empty)"},
		{"docker socket bind", base + "    volumes:\n      - /var/run/docker.sock:/var/run/docker.sock\n", "compose.yaml: services.app.volumes[0]", "a container-engine socket (docker.sock)"},
		{"containerd socket", base + "    volumes:\n      - /run/containerd/containerd.sock:/c.sock\n", "compose.yaml: services.app.volumes[0]", "a container-engine socket (containerd.sock)"},
		{"podman socket in a label", base + "    labels:\n      x: /run/podman/podman.sock\n", "compose.yaml: services.app.labels.x", "a container-engine socket (podman.sock)"},
		{"DOCKER_HOST", base + "      DOCKER_HOST: tcp://1.2.3.4:2375\n", "compose.yaml: services.app.environment.DOCKER_HOST", "a container-engine variable (DOCKER_HOST)"},
		{"DOCKER_HOST in a list", "services:\n  app:\n    image: x\n    environment:\n      - DOCKER_HOST=unix:///x\n", "compose.yaml: services.app.environment[0]", "a container-engine variable (DOCKER_HOST)"},
		{"CONTAINERD_ADDRESS in a command", base + "    command: sh -c 'echo CONTAINERD_ADDRESS'\n", "compose.yaml: services.app.command", "a container-engine variable (CONTAINERD_ADDRESS)"},
		{"${VAR}", base + "    image: app:${TAG}\n", "compose.yaml: services.app.image", "interpolation (write $$ for a literal $)"},
		{"$VAR", base + "    command: echo $HOME\n", "compose.yaml: services.app.command", "interpolation (write $$ for a literal $)"},
		{"$_VAR", base + "    command: echo $_X\n", "compose.yaml: services.app.command", "interpolation (write $$ for a literal $)"},
		{"interpolated key", base + "      ${KEY}: v\n", "compose.yaml: services.app.environment.${KEY}", "interpolation (write $$ for a literal $)"},
		{"valueless list entry", "services:\n  app:\n    image: x\n    environment:\n      - TOKEN\n", "compose.yaml: services.app.environment[0]", `a valueless entry "TOKEN"`},
		{"valueless map entry", base + "      TOKEN:\n", "compose.yaml: services.app.environment.TOKEN", `a valueless entry "TOKEN"`},
		{"not a mapping", "- a\n- b\n", "compose.yaml", "not a mapping"},
		// Compose reads every document of a file, merged in order, and
		// acts on a connector's extends (another file read, a remote one
		// fetched on the host) when it loads the files.
		{"interpolation in a later document", base + "---\nservices:\n  db:\n    image: y\n    command: [\"${HOME}\"]\n", "compose.yaml: services.db.command[0]", "interpolation (write $$ for a literal $)"},
		{"valueless entry in a later document", base + "---\nservices:\n  db:\n    image: y\n    environment: [HOME]\n", "compose.yaml: services.db.environment[0]", `a valueless entry "HOME"`},
		{"extends in a later document", base + "---\nservices:\n  tunnel:\n    image: x\n    extends: {file: /etc/hostname, service: s}\n", "compose.yaml: services.tunnel.extends", notAllowed},
		{"extends by a merge key", "x-e: &e\n  extends: {file: \"https://github.com/o/r.git#main:c.yaml\", service: s}\n" + base + "  tunnel:\n    image: x\n    <<: *e\n", "compose.yaml: services.tunnel.extends", notAllowed},
		{"provider by a merge key", "x-p: &p\n  provider: {type: ./run.sh}\n" + base + "  tunnel:\n    <<: *p\n", "compose.yaml: services.tunnel.provider", notAllowed},
		{"label_file on a connector", base + "  tunnel:\n    image: x\n    label_file: /etc/shadow\n", "compose.yaml: services.tunnel.label_file", notAllowed},
		{"valueless entry by an alias", "x-h: &h HOME\n" + base + "  db:\n    image: y\n    environment: [*h]\n", "compose.yaml: services.db.environment[0]", `a valueless entry "HOME"`},
		{"valueless entry by a merge key", "x-m: &m\n  HOME: null\n" + base + "  db:\n    image: y\n    environment:\n      <<: *m\n", "compose.yaml: services.db.environment.HOME", `a valueless entry "HOME"`},
		{"valueless entry by an aliased mapping", "x-m: &m\n  HOME:\n" + base + "  db:\n    image: y\n    environment: *m\n", "compose.yaml: services.db.environment.HOME", `a valueless entry "HOME"`},
		// A service behind a profile is runnable like any other (the Dev
		// Containers CLI loads every profile, reading its env_file on
		// the host), and its profiles key is refused.
		{"a service behind a profile", base + "  evil:\n    image: y\n    profiles: [p]\n    env_file: /etc/shadow\n", "compose.yaml: services.evil.profiles", notAllowed},
		// Compose reads a !!binary value decoded: ${HOME} in base64.
		{"!!binary value", base + "    command: !!binary JHtIT01FfQ==\n", "compose.yaml: services.app.command", "a !!binary value (write it as text)"},
		{"!!binary key", base + "    x-k:\n      !!binary JHtIT01FfQ==: v\n", "compose.yaml: services.app.x-k.JHtIT01FfQ==", "a !!binary value (write it as text)"},
		// A key is shown as it is only when it cannot forge a line.
		{"a key with a newline", base + "    x-note: {\"x\\nbranchbox: docker.sock\": 1}\n", `compose.yaml: services.app.x-note."x\nbranchbox: docker.sock"`, "a container-engine socket (docker.sock)"},
		{"nested too deep", base + "    x-deep: " + strings.Repeat("[", 70) + strings.Repeat("]", 70) + "\n", "compose.yaml: services.app.x-deep" + strings.Repeat("[0]", 62), "nested too deep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := check(t, tc.yaml)
			var r *compose.Refusal
			if !errors.As(err, &r) || r.Where != tc.where || r.Rule != tc.rule {
				t.Fatalf("Check = %v, want the refusal %q at %q", err, tc.rule, tc.where)
			}
			// The message names the file and the key path, then the rule.
			if want := "compose: " + tc.where + ": " + tc.rule; err.Error() != want {
				t.Fatalf("message %q, want %q", err, want)
			}
		})
	}
}

func TestCheckAccepts(t *testing.T) {
	for _, tc := range []struct{ name, yaml string }{
		{"plain", base},
		{"an escaped dollar", base + "    command: sh -c 'echo $$HOME costs $$5'\n"},
		{"a lone dollar", base + "    command: echo 5$ and $ and $1\n"},
		{"cap_drop (replaced)", base + "    cap_drop: [ALL]\n"},
		{"every kept key", base + "    command: [sleep, infinity]\n    entrypoint: [/bin/sh, -c]\n    working_dir: /w\n    healthcheck: {test: [CMD, \"true\"]}\n    init: true\n    tty: true\n    stdin_open: true\n    stop_signal: SIGINT\n    stop_grace_period: 5s\n    restart: unless-stopped\n    hostname: app\n    read_only: true\n    mem_limit: 1g\n    cpus: 1.5\n    pids_limit: 100\n    user: \"0\"\n    depends_on: [db]\n  db:\n    image: y\n"},
		{"every replaced key", base + "    build: .\n    pull_policy: always\n    ports: [\"80:80\"]\n    expose: [\"81\"]\n    env_file: [.env]\n    volumes: [/:/host]\n"},
		{"extension keys", "x-common: &c\n  MODE: x\n" + base + "    x-note: hello\n"},
		{"a version", "version: \"3.8\"\n" + base},
		{"a connector with anything", base + "  tailscale:\n    image: tailscale/tailscale\n    cap_add: [NET_ADMIN]\n    devices: [/dev/net/tun]\n    network_mode: host\n"},
		{"empty value", base + "      EMPTY: ''\n"},
		{"list entry with a value", "services:\n  app:\n    image: x\n    environment:\n      - A=1\n      - B=\n"},
		{"a named volume", base + "    volumes:\n      - data:/data\nvolumes:\n  data: {}\n"},
		{"a word that contains an engine variable", base + "      MY_DOCKER_HOSTNAME: x\n"},
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
	p, err = compose.Check(context.Background(), t.TempDir(), files)
	if err != nil {
		t.Fatal(err)
	}
	var r *compose.Refusal
	if err := p.CheckRunnable(); !errors.As(err, &r) || r.Rule != notAllowed || r.Where != "compose.override.yaml: services.app.privileged" {
		t.Fatalf("a refused key in a later file: %v, want it named with its file and key path", err)
	}
	// A dependency on a connector, named in a later file, in the long
	// form: that file and that entry.
	files[1].Data = []byte("services:\n  app:\n    depends_on:\n      tunnel: {condition: service_started}\n  tunnel:\n    image: cloudflare/cloudflared\n")
	if p, err = compose.Check(context.Background(), t.TempDir(), files); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckRunnable(); err == nil || err.Error() != `compose: compose.override.yaml: services.app.depends_on.tunnel: "tunnel" is not a bound service` {
		t.Fatalf("a dependency on a connector in a later file: %v", err)
	}
	// Omitted services are the assignment's: its field and entry.
	if p, err = compose.Check(context.Background(), t.TempDir(), files[:1]); err != nil {
		t.Fatal(err)
	}
	if err := p.Omit([]string{"app"}, "app"); err == nil || err.Error() != `compose: assignment: omitted_services[0]: "app" is the primary service, which cannot be omitted` {
		t.Fatalf("omitting the primary: %v", err)
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
		{"an explicit empty list", compose.DevcontainerFiles{Set: true, Config: ".devcontainer.json"}, nil, "devcontainer: .devcontainer.json: dockerComposeFile: an empty list"},
		{"an absolute path", compose.DevcontainerFiles{Set: true, Files: []string{"a.yaml", "/etc/passwd"}, Config: ".devcontainer.json"}, nil,
			`devcontainer: .devcontainer.json: dockerComposeFile[1]: "/etc/passwd" must be a path relative`},
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
	// A devcontainer config names at most MaxFiles files (a name may
	// repeat, as Compose allows), of at most MaxTotalBytes together.
	many := func(n int, name string) compose.DevcontainerFiles {
		dc := compose.DevcontainerFiles{Set: true, Config: ".devcontainer.json"}
		for range n {
			dc.Files = append(dc.Files, name)
		}
		return dc
	}
	if files, err := compose.Inputs(wt, many(compose.MaxFiles, "compose.yml")); err != nil || len(files) != compose.MaxFiles {
		t.Fatalf("%d files: %d %v", compose.MaxFiles, len(files), err)
	}
	if _, err := compose.Inputs(wt, many(compose.MaxFiles+1, "compose.yml")); err == nil ||
		!strings.Contains(err.Error(), "devcontainer: .devcontainer.json: dockerComposeFile: 17 files, at most 16") {
		t.Fatalf("%d files: %v", compose.MaxFiles+1, err)
	}
	write("half.yaml", "#"+strings.Repeat("x", compose.MaxTotalBytes/4-1))
	if files, err := compose.Inputs(wt, many(4, "half.yaml")); err != nil || len(files) != 4 {
		t.Fatalf("files of %d bytes together: %v", compose.MaxTotalBytes, err)
	}
	write("more.yaml", "#")
	dc = many(4, "half.yaml")
	dc.Files = append(dc.Files, "more.yaml")
	if _, err := compose.Inputs(wt, dc); err == nil || !strings.Contains(err.Error(), "compose: the Compose files are over 16777216 bytes together") {
		t.Fatalf("files of one byte more together: %v", err)
	}

	// A symlink that stays inside is followed; a file at the limit is read.
	os.Symlink("compose.yml", filepath.Join(wt, "link.yaml"))
	write("limit.yaml", "#"+strings.Repeat("x", compose.MaxFileBytes-1))
	files, err = compose.Inputs(wt, compose.DevcontainerFiles{Set: true, Files: []string{"link.yaml", "limit.yaml"}})
	if err != nil || string(files[0].Data) != base || len(files[1].Data) != compose.MaxFileBytes {
		t.Fatalf("inside symlink and a file at the limit: %v", err)
	}
}

// FuzzCheck: whatever a repository's Compose file holds, Check and the
// key allow-list answer (a project or an error) without panicking, a
// project Check returns splits its services into runnable and
// connectors, and one the allow-list passes holds no key outside it.
func FuzzCheck(f *testing.F) {
	f.Add([]byte(base))
	f.Add([]byte("services:\n  a: {image: x, environment: [A=$$B]}\n"))
	f.Add([]byte("include: [x]\n"))
	f.Add([]byte("services: &a\n  b: *a\n"))
	f.Add([]byte("x-e: &e\n  cap_add: [SYS_MODULE]\nservices:\n  a:\n    image: x\n    <<: *e\n"))
	f.Add([]byte("services:\n  a: {image: x}\n---\nservices:\n  a: {command: [\"${X}\"]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := compose.Check(context.Background(), t.TempDir(), []compose.File{{Path: "compose.yaml", Data: data}})
		if err != nil {
			return
		}
		if len(p.Runnable)+len(p.Connectors) != len(p.Services) {
			t.Fatalf("services %q split into %q and %q", p.Services, p.Runnable, p.Connectors)
		}
		if p.CheckRunnable() != nil {
			return
		}
		for _, name := range p.Runnable {
			svc := p.Model.Services[name]
			if svc.Privileged || len(svc.CapAdd) > 0 || len(svc.DeviceCgroupRules) > 0 || svc.Pid != "" || svc.NetworkMode != "" || len(svc.Sysctls) > 0 {
				t.Fatalf("service %q passed the allow-list with %+v", name, svc)
			}
		}
	})
}
