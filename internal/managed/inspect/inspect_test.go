package inspect_test

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"agentbox/internal/managed/inspect"
	"agentbox/internal/managed/policy"
)

const (
	managedRoot = "/run/branchbox"
	wsSource    = "/home/dev/src/project-wt"
	wsTarget    = "/workspaces/project"
	envSource   = "/run/branchbox/managed/run-1/materialized/project-env"
	envTarget   = "/run/branchbox/leases/project-env"
	evSource    = "/run/branchbox/managed/run-1/materialized/evidence"
	evTarget    = "/run/branchbox/leases/evidence"
	spoolName   = "branchbox-tool-requests-0d3f6a1c9b2e4f5a8c7d6e5f4a3b2c1d"
	spoolTarget = "/run/branchbox/leases/tool-requests/delivery"
	// A seccomp profile as Compose sends it (the file's content); its
	// text is never examined, only its presence.
	seccompOpt = `seccomp={"defaultAction":"SCMP_ACT_ERRNO","defaultErrnoRet":1,"syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"}]}`
)

func expect() inspect.Expect {
	return inspect.Expect{
		Binds: []inspect.Bind{
			{Source: envSource, Target: envTarget},
			{Source: evSource, Target: evTarget},
		},
		Volumes:      []inspect.Volume{{Name: spoolName, Target: spoolTarget}},
		Workspace:    inspect.Bind{Source: wsSource, Target: wsTarget},
		ManagedRoot:  managedRoot,
		ForbiddenEnv: []string{"GITHUB_TOKEN", "NPM_TOKEN"},
		User:         consumer,
		Capabilities: policy.PrimaryCapabilities,
	}
}

// consumer is the workspace consumer the primary runs as.
const consumer = "1000:1000"

// serviceExpect is what a service other than the primary may hold.
func serviceExpect() inspect.Expect {
	return inspect.Expect{ManagedRoot: managedRoot, Capabilities: policy.ServiceCapabilities}
}

// service resembles another service's container: good's confinement,
// no mount but an image's anonymous volume, run as root.
func service() container.InspectResponse {
	c := good()
	c.HostConfig.Binds = nil
	c.HostConfig.CapAdd = []string{"CHOWN", "SETUID", "SETGID"}
	c.Mounts = []container.MountPoint{{Type: mount.TypeVolume, Name: "0f1e2d3c4b5a", Destination: "/var/lib/data", RW: true}}
	c.Config.User = ""
	return c
}

// good resembles the primary container Docker Compose creates from the
// facade: seccomp profile, private cgroup namespace, the workspace bind
// writable, two leases read-only and one spool volume.
func good() container.InspectResponse {
	return container.InspectResponse{
		ContainerJSONBase: &container.ContainerJSONBase{
			ID:              "31354089f4ba6e3ba04fb0cdd8e05284a52bb75fadc8a63ebba5fe55b4027d66",
			Name:            "/branchbox-5e1f0c2d3b4a59687f0e1d2c-primary-1",
			Path:            "/bin/sh",
			Driver:          "overlay2",
			Platform:        "linux",
			AppArmorProfile: "docker-default",
			HostConfig: &container.HostConfig{
				Binds: []string{
					envSource + ":" + envTarget + ":ro",
					evSource + ":" + evTarget + ":ro",
					spoolName + ":" + spoolTarget + ":rw",
					wsSource + ":" + wsTarget + ":rw",
				},
				NetworkMode:  "branchbox-5e1f0c2d3b4a59687f0e1d2c_default",
				CgroupnsMode: "private",
				IpcMode:      "private",
				SecurityOpt:  []string{seccompOpt, "no-new-privileges:true"},
				CapDrop:      []string{"ALL"},
				Resources:    container.Resources{Ulimits: []*container.Ulimit{{Name: "core", Soft: 0, Hard: 0}}},
				ShmSize:      67108864,
				Runtime:      "runc",
				MaskedPaths: []string{
					"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
					"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
					"/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
				},
				ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
			},
		},
		Mounts: []container.MountPoint{
			{Type: mount.TypeBind, Source: evSource, Destination: evTarget, Mode: "ro", RW: false, Propagation: mount.PropagationRPrivate},
			{Type: mount.TypeVolume, Name: spoolName, Source: "/var/lib/docker/volumes/" + spoolName + "/_data", Destination: spoolTarget, Driver: "local", Mode: "rw", RW: true},
			{Type: mount.TypeBind, Source: wsSource, Destination: wsTarget, Mode: "rw", RW: true, Propagation: mount.PropagationRPrivate},
			{Type: mount.TypeBind, Source: envSource, Destination: envTarget, Mode: "ro", RW: false, Propagation: mount.PropagationRPrivate},
		},
		Config: &container.Config{
			User:     consumer,
			Hostname: "31354089f4ba",
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"TERM=xterm-256color",
				"PROJECT_GREETING=hello-from-the-project",
			},
			Cmd:   []string{"sleep", "infinity"},
			Image: "sha256:5c34d8ddaf99c361ae28db2a171ae25d4af8e55b8fb75975b17d20107f0b07f4",
			Labels: map[string]string{
				"com.docker.compose.project": "branchbox-5e1f0c2d3b4a59687f0e1d2c",
				"com.docker.compose.service": "primary",
			},
		},
	}
}

// mountAt returns the fixture's mount at dest.
func mountAt(t *testing.T, c *container.InspectResponse, dest string) *container.MountPoint {
	t.Helper()
	for i := range c.Mounts {
		if c.Mounts[i].Destination == dest {
			return &c.Mounts[i]
		}
	}
	t.Fatalf("fixture has no mount at %s", dest)
	return nil
}

// secrets are the strings no Detail may contain: every host source path
// and every environment value of the (mutated) inspection.
func secrets(c container.InspectResponse, e inspect.Expect) []string {
	var s []string
	for _, m := range c.Mounts {
		s = append(s, m.Source)
	}
	if c.ContainerJSONBase != nil && c.HostConfig != nil {
		for _, b := range c.HostConfig.Binds {
			src, _, _ := strings.Cut(b, ":")
			s = append(s, src)
		}
		for _, d := range c.HostConfig.Devices {
			s = append(s, d.PathOnHost)
		}
	}
	if c.Config != nil {
		for _, kv := range c.Config.Env {
			if _, v, ok := strings.Cut(kv, "="); ok {
				s = append(s, v)
			}
		}
	}
	s = append(s, e.Workspace.Source)
	for _, b := range e.Binds {
		s = append(s, b.Source)
	}
	var out []string
	for _, x := range s {
		if x != "" && x != "/" { // "/" is in every path
			out = append(out, x)
		}
	}
	return out
}

type row struct {
	name   string
	mutate func(t *testing.T, c *container.InspectResponse, e *inspect.Expect)
	rule   string // "" for accepted
}

func hc(f func(h *container.HostConfig)) func(*testing.T, *container.InspectResponse, *inspect.Expect) {
	return func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { f(c.HostConfig) }
}

func addMount(m container.MountPoint) func(*testing.T, *container.InspectResponse, *inspect.Expect) {
	return func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.Mounts = append(c.Mounts, m) }
}

func addEnv(kv string) func(*testing.T, *container.InspectResponse, *inspect.Expect) {
	return func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
		c.Config.Env = append(c.Config.Env, kv)
	}
}

// exactEnv expects the fixture's environment (with two variables of its
// image's) exactly, then adds extra to the container's and applies edit
// to it.
func exactEnv(extra []string, edit func([]string)) func(*testing.T, *container.InspectResponse, *inspect.Expect) {
	return func(_ *testing.T, c *container.InspectResponse, e *inspect.Expect) {
		c.Config.Env = append(c.Config.Env, "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8")
		e.ExactEnv, e.Env = true, slices.Clone(c.Config.Env)
		c.Config.Env = append(c.Config.Env, extra...)
		if edit != nil {
			edit(c.Config.Env[len(c.Config.Env)-2-len(extra):])
		}
	}
}

func rows() []row {
	rs := []row{
		{"good", func(*testing.T, *container.InspectResponse, *inspect.Expect) {}, ""},

		// incomplete
		{"no base", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.ContainerJSONBase = nil }, inspect.RuleIncomplete},
		{"no host config", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.HostConfig = nil }, inspect.RuleIncomplete},

		// expect
		{"expect no managed root", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) { e.ManagedRoot = "" }, inspect.RuleExpect},
		{"expect managed root /", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) { e.ManagedRoot = "/" }, inspect.RuleExpect},
		{"expect managed root unclean", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) { e.ManagedRoot = "/run/branchbox/" }, inspect.RuleExpect},
		{"expect relative target", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) { e.Binds[0].Target = "run/x" }, inspect.RuleExpect},
		{"expect duplicate target", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) { e.Volumes[0].Target = evTarget }, inspect.RuleExpect},
		{"expect target covers managed root", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) { e.Binds[0].Target = "/run" }, inspect.RuleExpect},
		{"expect binds without a workspace", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) { e.Workspace = inspect.Bind{} }, inspect.RuleExpect},
		{"expect a user without a workspace", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) {
			*e = inspect.Expect{ManagedRoot: managedRoot, User: consumer}
		}, inspect.RuleExpect},

		// user
		{"user root", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.Config.User = "0" }, inspect.RuleUser},
		{"user root by name", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.Config.User = "root" }, inspect.RuleUser},
		{"user image default", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.Config.User = "" }, inspect.RuleUser},
		{"user by name", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.Config.User = "dev" }, inspect.RuleUser},
		{"user uid only", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.Config.User = "1000" }, inspect.RuleUser},
		{"user other gid", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.Config.User = "1000:0" }, inspect.RuleUser},

		// runtime
		{"runtime other", hc(func(h *container.HostConfig) { h.Runtime = "runsc" }), inspect.RuleRuntime},
		{"runtime empty ok", hc(func(h *container.HostConfig) { h.Runtime = "" }), ""},
		{"cgroup parent", hc(func(h *container.HostConfig) { h.CgroupParent = "/system.slice" }), inspect.RuleRuntime},
		{"sysctls", hc(func(h *container.HostConfig) {
			h.Sysctls = map[string]string{"net.ipv4.ip_unprivileged_port_start": "0"}
		}), inspect.RuleRuntime},
		{"expect relative bind source", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) {
			e.Binds[1].Source = "materialized/ev"
		}, inspect.RuleExpect},
		{"expect volume without name", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) { e.Volumes[0].Name = "" }, inspect.RuleExpect},

		// privileged
		{"privileged", hc(func(h *container.HostConfig) { h.Privileged = true }), inspect.RulePrivileged},

		// host namespaces
		{"pid host", hc(func(h *container.HostConfig) { h.PidMode = "host" }), inspect.RuleHostNamespace},
		{"pid container", hc(func(h *container.HostConfig) { h.PidMode = "container:sidecar" }), inspect.RuleHostNamespace},
		{"ipc host", hc(func(h *container.HostConfig) { h.IpcMode = "host" }), inspect.RuleHostNamespace},
		{"ipc container", hc(func(h *container.HostConfig) { h.IpcMode = "container:sidecar" }), inspect.RuleHostNamespace},
		{"network host", hc(func(h *container.HostConfig) { h.NetworkMode = "host" }), inspect.RuleHostNamespace},
		{"network container", hc(func(h *container.HostConfig) { h.NetworkMode = "container:sidecar" }), inspect.RuleHostNamespace},
		{"uts host", hc(func(h *container.HostConfig) { h.UTSMode = "host" }), inspect.RuleHostNamespace},
		{"uts container", hc(func(h *container.HostConfig) { h.UTSMode = "container:sidecar" }), inspect.RuleHostNamespace},
		{"userns host", hc(func(h *container.HostConfig) { h.UsernsMode = "host" }), inspect.RuleHostNamespace},
		{"cgroupns host", hc(func(h *container.HostConfig) { h.CgroupnsMode = "host" }), inspect.RuleHostNamespace},
		{"cgroupns empty", hc(func(h *container.HostConfig) { h.CgroupnsMode = "" }), inspect.RuleHostNamespace},
		{"ipc shareable ok", hc(func(h *container.HostConfig) { h.IpcMode = "shareable" }), ""},
		{"network none ok", hc(func(h *container.HostConfig) { h.NetworkMode = "none" }), ""},

		// capabilities
		{"primary adds chown", hc(func(h *container.HostConfig) { h.CapAdd = []string{"CHOWN"} }), inspect.RuleCapability},
		{"cap padded", hc(func(h *container.HostConfig) { h.CapAdd = []string{" cap_sys_admin "} }), inspect.RuleCapability},
		{"drops nothing", hc(func(h *container.HostConfig) { h.CapDrop = nil }), inspect.RuleCapability},
		{"drops some", hc(func(h *container.HostConfig) { h.CapDrop = []string{"NET_RAW", "MKNOD"} }), inspect.RuleCapability},
		{"core dumps: no limit", hc(func(h *container.HostConfig) { h.Ulimits = nil }), inspect.RuleCoreDumps},
		{"core dumps: soft limit", hc(func(h *container.HostConfig) { h.Ulimits = []*container.Ulimit{{Name: "core", Soft: 1, Hard: 0}} }), inspect.RuleCoreDumps},
		{"core dumps: hard limit", hc(func(h *container.HostConfig) { h.Ulimits = []*container.Ulimit{{Name: "core", Soft: 0, Hard: -1}} }), inspect.RuleCoreDumps},
		{"core dumps: set twice", hc(func(h *container.HostConfig) {
			h.Ulimits = []*container.Ulimit{{Name: "core"}, {Name: "nofile", Soft: 1024, Hard: 1024}, {Name: "core", Soft: -1, Hard: -1}}
		}), inspect.RuleCoreDumps},
		{"core dumps: another limit only", hc(func(h *container.HostConfig) { h.Ulimits = []*container.Ulimit{{Name: "nofile", Soft: 0, Hard: 0}} }), inspect.RuleCoreDumps},
		{"drops cap_all ok", hc(func(h *container.HostConfig) { h.CapDrop = []string{"cap_all"} }), ""},

		// devices
		{"device", hc(func(h *container.HostConfig) {
			h.Devices = []container.DeviceMapping{{PathOnHost: "/dev/kvm", PathInContainer: "/dev/kvm", CgroupPermissions: "rwm"}}
		}), inspect.RuleDevice},
		{"device request", hc(func(h *container.HostConfig) {
			h.DeviceRequests = []container.DeviceRequest{{Driver: "nvidia", Count: -1, Capabilities: [][]string{{"gpu"}}}}
		}), inspect.RuleDevice},
		{"device cgroup rule", hc(func(h *container.HostConfig) { h.DeviceCgroupRules = []string{"c 10:200 rwm"} }), inspect.RuleDevice},

		// security options
		{"apparmor profile unconfined", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.AppArmorProfile = "unconfined" }, inspect.RuleSecurityOpt},
		{"apparmor profile empty ok", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.AppArmorProfile = "" }, ""},
		{"apparmor=unconfined", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "apparmor=unconfined") }), inspect.RuleSecurityOpt},
		{"apparmor=custom ok", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "apparmor=branchbox-default") }), ""},
		{"label=disable", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "label=disable") }), inspect.RuleSecurityOpt},
		{"label:disable", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "label:disable") }), inspect.RuleSecurityOpt},
		{"bare disable", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "disable") }), inspect.RuleSecurityOpt},
		{"label spc_t", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "label=type:spc_t") }), inspect.RuleSecurityOpt},
		{"label unconfined_t", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "label=type:unconfined_t") }), inspect.RuleSecurityOpt},
		{"label level ok", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "label=level:s0:c100,c200") }), ""},
		{"writable-cgroups", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "writable-cgroups") }), inspect.RuleSecurityOpt},
		{"writable-cgroups=true", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "writable-cgroups=true") }), inspect.RuleSecurityOpt},
		{"writable-cgroups=false ok", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "writable-cgroups=false") }), ""},
		{"unknown option", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "systempaths=unconfined") }), inspect.RuleSecurityOpt},
		{"unparsable option", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "whatever") }), inspect.RuleSecurityOpt},
		{"no-new-privileges ok", hc(func(h *container.HostConfig) { h.SecurityOpt = []string{seccompOpt, "no-new-privileges"} }), ""},
		{"no-new-privileges=true ok", hc(func(h *container.HostConfig) { h.SecurityOpt = []string{seccompOpt, "no-new-privileges=true"} }), ""},
		{"no-new-privileges=maybe", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "no-new-privileges=maybe") }), inspect.RuleSecurityOpt},
		{"no-new-privileges missing", hc(func(h *container.HostConfig) { h.SecurityOpt = []string{seccompOpt} }), inspect.RuleSecurityOpt},
		{"no-new-privileges:false", hc(func(h *container.HostConfig) { h.SecurityOpt = []string{seccompOpt, "no-new-privileges:false"} }), inspect.RuleSecurityOpt},
		{"no-new-privileges then false", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "no-new-privileges=false") }), inspect.RuleSecurityOpt},

		// seccomp
		{"seccomp missing", hc(func(h *container.HostConfig) { h.SecurityOpt = nil }), inspect.RuleSeccomp},
		{"seccomp missing, nnp only", hc(func(h *container.HostConfig) { h.SecurityOpt = []string{"no-new-privileges"} }), inspect.RuleSeccomp},
		{"seccomp=unconfined", hc(func(h *container.HostConfig) { h.SecurityOpt = []string{"seccomp=unconfined"} }), inspect.RuleSeccomp},
		{"seccomp:unconfined", hc(func(h *container.HostConfig) { h.SecurityOpt = []string{"seccomp:unconfined"} }), inspect.RuleSeccomp},
		{"seccomp empty", hc(func(h *container.HostConfig) { h.SecurityOpt = []string{"seccomp="} }), inspect.RuleSeccomp},
		{"seccomp twice", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, seccompOpt) }), inspect.RuleSeccomp},
		{"seccomp unconfined after profile", hc(func(h *container.HostConfig) { h.SecurityOpt = append(h.SecurityOpt, "seccomp=unconfined") }), inspect.RuleSeccomp},

		// masked and read-only system paths
		{"systempaths unconfined masked", hc(func(h *container.HostConfig) { h.MaskedPaths = []string{} }), inspect.RuleSystemPaths},
		{"systempaths unconfined readonly", hc(func(h *container.HostConfig) { h.ReadonlyPaths = []string{} }), inspect.RuleSystemPaths},
		{"sysrq-trigger writable", hc(func(h *container.HostConfig) {
			h.ReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"}
		}), inspect.RuleSystemPaths},
		{"20.10 defaults ok", hc(func(h *container.HostConfig) { h.MaskedPaths = inspect.RequiredMaskedPaths }), ""},

		// workspace
		{"workspace missing", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, wsTarget).Destination = "/workspaces/other"
		}, inspect.RuleWorkspace},
		{"workspace read-only", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, wsTarget).RW = false
		}, inspect.RuleWorkspace},
		{"workspace wrong source", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, wsTarget).Source = "/home/dev/src/other-wt"
		}, inspect.RuleWorkspace},
		{"workspace a volume", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			m := mountAt(t, c, wsTarget)
			m.Type, m.Name, m.Source = mount.TypeVolume, "project-wt", "/var/lib/docker/volumes/project-wt/_data"
		}, inspect.RuleWorkspace},
		{"workspace twice", addMount(container.MountPoint{Type: mount.TypeBind, Source: "/home/dev/elsewhere", Destination: wsTarget, RW: true}), inspect.RuleWorkspace},
		{"workspace shadowed by tmpfs", hc(func(h *container.HostConfig) { h.Tmpfs = map[string]string{wsTarget: ""} }), inspect.RuleWorkspace},
		{"writable bind expected, missing", func(_ *testing.T, _ *container.InspectResponse, e *inspect.Expect) {
			e.Writable = []inspect.Bind{{Source: "/home/dev/src/project/.git", Target: "/workspaces/main/.git"}}
		}, inspect.RuleWorkspace},
		{"writable bind read-only", func(_ *testing.T, c *container.InspectResponse, e *inspect.Expect) {
			e.Writable = []inspect.Bind{{Source: "/home/dev/src/project/.git", Target: "/workspaces/main/.git"}}
			c.Mounts = append(c.Mounts, container.MountPoint{Type: mount.TypeBind, Source: "/home/dev/src/project/.git", Destination: "/workspaces/main/.git"})
		}, inspect.RuleWorkspace},
		{"writable bind ok", func(_ *testing.T, c *container.InspectResponse, e *inspect.Expect) {
			e.Writable = []inspect.Bind{{Source: "/home/dev/src/project/.git", Target: "/workspaces/main/.git"}}
			c.Mounts = append(c.Mounts, container.MountPoint{Type: mount.TypeBind, Source: "/home/dev/src/project/.git", Destination: "/workspaces/main/.git", RW: true})
		}, ""},
		{"unsigned bind outside the managed root", addMount(container.MountPoint{Type: mount.TypeBind, Source: "/home", Destination: "/host"}), inspect.RuleMount},
		{"workspace unclean destination ok", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, wsTarget).Destination = wsTarget + "/"
		}, ""},

		// lease binds
		{"bind missing", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, evTarget).Destination = "/run/elsewhere"
		}, inspect.RuleBind},
		{"bind duplicated", addMount(container.MountPoint{Type: mount.TypeBind, Source: evSource, Destination: evTarget, RW: false}), inspect.RuleBind},
		{"bind writable", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, envTarget).RW = true
		}, inspect.RuleBind},
		{"bind wrong source", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, envTarget).Source = "/home/dev/forged-project-env"
		}, inspect.RuleBind},
		{"bind given as a volume", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			m := mountAt(t, c, evTarget)
			m.Type, m.Name, m.Source = mount.TypeVolume, "evidence", "/var/lib/docker/volumes/evidence/_data"
		}, inspect.RuleBind},
		{"bind shadowed by tmpfs", hc(func(h *container.HostConfig) { h.Tmpfs = map[string]string{envTarget: "size=1m"} }), inspect.RuleBind},

		// spool volumes
		{"volume missing", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, spoolTarget).Destination = "/var/spool/x"
		}, inspect.RuleVolume},
		{"volume wrong name", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, spoolTarget).Name = spoolName + "x"
		}, inspect.RuleVolume},
		{"volume read-only", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			mountAt(t, c, spoolTarget).RW = false
		}, inspect.RuleVolume},
		{"volume a bind", func(t *testing.T, c *container.InspectResponse, _ *inspect.Expect) {
			m := mountAt(t, c, spoolTarget)
			m.Type, m.Name, m.Source = mount.TypeBind, "", "/home/dev/spool"
		}, inspect.RuleVolume},
		{"volume duplicated", addMount(container.MountPoint{Type: mount.TypeVolume, Name: spoolName, Source: "/var/lib/docker/volumes/" + spoolName + "/_data", Destination: spoolTarget, RW: true}), inspect.RuleVolume},

		// managed namespace
		{"extra bind under leases", addMount(container.MountPoint{Type: mount.TypeBind, Source: "/home/dev/forged", Destination: "/run/branchbox/leases/x", RW: false}), inspect.RuleManagedMount},
		{"extra tmpfs under leases", hc(func(h *container.HostConfig) { h.Tmpfs = map[string]string{"/run/branchbox/leases/x": ""} }), inspect.RuleManagedMount},
		{"extra mount inside a lease", addMount(container.MountPoint{Type: mount.TypeTmpfs, Destination: evTarget + "/sub", RW: true}), inspect.RuleManagedMount},
		{"image volume under managed root", addMount(container.MountPoint{Type: mount.TypeVolume, Name: "0f3c9e", Source: "/var/lib/docker/volumes/0f3c9e/_data", Destination: "/run/branchbox/state", RW: true}), inspect.RuleManagedMount},
		{"mount at managed root", addMount(container.MountPoint{Type: mount.TypeBind, Source: "/home/dev/fake-root", Destination: managedRoot, RW: true}), inspect.RuleManagedMount},
		{"mount at /run", addMount(container.MountPoint{Type: mount.TypeTmpfs, Destination: "/run", RW: true}), inspect.RuleManagedMount},
		{"tmpfs at /run", hc(func(h *container.HostConfig) { h.Tmpfs = map[string]string{"/run": "rw,noexec"} }), inspect.RuleManagedMount},
		{"mount at /run/branchbox2 ok", addMount(container.MountPoint{Type: mount.TypeTmpfs, Destination: "/run/branchbox2", RW: true}), ""},
		{"mount relative", addMount(container.MountPoint{Type: mount.TypeTmpfs, Destination: "run/branchbox", RW: true}), inspect.RuleMount},

		// other mounts
		{"gitconfig bind unsigned", addMount(container.MountPoint{Type: mount.TypeBind, Source: "/home/dev/.gitconfig", Destination: "/home/vscode/.gitconfig", RW: false}), inspect.RuleMount},
		{"node_modules volume ok", addMount(container.MountPoint{Type: mount.TypeVolume, Name: "node_modules", Source: "/var/lib/docker/volumes/node_modules/_data", Destination: wsTarget + "/node_modules", RW: true}), ""},
		{"tmpfs /tmp ok", hc(func(h *container.HostConfig) { h.Tmpfs = map[string]string{"/tmp": "size=64m"} }), ""},

		// environment
		{"no config", func(_ *testing.T, c *container.InspectResponse, _ *inspect.Expect) { c.Config = nil }, inspect.RuleUser},
		{"no config, no user to check", func(_ *testing.T, c *container.InspectResponse, e *inspect.Expect) {
			c.Config, e.User = nil, ""
		}, inspect.RuleEnvironment},
		{"forbidden secret name", addEnv("GITHUB_TOKEN=ghp_0123456789abcdefTOPSECRET"), inspect.RuleEnvironment},
		{"forbidden secret name, empty value", addEnv("NPM_TOKEN="), inspect.RuleEnvironment},
		{"forbidden secret name, no =", addEnv("NPM_TOKEN"), inspect.RuleEnvironment},
		{"secret name other case ok", addEnv("github_token=not-the-secret"), ""},
		{"secret name as prefix ok", addEnv("GITHUB_TOKEN_PATH=/run/branchbox/leases/token"), ""},

		// The primary's environment is its image's exactly: the Dev
		// Containers CLI runs a root shell with it.
		{"exact env: the image's", exactEnv(nil, nil), ""},
		{"exact env: a loader variable added", exactEnv([]string{"LD_PRELOAD=/workspaces/x/own.so"}, nil), inspect.RuleEnvironment},
		{"exact env: PATH into the workspace", exactEnv(nil, func(env []string) { env[0] = "PATH=/workspaces/x/bin:/usr/bin:/bin" }), inspect.RuleEnvironment},
		{"exact env: a line break in a value", exactEnv(nil, func(env []string) { env[1] = "LANG=C\netcEnvironmentEOF\nid" }), inspect.RuleEnvironment},
		{"exact env: an image variable missing", func(_ *testing.T, c *container.InspectResponse, e *inspect.Expect) {
			e.ExactEnv, e.Env = true, slices.Clone(c.Config.Env)
			c.Config.Env = c.Config.Env[:1]
		}, inspect.RuleEnvironment},
		{"exact env: none at all", func(_ *testing.T, c *container.InspectResponse, e *inspect.Expect) {
			e.ExactEnv, e.Env = true, slices.Clone(c.Config.Env)
			c.Config.Env = nil
		}, inspect.RuleEnvironment},
		{"exact env: reordered", func(_ *testing.T, c *container.InspectResponse, e *inspect.Expect) {
			e.ExactEnv, e.Env = true, slices.Clone(c.Config.Env)
			slices.Reverse(c.Config.Env)
		}, inspect.RuleEnvironment},
	}

	for _, name := range []string{"ALL", "SYS_ADMIN", "SYS_MODULE", "SYS_RAWIO", "DAC_READ_SEARCH", "SYS_PTRACE", "MKNOD", "NET_RAW", "NET_ADMIN", "SYSLOG", "BPF", "FSETID"} {
		for _, spelled := range []string{"CAP_" + name, strings.ToLower(name)} {
			rs = append(rs, row{"cap " + spelled, hc(func(h *container.HostConfig) {
				h.CapAdd = []string{spelled}
			}), inspect.RuleCapability})
		}
	}
	for _, name := range policy.EngineEnv {
		rs = append(rs, row{"engine env " + name, addEnv(name + "=tcp://10.9.8.7:2375"), inspect.RuleEnvironment})
	}
	for _, src := range []string{
		"/var/run/docker.sock",
		"/run/docker.sock",
		"/home/dev/.docker/run/docker.sock",
		"/run/containerd/containerd.sock",
		"/run/podman/podman.sock",
		"/run/buildkit/buildkitd.sock",
		"/run/user/1000/docker.sock",
		"/run/user/1000/podman/podman.sock",
		"/run/user/1000",
		"/run/user",
		"/run/docker",
		"/var/run",
		"/run",
		"/var",
		"/",
		"/var/lib/docker",
		"/var/lib/docker/volumes",
		"/var/run/docker.sock/", // unclean
	} {
		rs = append(rs, row{"engine socket " + src, addMount(container.MountPoint{
			Type: mount.TypeBind, Source: src, Destination: "/home/vscode/engine", RW: false,
		}), inspect.RuleEngineSocket})
	}
	for _, src := range []string{"/run/user/1000/wayland-0", "/home/dev/docker", "/var/lib/dockerfiles", "/run/dockerd-notes"} {
		// Not the socket rule: the general one, that any unsigned bind
		// is refused.
		rs = append(rs, row{"not an engine socket " + src, addMount(container.MountPoint{
			Type: mount.TypeBind, Source: src, Destination: "/home/vscode/x", RW: false,
		}), inspect.RuleMount})
	}
	return rs
}

func TestCheck(t *testing.T) {
	for _, r := range rows() {
		t.Run(r.name, func(t *testing.T) {
			c, e := good(), expect()
			r.mutate(t, &c, &e)
			err := inspect.Check(c, e)
			t.Log(err)
			if r.rule == "" {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			var ref *inspect.Refusal
			if !errors.As(err, &ref) {
				t.Fatalf("Check = %v (%T), want a *Refusal with rule %q", err, err, r.rule)
			}
			if ref.Rule != r.rule {
				t.Fatalf("rule = %q (%v), want %q", ref.Rule, err, r.rule)
			}
			if ref.Detail == "" {
				t.Fatalf("refusal %q has no detail", ref.Rule)
			}
			for _, s := range secrets(c, e) {
				if strings.Contains(ref.Detail, s) {
					t.Fatalf("detail %q shows %q", ref.Detail, s)
				}
			}
			if strings.Contains(ref.Detail, "seccomp={") || strings.Contains(ref.Detail, "SCMP_") {
				t.Fatalf("detail %q shows the seccomp profile", ref.Detail)
			}
			if want := "final inspection: " + r.rule + ": " + ref.Detail; err.Error() != want {
				t.Fatalf("Error() = %q, want %q", err.Error(), want)
			}
		})
	}
}

// TestCheckService: another service than the primary keeps
// policy.ServiceCapabilities and may run as root, but holds no host path
// and nothing else.
func TestCheckService(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(c *container.InspectResponse)
		rule   string
	}{
		{"good", func(*container.InspectResponse) {}, ""},
		{"every allowed capability", func(c *container.InspectResponse) { c.HostConfig.CapAdd = policy.ServiceCapabilities }, ""},
		{"dac_read_search", func(c *container.InspectResponse) {
			c.HostConfig.CapAdd = append(c.HostConfig.CapAdd, "DAC_READ_SEARCH")
		}, inspect.RuleCapability},
		{"sys_module", func(c *container.InspectResponse) { c.HostConfig.CapAdd = []string{"SYS_MODULE"} }, inspect.RuleCapability},
		{"device rules", func(c *container.InspectResponse) {
			c.HostConfig.DeviceCgroupRules = []string{"b *:* rwm", "c *:* rwm"}
		}, inspect.RuleDevice},
		{"a bind of the workspace", func(c *container.InspectResponse) {
			c.Mounts = append(c.Mounts, container.MountPoint{Type: mount.TypeBind, Source: wsSource, Destination: "/src", RW: true})
		}, inspect.RuleMount},
		{"pid of another service", func(c *container.InspectResponse) { c.HostConfig.PidMode = "container:0123" }, inspect.RuleHostNamespace},
		{"network of another service", func(c *container.InspectResponse) { c.HostConfig.NetworkMode = "container:0123" }, inspect.RuleHostNamespace},
		{"no no-new-privileges", func(c *container.InspectResponse) { c.HostConfig.SecurityOpt = []string{seccompOpt} }, inspect.RuleSecurityOpt},
		{"a spool volume", func(c *container.InspectResponse) {
			c.Mounts = append(c.Mounts, container.MountPoint{Type: mount.TypeVolume, Name: spoolName, Destination: spoolTarget, RW: true})
		}, inspect.RuleManagedMount},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := service()
			tc.mutate(&c)
			err := inspect.Check(c, serviceExpect())
			var ref *inspect.Refusal
			switch {
			case tc.rule == "" && err != nil:
				t.Fatalf("Check = %v, want nil", err)
			case tc.rule != "" && (!errors.As(err, &ref) || ref.Rule != tc.rule):
				t.Fatalf("Check = %v, want rule %q", err, tc.rule)
			}
		})
	}
}

// The mount list is cloned before it is sorted: the caller's response is
// left as it was.
func TestCheckLeavesInputAlone(t *testing.T) {
	c := good()
	var before []string
	for _, m := range c.Mounts {
		before = append(before, m.Destination)
	}
	if err := inspect.Check(c, expect()); err != nil {
		t.Fatal(err)
	}
	for i, m := range c.Mounts {
		if m.Destination != before[i] {
			t.Fatalf("mount %d moved: %s, was %s", i, m.Destination, before[i])
		}
	}
}

func TestRefusalError(t *testing.T) {
	r := &inspect.Refusal{Rule: "privileged", Detail: "the container is privileged"}
	if got, want := r.Error(), "final inspection: privileged: the container is privileged"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// testdata/compose-primary.json is `docker inspect` of a container Docker
// Compose v2.40.3 created on Docker Engine 20.10.24 (cgroup v1, no
// AppArmor) from a file like the facade's, trimmed (paths of the engine's
// own files, graph driver, network settings) and with host paths and
// names renamed. Its HostConfig.SecurityOpt holds the real default seccomp
// profile as Compose sent it. CapDrop, the no-new-privileges option and
// Config.User were added when the facade began to set them, as that
// engine records them (seen on a container Compose created from
// `cap_drop: [ALL]`, `security_opt: [no-new-privileges:true]` and
// `user: "1000:1000"`), and Ulimits as that engine records
// `ulimits: {core: {soft: 0, hard: 0}}`.
func realExpect() inspect.Expect {
	return inspect.Expect{
		Binds: []inspect.Bind{
			{Source: "/run/branchbox/managed/run-1/materialized/project-env", Target: "/run/branchbox/leases/project-env"},
			{Source: "/run/branchbox/managed/run-1/materialized/evidence", Target: "/run/branchbox/leases/evidence"},
		},
		Volumes:      []inspect.Volume{{Name: "branchbox-tool-requests-0d3f6a1c9b2e4f5a8c7d6e5f4a3b2c1d", Target: "/run/branchbox/leases/tool-requests/delivery"}},
		Workspace:    inspect.Bind{Source: "/home/dev/src/project-wt", Target: "/workspaces/project"},
		ManagedRoot:  "/run/branchbox",
		ForbiddenEnv: []string{"GITHUB_TOKEN"},
		User:         consumer,
		Capabilities: policy.PrimaryCapabilities,
	}
}

func loadReal(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/compose-primary.json")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestRealInspection(t *testing.T) {
	var c container.InspectResponse
	if err := json.Unmarshal(loadReal(t), &c); err != nil {
		t.Fatal(err)
	}
	// The fields the checks read came through the JSON mapping.
	if c.ContainerJSONBase == nil || c.HostConfig == nil || c.Config == nil {
		t.Fatal("decoded inspection lacks its base, host or container configuration")
	}
	if c.HostConfig.CgroupnsMode != "private" || len(c.Mounts) != 4 || len(c.HostConfig.ReadonlyPaths) != 5 ||
		len(c.HostConfig.SecurityOpt) != 2 || !strings.HasPrefix(c.HostConfig.SecurityOpt[0], `seccomp={"defaultAction":"SCMP_ACT_ERRNO"`) {
		t.Fatalf("decoded inspection is not the captured one: %+v", c.HostConfig)
	}
	if err := inspect.Check(c, realExpect()); err != nil {
		t.Fatalf("Check(real) = %v", err)
	}
}

// TestRealInspectionRefused edits the captured document as JSON, so each
// refusal depends on the field names the engine really uses.
func TestRealInspectionRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(doc map[string]any)
		rule string
	}{
		{"CapAdd", func(d map[string]any) { host(d)["CapAdd"] = []any{"CAP_SYS_ADMIN"} }, inspect.RuleCapability},
		{"CapDrop", func(d map[string]any) { host(d)["CapDrop"] = nil }, inspect.RuleCapability},
		{"User", func(d map[string]any) { d["Config"].(map[string]any)["User"] = "0" }, inspect.RuleUser},
		{"no-new-privileges", func(d map[string]any) { host(d)["SecurityOpt"] = host(d)["SecurityOpt"].([]any)[:1] }, inspect.RuleSecurityOpt},
		{"DeviceCgroupRules", func(d map[string]any) { host(d)["DeviceCgroupRules"] = []any{"c 1:11 rwm"} }, inspect.RuleDevice},
		{"PidMode", func(d map[string]any) { host(d)["PidMode"] = "host" }, inspect.RuleHostNamespace},
		{"CgroupnsMode", func(d map[string]any) { host(d)["CgroupnsMode"] = "host" }, inspect.RuleHostNamespace},
		{"Privileged", func(d map[string]any) { host(d)["Privileged"] = true }, inspect.RulePrivileged},
		{"Devices", func(d map[string]any) {
			host(d)["Devices"] = []any{map[string]any{"PathOnHost": "/dev/null", "PathInContainer": "/dev/xnull", "CgroupPermissions": "rwm"}}
		}, inspect.RuleDevice},
		{"DeviceRequests", func(d map[string]any) {
			host(d)["DeviceRequests"] = []any{map[string]any{"Driver": "nvidia", "Count": -1}}
		}, inspect.RuleDevice},
		{"SecurityOpt", func(d map[string]any) {
			host(d)["SecurityOpt"] = []any{"seccomp=unconfined", "no-new-privileges", "label=disable"}
		}, inspect.RuleSeccomp},
		{"AppArmorProfile", func(d map[string]any) { d["AppArmorProfile"] = "unconfined" }, inspect.RuleSecurityOpt},
		{"MaskedPaths", func(d map[string]any) { host(d)["MaskedPaths"] = []any{} }, inspect.RuleSystemPaths},
		{"Tmpfs", func(d map[string]any) { host(d)["Tmpfs"] = map[string]any{"/run/branchbox/leases/x": "size=1m"} }, inspect.RuleManagedMount},
		{"Mounts RW", func(d map[string]any) {
			for _, m := range d["Mounts"].([]any) {
				if mm := m.(map[string]any); mm["Destination"] == "/run/branchbox/leases/evidence" {
					mm["RW"] = true
				}
			}
		}, inspect.RuleBind},
		{"Mounts Name", func(d map[string]any) {
			for _, m := range d["Mounts"].([]any) {
				if mm := m.(map[string]any); mm["Type"] == "volume" {
					mm["Name"] = "other"
				}
			}
		}, inspect.RuleVolume},
		{"Env", func(d map[string]any) {
			cfg := d["Config"].(map[string]any)
			cfg["Env"] = append(cfg["Env"].([]any), "DOCKER_HOST=tcp://10.9.8.7:2375")
		}, inspect.RuleEnvironment},
		{"no HostConfig", func(d map[string]any) { delete(d, "HostConfig") }, inspect.RuleIncomplete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var doc map[string]any
			if err := json.Unmarshal(loadReal(t), &doc); err != nil {
				t.Fatal(err)
			}
			tc.edit(doc)
			data, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			var c container.InspectResponse
			if err := json.Unmarshal(data, &c); err != nil {
				t.Fatal(err)
			}
			err = inspect.Check(c, realExpect())
			var ref *inspect.Refusal
			if !errors.As(err, &ref) || ref.Rule != tc.rule {
				t.Fatalf("Check = %v, want rule %q", err, tc.rule)
			}
			if strings.Contains(ref.Detail, "10.9.8.7") || strings.Contains(ref.Detail, "/run/branchbox/managed") {
				t.Fatalf("detail %q shows a value or a host path", ref.Detail)
			}
		})
	}
}

func host(doc map[string]any) map[string]any { return doc["HostConfig"].(map[string]any) }
