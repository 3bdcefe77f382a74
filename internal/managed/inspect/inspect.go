// Package inspect is branchbox's inspection of every container of a
// managed launch: after the engine has created them and before any of
// them starts, and again once they run, the engine's own record of each
// container (GET /containers/{id}/json) is checked against the security
// contract (package policy) and against what the signed assignment allows. Check is pure: it reads only the inspect response and
// the expectation, so it checks what the engine will run, not what a
// Compose file asked for.
//
// A refusal names the broken rule and never echoes an environment value, a
// host source path or a secret, so it can be shown and logged as is.
package inspect

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"agentbox/internal/managed/policy"
)

// Rule names of a Refusal. They are stable: callers and logs may match them.
const (
	// RuleIncomplete: the response lacks the host configuration, so
	// nothing can be verified.
	RuleIncomplete = "incomplete"
	// RuleExpect: the expectation itself is malformed (a caller bug).
	RuleExpect        = "expect"
	RulePrivileged    = "privileged"
	RuleHostNamespace = "host-namespace"
	RuleCapability    = "capability"
	RuleDevice        = "device"
	RuleSecurityOpt   = "security-opt"
	RuleSeccomp       = "seccomp"
	RuleSystemPaths   = "system-paths"
	RuleMount         = "mount"
	RuleWorkspace     = "workspace"
	RuleBind          = "bind"
	RuleVolume        = "volume"
	RuleManagedMount  = "managed-mount"
	RuleEngineSocket  = "engine-socket"
	RuleEnvironment   = "environment"
	RuleUser          = "user"
	RuleRuntime       = "runtime"
	RuleCoreDumps     = "core-dumps"
)

// Expect is what one container may hold: for the primary, what the
// signed assignment allows; for another service, no host path at all.
type Expect struct {
	// User, when set, is the exact Config.User the container runs as (the
	// primary's "uid:gid", the workspace consumer).
	User string
	// Capabilities are the only capabilities the container may keep
	// (policy.Capabilities); it must drop all others.
	Capabilities []string
	// Binds are the signed lease binds: each mounted exactly once,
	// read-only, from exactly its Source.
	Binds []Bind
	// Volumes are the tool-request spools: each mounted exactly once,
	// writable, from exactly the named volume.
	Volumes []Volume
	// Workspace is the worktree bind: mounted exactly once, writable, from
	// exactly its Source. Empty for a service that is not the primary.
	Workspace Bind
	// Writable are further writable binds the launch makes (the shared Git
	// metadata), each checked as the workspace is.
	Writable []Bind
	// ManagedRoot is the managed namespace in the container
	// ("/run/branchbox"): only the expected mounts may be under it.
	ManagedRoot string
	// ForbiddenEnv are exact variable names (the signed secret names) that
	// must not be in the container's environment.
	ForbiddenEnv []string
	// ExactEnv, when set, requires the container's environment to be Env
	// exactly (the primary's: its bound image's own). The Dev Containers
	// CLI starts a root shell in the primary (to patch /etc/environment
	// and /etc/profile) with the container's environment, so nothing of
	// the repository's may be in it: PATH, LD_PRELOAD or a line break
	// would run the repository's code as root there.
	ExactEnv bool
	Env      []string
}

// Bind is a host path (Source) bound at a container path (Target).
type Bind struct{ Source, Target string }

// Volume is a named volume (Name, exact) mounted at a container path.
type Volume struct{ Name, Target string }

// Refusal names the broken rule. Detail names container paths, variable
// names and capability names only.
type Refusal struct {
	Rule   string
	Detail string
}

func (r *Refusal) Error() string {
	return "final inspection: " + r.Rule + ": " + r.Detail
}

func refuse(rule, format string, args ...any) *Refusal {
	return &Refusal{Rule: rule, Detail: fmt.Sprintf(format, args...)}
}

// EngineDirs are host directories that hold engine sockets or engine
// state. A bind of one of them, of anything under one, or of one of their
// ancestors ("/", "/run", "/var", ...) exposes the engine.
var EngineDirs = []string{
	"/run/docker", "/var/run/docker", "/run/docker.sock", "/var/run/docker.sock",
	"/run/containerd", "/var/run/containerd", "/run/podman", "/var/run/podman",
	"/run/buildkit", "/var/run/buildkit", "/run/crio", "/var/run/crio",
	"/var/lib/docker", "/var/lib/containerd",
}

// rootlessEngineDirs are engine directories inside a user's runtime
// directory /run/user/UID (rootless Docker, Podman, containerd, BuildKit).
var rootlessEngineDirs = []string{"docker", "podman", "containerd", "containerd-rootless", "buildkit"}

// RequiredMaskedPaths and RequiredReadonlyPaths are the engine's default
// masked and read-only /proc and /sys paths (Docker 20.10's set; later
// engines add more). The engine records its defaults in the host
// configuration at creation, so an empty list means they were removed
// (`--security-opt systempaths=unconfined`), which makes, among others,
// /proc/sysrq-trigger and /proc/sys writable to the container's root.
var (
	RequiredMaskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
		"/proc/sched_debug", "/proc/scsi", "/sys/firmware",
	}
	RequiredReadonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// Check returns nil when the inspected container keeps the security
// contract and mounts exactly what e allows, else a *Refusal for the first
// broken rule. Anything it cannot verify is refused (fail closed).
func Check(c container.InspectResponse, e Expect) error {
	if c.ContainerJSONBase == nil || c.HostConfig == nil {
		return refuse(RuleIncomplete, "the inspection has no host configuration to verify")
	}
	if r := checkExpect(e); r != nil {
		return r
	}
	hc := c.HostConfig
	for _, check := range []func() *Refusal{
		func() *Refusal { return checkPrivileged(hc) },
		func() *Refusal { return checkUser(c.Config, e.User) },
		func() *Refusal { return checkNamespaces(hc) },
		func() *Refusal { return checkRuntime(hc) },
		func() *Refusal { return checkCapabilities(hc, e.Capabilities) },
		func() *Refusal { return checkCoreDumps(hc) },
		func() *Refusal { return checkDevices(hc) },
		func() *Refusal { return checkSecurityOpt(c.AppArmorProfile, hc) },
		func() *Refusal { return checkSystemPaths(hc) },
		func() *Refusal { return checkMounts(c.Mounts, hc.Tmpfs, e) },
		func() *Refusal { return checkEnv(c.Config, e.ForbiddenEnv) },
		func() *Refusal { return checkExactEnv(c.Config, e) },
	} {
		if r := check(); r != nil {
			return r
		}
	}
	return nil
}

// checkExpect refuses a malformed expectation: targets that are not clean
// absolute paths, are not distinct, or would shadow the managed root
// would make "exactly once at Target" ambiguous or meaningless.
func checkExpect(e Expect) *Refusal {
	if !cleanAbs(e.ManagedRoot) || e.ManagedRoot == "/" {
		return refuse(RuleExpect, "the managed root is not a clean absolute path below /")
	}
	seen := map[string]bool{}
	target := func(what, t string) *Refusal {
		switch {
		case !cleanAbs(t):
			return refuse(RuleExpect, "%s target %q is not a clean absolute path", what, t)
		case under(e.ManagedRoot, t):
			return refuse(RuleExpect, "%s target %s would cover the managed root", what, t)
		case seen[t]:
			return refuse(RuleExpect, "target %s is expected more than once", t)
		}
		seen[t] = true
		return nil
	}
	if e.Workspace.Target == "" && (len(e.Writable)+len(e.Binds)+len(e.Volumes) > 0 || e.User != "") {
		return refuse(RuleExpect, "only the primary, which has the workspace, has a user and mounts to expect")
	}
	for _, w := range writable(e) {
		if r := target("workspace", w.Target); r != nil {
			return r
		}
		if !cleanAbs(w.Source) {
			return refuse(RuleExpect, "the source of the writable bind at %s is not a clean absolute path", w.Target)
		}
	}
	for _, b := range e.Binds {
		if r := target("bind", b.Target); r != nil {
			return r
		}
		if !cleanAbs(b.Source) {
			return refuse(RuleExpect, "the source of the bind at %s is not a clean absolute path", b.Target)
		}
	}
	for _, v := range e.Volumes {
		if r := target("volume", v.Target); r != nil {
			return r
		}
		if v.Name == "" {
			return refuse(RuleExpect, "the volume at %s has no name", v.Target)
		}
	}
	return nil
}

func checkPrivileged(hc *container.HostConfig) *Refusal {
	if hc.Privileged {
		return refuse(RulePrivileged, "the container is privileged")
	}
	return nil
}

// checkNamespaces refuses every namespace shared with the host or joined
// from another container. The cgroup namespace must be "private" exactly:
// an empty mode is the engine's default, which on a cgroup v1 host is the
// host's namespace. The engine knows only "" and "host" for the UTS and
// user namespaces, so anything else there is refused too.
func checkNamespaces(hc *container.HostConfig) *Refusal {
	joined := []struct {
		name, mode string
	}{
		{"pid", string(hc.PidMode)},
		{"ipc", string(hc.IpcMode)},
		{"network", string(hc.NetworkMode)},
		{"uts", string(hc.UTSMode)},
	}
	for _, ns := range joined {
		switch {
		case ns.mode == "host":
			return refuse(RuleHostNamespace, "the %s namespace is the host's", ns.name)
		case strings.HasPrefix(ns.mode, "container:"):
			return refuse(RuleHostNamespace, "the %s namespace is another container's", ns.name)
		}
	}
	if hc.UTSMode != "" {
		return refuse(RuleHostNamespace, "the uts namespace mode is not the engine's private default")
	}
	if hc.UsernsMode != "" {
		return refuse(RuleHostNamespace, "the user namespace mode is not the engine's default")
	}
	if hc.CgroupnsMode != "private" {
		return refuse(RuleHostNamespace, "the cgroup namespace is not private")
	}
	return nil
}

// writable are the writable binds e expects: the workspace (when it has
// one) and the others.
func writable(e Expect) []Bind {
	if e.Workspace.Target == "" {
		return e.Writable
	}
	return append([]Bind{e.Workspace}, e.Writable...)
}

// checkUser requires the container's configured user to be exactly want
// (numeric "uid:gid"), when want is set: the engine starts the main
// process, and every exec without a user, as Config.User.
func checkUser(cfg *container.Config, want string) *Refusal {
	switch {
	case want == "":
		return nil
	case cfg == nil:
		return refuse(RuleUser, "the inspection has no container configuration to verify")
	case cfg.User != want:
		return refuse(RuleUser, "the container runs as %s, not the workspace consumer %s", quoteShort(cfg.User), want)
	}
	return nil
}

// checkRuntime refuses what changes the container's runtime or its
// kernel settings: another OCI runtime, a cgroup parent of the
// repository's choosing, and namespaced kernel parameters.
func checkRuntime(hc *container.HostConfig) *Refusal {
	switch {
	case hc.Runtime != "" && hc.Runtime != "runc":
		return refuse(RuleRuntime, "the container runs under another runtime")
	case hc.CgroupParent != "":
		return refuse(RuleRuntime, "the container has a cgroup parent of its own")
	case len(hc.Sysctls) > 0:
		return refuse(RuleRuntime, "%d kernel parameter(s) are set", len(hc.Sysctls))
	}
	return nil
}

// checkCoreDumps requires core dumps off for every process of the
// container, soft and hard limit 0: the facade's ulimits. A process the
// consumer kills would otherwise leave its memory (a provider's
// environment) in a core file.
func checkCoreDumps(hc *container.HostConfig) *Refusal {
	var core *container.Ulimit
	for _, u := range hc.Ulimits {
		if u != nil && u.Name == "core" {
			if core != nil {
				return refuse(RuleCoreDumps, "the core dump limit is set twice")
			}
			core = u
		}
	}
	if core == nil || core.Soft != 0 || core.Hard != 0 {
		return refuse(RuleCoreDumps, "core dumps are not off (ulimit core must be 0, soft and hard)")
	}
	return nil
}

// checkCapabilities requires every capability dropped (CapDrop holds
// ALL) and only allowed ones added back.
func checkCapabilities(hc *container.HostConfig, allowed []string) *Refusal {
	if !slices.ContainsFunc(hc.CapDrop, func(c string) bool { return policy.CapabilityName(c) == "ALL" }) {
		return refuse(RuleCapability, "the container does not drop all capabilities")
	}
	for _, c := range hc.CapAdd {
		if !policy.Allowed(allowed, c) {
			name := policy.CapabilityName(c)
			if name != "ALL" {
				name = "CAP_" + name
			}
			return refuse(RuleCapability, "capability %s is added", quoteShort(name))
		}
	}
	return nil
}

// quoteShort is s, at most 32 bytes of it, for a message: a value the
// repository chose is never shown whole.
func quoteShort(s string) string {
	if len(s) > 32 {
		s = s[:32] + "..."
	}
	return strconv.Quote(s)
}

func checkDevices(hc *container.HostConfig) *Refusal {
	switch {
	case len(hc.Devices) > 0:
		return refuse(RuleDevice, "%d host device(s) are mapped", len(hc.Devices))
	case len(hc.DeviceRequests) > 0:
		return refuse(RuleDevice, "%d device request(s) are made", len(hc.DeviceRequests))
	case len(hc.DeviceCgroupRules) > 0:
		return refuse(RuleDevice, "%d device cgroup rule(s) are added", len(hc.DeviceCgroupRules))
	}
	return nil
}

// checkSecurityOpt splits each option the way the engine does
// (daemon.parseSecurityOpt: bare "no-new-privileges", "writable-cgroups"
// and "disable", else KEY=VALUE, else the legacy KEY:VALUE) and refuses
// any option that lifts a confinement, or that it does not know (a newer
// engine's option may mean anything). Exactly one seccomp profile must be
// set: Compose and the CLI send a profile file's content as
// "seccomp=<json>", which the engine records as sent; without one the
// engine's own default applies, which is not the profile the launch
// chose. The profile's content is not examined here.
func checkSecurityOpt(appArmorProfile string, hc *container.HostConfig) *Refusal {
	if appArmorProfile == "unconfined" {
		return refuse(RuleSecurityOpt, "the AppArmor profile is unconfined")
	}
	seccomps, noNewPrivs := 0, 0
	for i, opt := range hc.SecurityOpt {
		switch opt {
		case "no-new-privileges":
			noNewPrivs++
			continue
		case "writable-cgroups":
			return refuse(RuleSecurityOpt, "security option %d makes the cgroup filesystem writable", i)
		case "disable":
			return refuse(RuleSecurityOpt, "security option %d disables SELinux labeling", i)
		}
		var k, v string
		var ok bool
		if strings.Contains(opt, "=") {
			k, v, ok = strings.Cut(opt, "=")
		} else {
			k, v, ok = strings.Cut(opt, ":")
		}
		if !ok {
			return refuse(RuleSecurityOpt, "security option %d is not understood", i)
		}
		switch k {
		case "seccomp":
			if strings.TrimSpace(v) == "" || v == "unconfined" {
				return refuse(RuleSeccomp, "the seccomp profile is unconfined")
			}
			seccomps++
		case "label":
			if v == "disable" || strings.Contains(v, "unconfined") || strings.Contains(v, "spc_t") {
				return refuse(RuleSecurityOpt, "security option %d lifts SELinux confinement", i)
			}
		case "apparmor":
			if v == "" || strings.Contains(v, "unconfined") {
				return refuse(RuleSecurityOpt, "security option %d lifts AppArmor confinement", i)
			}
		case "no-new-privileges":
			on, err := strconv.ParseBool(v)
			if err != nil || !on {
				return refuse(RuleSecurityOpt, "security option %d lets processes gain privileges", i)
			}
			noNewPrivs++
		case "writable-cgroups":
			if on, err := strconv.ParseBool(v); err != nil || on {
				return refuse(RuleSecurityOpt, "security option %d makes the cgroup filesystem writable", i)
			}
		default:
			// Not shown: an unknown option's text could be anything.
			return refuse(RuleSecurityOpt, "security option %d is not known", i)
		}
	}
	if seccomps != 1 {
		return refuse(RuleSeccomp, "%d seccomp profiles are set, want exactly 1", seccomps)
	}
	if noNewPrivs == 0 {
		return refuse(RuleSecurityOpt, "no-new-privileges is not set")
	}
	return nil
}

func checkSystemPaths(hc *container.HostConfig) *Refusal {
	for _, p := range RequiredMaskedPaths {
		if !slices.Contains(hc.MaskedPaths, p) {
			return refuse(RuleSystemPaths, "%s is not masked", p)
		}
	}
	for _, p := range RequiredReadonlyPaths {
		if !slices.Contains(hc.ReadonlyPaths, p) {
			return refuse(RuleSystemPaths, "%s is not read-only", p)
		}
	}
	return nil
}

// checkMounts checks the engine's list of the container's mounts
// (InspectResponse.Mounts). That list, not HostConfig.Binds or
// HostConfig.Mounts, is authoritative: it is what the engine resolved from
// binds, --mount, --volumes-from and the image's VOLUMEs, with the real
// read-only state. One exception: tmpfs mounts given as HostConfig.Tmpfs
// (`--tmpfs`, Compose's `tmpfs:`) are not in it (seen on Docker 20.10),
// so they are added here as writable tmpfs mounts.
func checkMounts(mounts []container.MountPoint, tmpfs map[string]string, e Expect) *Refusal {
	all := slices.Clone(mounts)
	for dest := range tmpfs {
		all = append(all, container.MountPoint{Type: mount.TypeTmpfs, Destination: dest, RW: true})
	}
	// Stable order, so the same container always gets the same refusal.
	slices.SortStableFunc(all, func(a, b container.MountPoint) int { return strings.Compare(a.Destination, b.Destination) })

	at := map[string][]container.MountPoint{}
	for _, m := range all {
		if !path.IsAbs(m.Destination) {
			return refuse(RuleMount, "a mount's destination is not an absolute path")
		}
		d := path.Clean(m.Destination)
		at[d] = append(at[d], m)
	}

	for _, w := range writable(e) {
		ws := at[w.Target]
		switch {
		case len(ws) != 1:
			return refuse(RuleWorkspace, "%d mounts at the workspace %s, want exactly 1", len(ws), w.Target)
		case ws[0].Type != mount.TypeBind:
			return refuse(RuleWorkspace, "the workspace %s is a %s mount, not a bind", w.Target, ws[0].Type)
		case !samePath(ws[0].Source, w.Source):
			return refuse(RuleWorkspace, "the workspace %s is not bound from the signed worktree", w.Target)
		case !ws[0].RW:
			return refuse(RuleWorkspace, "the workspace %s is read-only", w.Target)
		}
	}
	for _, b := range e.Binds {
		ms := at[b.Target]
		switch {
		case len(ms) != 1:
			return refuse(RuleBind, "%d mounts at the lease %s, want exactly 1", len(ms), b.Target)
		case ms[0].Type != mount.TypeBind:
			return refuse(RuleBind, "the lease %s is a %s mount, not a bind", b.Target, ms[0].Type)
		case !samePath(ms[0].Source, b.Source):
			return refuse(RuleBind, "the lease %s is not bound from its signed source", b.Target)
		case ms[0].RW:
			return refuse(RuleBind, "the lease %s is writable", b.Target)
		}
	}
	for _, v := range e.Volumes {
		ms := at[v.Target]
		// A volume's Source is the engine's private storage path: never
		// looked at, nor shown.
		switch {
		case len(ms) != 1:
			return refuse(RuleVolume, "%d mounts at the spool %s, want exactly 1", len(ms), v.Target)
		case ms[0].Type != mount.TypeVolume:
			return refuse(RuleVolume, "the spool %s is a %s mount, not a volume", v.Target, ms[0].Type)
		case ms[0].Name != v.Name:
			return refuse(RuleVolume, "the spool %s is not the signed volume", v.Target)
		case !ms[0].RW:
			return refuse(RuleVolume, "the spool %s is read-only", v.Target)
		}
	}

	expected := map[string]bool{}
	for _, w := range writable(e) {
		expected[w.Target] = true
	}
	for _, b := range e.Binds {
		expected[b.Target] = true
	}
	for _, v := range e.Volumes {
		expected[v.Target] = true
	}
	for _, m := range all {
		d := path.Clean(m.Destination)
		if expected[d] {
			continue // checked above, exactly once each
		}
		if under(d, e.ManagedRoot) || under(e.ManagedRoot, d) {
			// Under the managed root it forges or hides a lease; at or
			// above it, it could shadow the whole namespace.
			return refuse(RuleManagedMount, "an unexpected %s mount at %s overlaps the managed root %s", m.Type, d, e.ManagedRoot)
		}
		if m.Type != mount.TypeVolume && m.Source != "" && engineSource(m.Source) {
			return refuse(RuleEngineSocket, "the %s mount at %s exposes a container engine's socket or state", m.Type, d)
		}
		// The facade empties every service's volumes and binds exactly
		// what is expected: any other host path is unsigned (an image's
		// anonymous volumes and tmpfs mounts reach no host file).
		if m.Type == mount.TypeBind {
			return refuse(RuleMount, "an unsigned bind at %s", d)
		}
	}
	return nil
}

// engineSource reports whether a host path names an engine socket, an
// engine directory, something under one, or an ancestor of one. It is a
// check of the engine's record by name: a symbolic link to a socket under
// another name is not seen here.
func engineSource(src string) bool {
	if !path.IsAbs(src) {
		return false // not a host path (e.g. a Windows named pipe); nothing to compare
	}
	src = path.Clean(src)
	if slices.Contains(policy.EngineSocketNames, path.Base(src)) {
		return true
	}
	for _, d := range EngineDirs {
		if under(src, d) || under(d, src) {
			return true
		}
	}
	// Rootless engines: /run/user, /run/user/UID and their engine
	// directories.
	if src == "/run/user" || path.Dir(src) == "/run/user" {
		return true
	}
	if rest, ok := strings.CutPrefix(src, "/run/user/"); ok {
		if _, sub, ok := strings.Cut(rest, "/"); ok {
			first, _, _ := strings.Cut(sub, "/")
			if slices.Contains(rootlessEngineDirs, first) {
				return true
			}
		}
	}
	return false
}

// checkEnv refuses engine pointers and the signed secrets' names. Names
// are compared exactly (the environment is case-sensitive); only the name
// is ever shown.
func checkEnv(cfg *container.Config, forbidden []string) *Refusal {
	if cfg == nil {
		return refuse(RuleEnvironment, "the inspection has no container configuration to verify")
	}
	for _, kv := range cfg.Env {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(policy.EngineEnv, name) {
			return refuse(RuleEnvironment, "the engine variable %s is set", name)
		}
		if slices.Contains(forbidden, name) {
			return refuse(RuleEnvironment, "the signed secret name %s is set as a variable", name)
		}
	}
	return nil
}

// checkExactEnv requires the container's environment to be e.Env
// exactly, in order, when e.ExactEnv is set. Only a variable's name is
// shown (the first that differs), never a value.
func checkExactEnv(cfg *container.Config, e Expect) *Refusal {
	if !e.ExactEnv {
		return nil
	}
	if cfg == nil {
		return refuse(RuleEnvironment, "the inspection has no container configuration to verify")
	}
	for i := 0; i < len(cfg.Env) || i < len(e.Env); i++ {
		switch {
		case i >= len(cfg.Env):
			name, _, _ := strings.Cut(e.Env[i], "=")
			return refuse(RuleEnvironment, "the image's variable %s is missing", quoteShort(name))
		case i >= len(e.Env) || cfg.Env[i] != e.Env[i]:
			name, _, _ := strings.Cut(cfg.Env[i], "=")
			return refuse(RuleEnvironment, "the variable %s is not the image's own (the primary's environment is its image's)", quoteShort(name))
		}
	}
	return nil
}

// under reports whether p is root or below it, on a slash boundary.
func under(p, root string) bool {
	return p == root || root == "/" || strings.HasPrefix(p, root+"/")
}

func cleanAbs(p string) bool {
	return path.IsAbs(p) && path.Clean(p) == p
}

func samePath(a, b string) bool {
	return path.IsAbs(a) && path.Clean(a) == path.Clean(b)
}
