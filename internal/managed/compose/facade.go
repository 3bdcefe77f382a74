package compose

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"

	"agentbox/internal/managed/policy"
)

// ProjectName is the launch's Compose project: "branchbox-" and the first
// 24 hex digits of sha256(run_id NUL manifest path NUL worktree path), so
// a teardown finds it again from the signed run alone.
func ProjectName(runID, manifestPath, worktree string) string {
	sum := sha256.Sum256([]byte(runID + "\x00" + manifestPath + "\x00" + worktree))
	return "branchbox-" + hex.EncodeToString(sum[:])[:24]
}

// SpoolVolumeName is the named volume of a tool-request lease's spool:
// "branchbox-tool-requests-" and the first 32 hex digits of
// sha256(run_id NUL lease_id).
func SpoolVolumeName(runID, leaseID string) string {
	sum := sha256.Sum256([]byte(runID + "\x00" + leaseID))
	return "branchbox-tool-requests-" + hex.EncodeToString(sum[:])[:32]
}

// DisabledProfile is the Compose profile connectors are moved to: no
// launch enables it.
const DisabledProfile = "branchbox-disabled-connectors"

// hostFacing are the service keys the facade empties: each reaches the
// host (its files, devices, ports) or another service's mounts.
var hostFacing = []string{"env_file", "volumes", "ports", "expose", "devices", "secrets", "configs", "volumes_from"}

// Bind is a host path bound into the primary container.
type Bind struct {
	Source, Target string
	ReadOnly       bool
}

// Volume is a named volume mounted writable in the primary container.
type Volume struct {
	Name, Target string
}

// FacadePlan is what the facade puts over the checked Compose files.
type FacadePlan struct {
	// Images binds every runnable service to its preloaded image.
	Images map[string]string
	// Primary is the service the devcontainer runs in.
	Primary string
	// Workspace is the worktree's bind (writable); Leases are the signed
	// read-only binds; Spools the tool-request volumes.
	Workspace Bind
	// GitMetadata, when set, is the shared Git metadata's writable bind,
	// so Git works in the worktree inside the container.
	GitMetadata Bind
	Leases      []Bind
	Spools      []Volume
	// Seccomp is the host path of the seccomp profile (see
	// SeccompProfile, written by the launch) every service runs under.
	Seccomp string
	// User is the primary's "uid:gid": the workspace consumer.
	User string
}

// Facade is the Compose file merged last over the checked files: every
// runnable service on its bound image, never built or pulled, with its
// host-facing keys emptied (`!reset`), all capabilities dropped but
// policy.Capabilities, the seccomp profile, no new privileges, not
// privileged and a private cgroup namespace (on a cgroup v1 host the
// default is the host's); connectors and omitted services moved to a
// profile no launch enables; and the primary service run as the
// workspace consumer, with its image's environment only, with exactly
// the workspace, the signed leases read-only and the spools as their
// named volumes. The runnable services
// must pass CheckRunnable.
func Facade(p *Project, plan FacadePlan) ([]byte, error) {
	if err := p.CheckRunnable(); err != nil {
		return nil, err
	}
	if !slices.Contains(p.Runnable, plan.Primary) {
		return nil, fmt.Errorf("compose: the primary service %q is not a runnable service", plan.Primary)
	}
	for _, name := range p.Runnable {
		if plan.Images[name] == "" {
			return nil, fmt.Errorf("compose: runnable service %q has no image", name)
		}
	}
	if plan.Seccomp == "" || plan.Workspace.Source == "" || plan.Workspace.Target == "" || plan.User == "" {
		return nil, fmt.Errorf("compose: the facade needs the seccomp profile, the workspace bind and the consumer")
	}
	services := mapping()
	for _, name := range p.Runnable {
		svc := mapping()
		add(svc, "image", str(plan.Images[name]))
		add(svc, "build", tagged("!reset", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}))
		add(svc, "pull_policy", str("never"))
		resetHostFacing(svc)
		confine(svc, name == plan.Primary, plan.Seccomp)
		if name == plan.Primary {
			primary(svc, plan)
		}
		add(services, name, svc)
	}
	for _, name := range append(slices.Clone(p.Connectors), p.Omitted...) {
		svc := mapping()
		add(svc, "profiles", tagged("!override", seq(str(DisabledProfile))))
		resetHostFacing(svc)
		add(services, name, svc)
	}
	doc := mapping()
	add(doc, "services", services)
	if len(plan.Spools) > 0 {
		vols := mapping()
		for _, v := range plan.Spools {
			def := mapping()
			add(def, "name", str(v.Name))
			add(vols, v.Name, def)
		}
		add(doc, "volumes", vols)
	}
	out, err := yaml.Marshal(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{doc}})
	if err != nil {
		return nil, fmt.Errorf("compose: write the facade: %w", err)
	}
	return out, nil
}

// confine sets what every runnable service runs with.
func confine(svc *yaml.Node, isPrimary bool, seccomp string) {
	add(svc, "cap_drop", tagged("!override", seq(str("ALL"))))
	caps := seq()
	for _, c := range policy.Capabilities(isPrimary) {
		caps.Content = append(caps.Content, str(c))
	}
	add(svc, "cap_add", tagged("!override", caps))
	add(svc, "security_opt", tagged("!override", seq(str("seccomp="+seccomp), str(policy.NoNewPrivileges))))
	add(svc, "cgroup", str("private"))
	add(svc, "privileged", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "false"})
	// Core dumps off for every process, soft and hard (docker exec takes
	// the container's limits): the provider's shell sets its own to 0 only
	// once it runs, and a consumer that kills it before then would find
	// its environment in a core file of the workspace, where the engine's
	// limit allows one (LimitCORE=infinity in Docker's own unit).
	core := mapping()
	add(core, "soft", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: "0"})
	add(core, "hard", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: "0"})
	limits := mapping()
	add(limits, "core", core)
	add(svc, "ulimits", tagged("!override", limits))
}

// primary sets what the primary service runs with.
func primary(svc *yaml.Node, plan FacadePlan) {
	mounts := seq(bindNode(plan.Workspace))
	if plan.GitMetadata.Source != "" {
		mounts.Content = append(mounts.Content, bindNode(plan.GitMetadata))
	}
	for _, b := range plan.Leases {
		b.ReadOnly = true
		mounts.Content = append(mounts.Content, bindNode(b))
	}
	for _, v := range plan.Spools {
		m := mapping()
		add(m, "type", str("volume"))
		add(m, "source", str(v.Name))
		add(m, "target", str(v.Target))
		mounts.Content = append(mounts.Content, m)
	}
	set(svc, "volumes", tagged("!override", mounts))
	add(svc, "user", str(plan.User))
	// The image's environment only: the Dev Containers CLI runs a root
	// shell here with the container's environment.
	add(svc, "environment", tagged("!reset", seq()))
}

func bindNode(b Bind) *yaml.Node {
	m := mapping()
	add(m, "type", str("bind"))
	add(m, "source", str(b.Source))
	add(m, "target", str(b.Target))
	add(m, "read_only", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(b.ReadOnly)})
	return m
}

func resetHostFacing(svc *yaml.Node) {
	for _, key := range hostFacing {
		add(svc, key, tagged("!reset", seq()))
	}
}

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode} }

func seq(items ...*yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.SequenceNode, Content: items}
}

// str is a string scalar, quoted so that YAML never reads it as another
// type; a '$' is doubled, as Compose would otherwise interpolate it.
func str(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: escapeDollars(s), Style: yaml.DoubleQuotedStyle}
}

func escapeDollars(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '$' {
			out = append(out, '$')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func tagged(tag string, n *yaml.Node) *yaml.Node {
	n.Tag = tag
	return n
}

func add(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
}

// set replaces key's value in m, or adds it.
func set(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	add(m, key, v)
}
