package config

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"agentbox/internal/grant"
	"agentbox/internal/secfs"
)

// Broker config bounds and defaults. The orchestration protocol says
// nothing about sandbox resources, inbox quotas or host uids; these numbers
// are agentbox's own (docs/broker-config.md gives the reasons).
const (
	// MaxBrokerConfigBytes bounds <state dir>/broker.yaml before it is
	// parsed; a real one is a few hundred bytes.
	MaxBrokerConfigBytes = 64 << 10

	// MinPids is the fewest tasks (processes and threads) a sandbox may be
	// limited to: a shell, git and an agent with a few threads.
	MinPids = 16
	// MaxPids is the kernel's own ceiling on pids (PID_MAX_LIMIT, 2^22).
	MaxPids = 4194304
	// DefaultPids is limits.pids when broker.yaml does not set it.
	DefaultPids = 1024

	// MinMemoryBytes is the smallest memory limit: below it an agent's
	// runtime does not start.
	MinMemoryBytes = 32 << 20
	// MaxMemoryBytes is the largest memory limit; more is a typo.
	MaxMemoryBytes = 1 << 40
	// DefaultMemoryBytes is limits.memory when broker.yaml does not set it.
	DefaultMemoryBytes = 4 << 30

	// MinDiskBytes is the smallest root disk a sandbox may be limited to:
	// the sandbox image takes about 230 MiB of it (on a btrfs pool the
	// image's own blocks count), which leaves room for a small checkout.
	MinDiskBytes = 512 << 20
	// MaxDiskBytes is the largest root disk limit; more is a typo.
	MaxDiskBytes = 1 << 44
	// DefaultDiskBytes is limits.disk when broker.yaml does not set it:
	// a checkout, its dependencies and build output.
	DefaultDiskBytes = 16 << 30

	// MinCPUWeight and MaxCPUWeight are cgroup v2's cpu.weight range.
	MinCPUWeight = 1
	MaxCPUWeight = 10000
	// DefaultCPUWeight is cgroup v2's own default weight (cgroup v1
	// cpu.shares 1024).
	DefaultCPUWeight = 100

	// MinInboxUnreadItems and MaxInboxUnreadItems bound
	// inbox.max_unread_items.
	MinInboxUnreadItems = 1
	MaxInboxUnreadItems = 1000000
	// DefaultInboxUnreadItems is inbox.max_unread_items when broker.yaml
	// does not set it.
	DefaultInboxUnreadItems = 1000

	// MinInboxUnreadBytes is one maximal message body (64 KiB), so an
	// empty inbox can always take any message.
	MinInboxUnreadBytes = 64 << 10
	// MaxInboxUnreadBytes bounds inbox.max_unread_bytes.
	MaxInboxUnreadBytes = 1 << 30
	// DefaultInboxUnreadBytes is inbox.max_unread_bytes when broker.yaml
	// does not set it.
	DefaultInboxUnreadBytes = 32 << 20

	// MinTreeChildren and MaxTreeChildren bound tree.max_children.
	MinTreeChildren = 1
	MaxTreeChildren = 10000
	// DefaultTreeChildren is tree.max_children when broker.yaml does not
	// set it.
	DefaultTreeChildren = 64
	// MinTreeQueuedSpawns and MaxTreeQueuedSpawns bound
	// tree.max_queued_spawns.
	MinTreeQueuedSpawns = 1
	MaxTreeQueuedSpawns = 10000
	// DefaultTreeQueuedSpawns is tree.max_queued_spawns when broker.yaml
	// does not set it.
	DefaultTreeQueuedSpawns = 32
	// MinTreeSpawnsPerHour and MaxTreeSpawnsPerHour bound
	// tree.max_spawns_per_hour.
	MinTreeSpawnsPerHour = 1
	MaxTreeSpawnsPerHour = 1000000
	// DefaultTreeSpawnsPerHour is tree.max_spawns_per_hour when
	// broker.yaml does not set it.
	DefaultTreeSpawnsPerHour = 256
	// MinTreeConnections and MaxTreeConnections bound
	// tree.max_connections.
	MinTreeConnections = 16
	MaxTreeConnections = 1000000
	// DefaultTreeConnections is tree.max_connections when broker.yaml
	// does not set it.
	DefaultTreeConnections = 1024
	// DefaultTreeUnreadItems and DefaultTreeUnreadBytes are
	// tree.max_unread_items and tree.max_unread_bytes when broker.yaml
	// does not set them; their bounds are inbox's.
	DefaultTreeUnreadItems = 2000
	DefaultTreeUnreadBytes = 64 << 20
	// MinReadRetentionDays and MaxReadRetentionDays bound
	// inbox.read_retention_days.
	MinReadRetentionDays = 1
	MaxReadRetentionDays = 3650
	// DefaultReadRetentionDays is inbox.read_retention_days when
	// broker.yaml does not set it.
	DefaultReadRetentionDays = 7

	// MinSandboxUID is the lowest host uid a sandbox may run as: below it
	// are system and login users (and, at 65534 and 65535, nobody and the
	// 16-bit "no uid").
	MinSandboxUID = 100000
	// MaxSandboxUID is the highest host uid a sandbox may run as: 2^31-2,
	// so tools that keep uids in a signed 32-bit integer (or use -1 as "no
	// uid") are never confused.
	MaxSandboxUID = 2147483646
	// MinSandboxUIDCount and MaxSandboxUIDCount bound sandbox_uids.count.
	MinSandboxUIDCount = 1
	MaxSandboxUIDCount = MaxSandboxUID - MinSandboxUID + 1
	// DefaultSandboxUIDFirst (2^30) and DefaultSandboxUIDCount (2^20) are
	// sandbox_uids when broker.yaml does not set them: far above the
	// subordinate ranges useradd hands out from 100000.
	DefaultSandboxUIDFirst = 1 << 30
	DefaultSandboxUIDCount = 1 << 20

	// nobodyUID and noUID16 must never be a sandbox's uid.
	nobodyUID = 65534
	noUID16   = 65535
)

// Broker is a parsed <state dir>/broker.yaml: the broker's own settings.
type Broker struct {
	// Limits are the resource limits of every sandbox; a repository's
	// .jailbee/config.yaml `limits` overrides them key by key.
	Limits Limits
	// Inbox is the quota of every sandbox's inbox.
	Inbox InboxQuota
	// Tree bounds each orchestrator with all its children.
	Tree Tree
	// SandboxUIDs is the host uid range a broker running as root gives its
	// sandboxes, one uid (and the same gid) each.
	SandboxUIDs UIDRange
	// AgentVersions pins the release of an installable agent (by name:
	// "claude") in place of its built-in default; absent: the default.
	AgentVersions map[string]string
	// Model is how model sockets reach the Messages API.
	Model Model
	// Mounts are the host directories a sandbox may be given, by name.
	Mounts map[string]MountDir
	// Forge is where and with which token outboxes are published.
	Forge Forge
	// Publish bounds what an orchestrator may publish.
	Publish Publish
}

// PinnableAgents are the agents `agents:` may pin.
var PinnableAgents = []string{"claude"}

// agentVersionPattern is a release number: no range, tag or path.
var agentVersionPattern = regexp.MustCompile(`^[0-9]{1,6}\.[0-9]{1,6}\.[0-9]{1,6}$`)

// decodeAgents reads `agents: {NAME: {version: "X.Y.Z"}}`.
func decodeAgents(n *yaml.Node, into map[string]string) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	return eachKey(n, "agents", func(name string, k, v *yaml.Node) error {
		p := join("agents", name)
		if !slices.Contains(PinnableAgents, name) {
			return errAt(p, k, "unknown agent (known: %s)", strings.Join(PinnableAgents, ", "))
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			return nil
		}
		return eachKey(v, p, func(key string, k, v *yaml.Node) error {
			if key != "version" {
				return errAt(join(p, key), k, "unknown key")
			}
			if v.Kind != yaml.ScalarNode || !agentVersionPattern.MatchString(v.Value) {
				return errAt(join(p, key), v, "must be a release number such as \"2.1.332\" (no range or tag)")
			}
			into[name] = v.Value
			return nil
		})
	})
}

// Limits are one sandbox's resource limits (cgroups).
type Limits struct {
	// Pids is the most tasks (processes and threads together) the sandbox
	// may have at once (cgroup pids.max).
	Pids int64
	// MemoryBytes is the sandbox's memory limit (cgroup v2 memory.max,
	// v1 memory.limit_in_bytes).
	MemoryBytes int64
	// CPUWeight is the sandbox's relative share of CPU time when CPUs are
	// contended, on cgroup v2's scale 1..10000 (cpu.weight; cgroup v1
	// cpu.shares = CPUWeight*1024/100).
	CPUWeight int
	// DiskBytes is the size of the sandbox's root filesystem (Incus: the
	// root disk's size; the local backend has no disk of its own and
	// ignores it).
	DiskBytes int64
}

// LimitsOverride is a repository's `limits` section: each non-nil field
// replaces the broker's default for that key.
type LimitsOverride struct {
	Pids        *int64
	MemoryBytes *int64
	CPUWeight   *int
	DiskBytes   *int64
}

// InboxQuota bounds what one sandbox's inbox holds unread.
type InboxQuota struct {
	// MaxUnreadItems is the most unread items the inbox may hold.
	MaxUnreadItems int
	// MaxUnreadBytes is the most bytes of unread message bodies the inbox
	// may hold.
	MaxUnreadBytes int64
	// ReadRetentionDays is how long read items are kept.
	ReadRetentionDays int
}

// Tree bounds what one orchestrator and its children may hold.
type Tree struct {
	// MaxChildren bounds the orchestrator's children in any state.
	MaxChildren int
	// MaxQueuedSpawns bounds its spawns and restarts waiting for a slot.
	MaxQueuedSpawns int
	// MaxSpawnsPerHour bounds the spawns it may have admitted in the
	// last hour (each child takes a host uid for good).
	MaxSpawnsPerHour int
	// MaxUnreadItems and MaxUnreadBytes bound the unread items of the
	// orchestrator's inbox and its children's, together.
	MaxUnreadItems int
	MaxUnreadBytes int64
	// MaxConnections bounds the model and egress connections the
	// orchestrator and its children hold open at once.
	MaxConnections int
}

// UIDRange is a range of host uids: First, First+1, ..., First+Count-1.
type UIDRange struct {
	First uint32
	Count uint32
}

// DefaultBroker returns the config of a broker without broker.yaml.
func DefaultBroker() *Broker {
	return &Broker{
		Limits: Limits{Pids: DefaultPids, MemoryBytes: DefaultMemoryBytes, CPUWeight: DefaultCPUWeight, DiskBytes: DefaultDiskBytes},
		Inbox: InboxQuota{MaxUnreadItems: DefaultInboxUnreadItems, MaxUnreadBytes: DefaultInboxUnreadBytes,
			ReadRetentionDays: DefaultReadRetentionDays},
		Tree: Tree{MaxChildren: DefaultTreeChildren, MaxQueuedSpawns: DefaultTreeQueuedSpawns, MaxSpawnsPerHour: DefaultTreeSpawnsPerHour,
			MaxConnections: DefaultTreeConnections,
			MaxUnreadItems: DefaultTreeUnreadItems, MaxUnreadBytes: DefaultTreeUnreadBytes},
		SandboxUIDs: UIDRange{
			First: DefaultSandboxUIDFirst,
			Count: DefaultSandboxUIDCount,
		},
		Model:   Model{Upstream: DefaultModelUpstream},
		Forge:   Forge{APIURL: DefaultForgeAPIURL, GitURL: DefaultForgeGitURL},
		Publish: Publish{ActionsPerHour: DefaultPublishActionsPerHour, BytesPerHour: DefaultPublishBytesPerHour},
	}
}

// Override returns l with every key o sets replaced.
func (l Limits) Override(o LimitsOverride) Limits {
	if o.Pids != nil {
		l.Pids = *o.Pids
	}
	if o.MemoryBytes != nil {
		l.MemoryBytes = *o.MemoryBytes
	}
	if o.CPUWeight != nil {
		l.CPUWeight = *o.CPUWeight
	}
	if o.DiskBytes != nil {
		l.DiskBytes = *o.DiskBytes
	}
	return l
}

// Last returns the range's last uid (First-1 for an empty range).
func (r UIDRange) Last() uint32 { return r.First + r.Count - 1 }

// Contains reports whether uid is in the range.
func (r UIDRange) Contains(uid uint32) bool {
	return uid >= r.First && uint64(uid) < uint64(r.First)+uint64(r.Count)
}

// ParseBroker decodes broker.yaml strictly, like Parse: at most
// MaxBrokerConfigBytes, one YAML document, no unknown or duplicate keys, no
// aliases, every value of the right kind and within its bounds. Missing
// keys (and keys set to null) take the defaults; empty input is
// DefaultBroker(). Errors are *Error naming the key path and line.
func ParseBroker(data []byte) (*Broker, error) {
	if len(data) > MaxBrokerConfigBytes {
		return nil, &Error{Msg: fmt.Sprintf("broker config exceeds %d bytes", MaxBrokerConfigBytes)}
	}
	doc, err := decodeDocument(data)
	if err != nil {
		return nil, err
	}
	b := DefaultBroker()
	if doc == nil {
		return b, nil
	}
	root := doc
	for root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return b, nil
	}
	sections := map[string][]field{
		"limits":       b.Limits.fields(),
		"inbox":        b.Inbox.fields(),
		"tree":         b.Tree.fields(),
		"sandbox_uids": b.SandboxUIDs.fields(),
		"publish":      b.Publish.fields(),
	}
	var uidsKey *yaml.Node
	err = eachKey(root, "", func(key string, k, v *yaml.Node) error {
		switch key {
		case "agents":
			b.AgentVersions = map[string]string{}
			return decodeAgents(v, b.AgentVersions)
		case "model":
			return decodeModel(v, &b.Model)
		case "mounts":
			b.Mounts = map[string]MountDir{}
			return decodeMounts(v, b.Mounts)
		case "forge":
			return decodeForge(v, &b.Forge)
		}
		fields, ok := sections[key]
		if !ok {
			return errAt(join("", key), k, "unknown key")
		}
		if key == "sandbox_uids" {
			uidsKey = k
		}
		_, err := decodeFields(v, key, fields)
		return err
	})
	if err != nil {
		return nil, err
	}
	if msg := b.SandboxUIDs.rangeProblem(); msg != "" {
		return nil, errAt("sandbox_uids", uidsKey, "%s", msg)
	}
	if err := b.Validate(); err != nil {
		return nil, err // unreachable: every rule was checked above
	}
	return b, nil
}

// Validate checks every bound of b (a Broker built in code, or one
// ParseBroker returned); the error names the key path.
func (b *Broker) Validate() error {
	for _, s := range []struct {
		key    string
		fields []field
	}{
		{"limits", b.Limits.fields()},
		{"inbox", b.Inbox.fields()},
		{"tree", b.Tree.fields()},
		{"sandbox_uids", b.SandboxUIDs.fields()},
		{"publish", b.Publish.fields()},
	} {
		for _, f := range s.fields {
			if !f.inBounds(f.get()) {
				return &Error{Path: s.key + "." + f.key, Msg: f.boundsMsg()}
			}
		}
	}
	if msg := b.SandboxUIDs.rangeProblem(); msg != "" {
		return &Error{Path: "sandbox_uids", Msg: msg}
	}
	if err := b.Forge.Validate(); err != nil {
		return err
	}
	for name, m := range b.Mounts {
		if !grant.ValidMount(name) {
			return &Error{Path: join("mounts", name), Msg: "invalid mount name"}
		}
		if !secfs.IsAbsClean(m.Path) || m.Path == "/" {
			return &Error{Path: join("mounts", name) + ".path", Msg: "must be an absolute, clean path of a directory (not /)"}
		}
	}
	return nil
}

// Validate checks the bounds of every key o sets; the error names the key
// path under `limits`.
func (o LimitsOverride) Validate() error {
	l := Limits{}.Override(o)
	set := []bool{o.Pids != nil, o.MemoryBytes != nil, o.CPUWeight != nil, o.DiskBytes != nil} // in fields() order
	for i, f := range l.fields() {
		if set[i] && !f.inBounds(f.get()) {
			return &Error{Path: "limits." + f.key, Msg: f.boundsMsg()}
		}
	}
	return nil
}

// rangeProblem returns what is wrong with the range as a whole, or "".
func (r UIDRange) rangeProblem() string {
	if last := uint64(r.First) + uint64(r.Count) - 1; r.Count > 0 && last > MaxSandboxUID {
		return fmt.Sprintf("first + count - 1 must be at most %d (this range ends at %d)", MaxSandboxUID, last)
	}
	if r.Contains(nobodyUID) || r.Contains(noUID16) {
		return fmt.Sprintf("the range must not contain %d or %d (nobody and the 16-bit \"no uid\")", nobodyUID, noUID16)
	}
	return ""
}

// UnmarshalYAML decodes a repository's `limits` mapping strictly (the same
// syntax and bounds as broker.yaml's `limits`); absent and null keys stay
// nil.
func (o *LimitsOverride) UnmarshalYAML(n *yaml.Node) error {
	v, err := decodeLimitsOverride(n, "limits")
	if err != nil {
		return err
	}
	*o = v
	return nil
}

// checkYAML lets checkNode report a bad `limits` key with its path and line.
func (o *LimitsOverride) checkYAML(n *yaml.Node, path string) error {
	_, err := decodeLimitsOverride(n, path)
	return err
}

func decodeLimitsOverride(n *yaml.Node, path string) (LimitsOverride, error) {
	var l Limits
	seen, err := decodeFields(n, path, l.fields())
	if err != nil {
		return LimitsOverride{}, err
	}
	var o LimitsOverride
	if seen["pids"] {
		o.Pids = &l.Pids
	}
	if seen["memory"] {
		o.MemoryBytes = &l.MemoryBytes
	}
	if seen["cpu_weight"] {
		o.CPUWeight = &l.CPUWeight
	}
	if seen["disk"] {
		o.DiskBytes = &l.DiskBytes
	}
	return o, nil
}

// field is one integer key of a section: its YAML name, whether it is a
// size (units allowed), its bounds and where its value lives.
type field struct {
	key      string
	size     bool
	min, max int64
	get      func() int64
	set      func(int64)
}

func (l *Limits) fields() []field {
	return []field{
		{key: "pids", min: MinPids, max: MaxPids,
			get: func() int64 { return l.Pids }, set: func(v int64) { l.Pids = v }},
		{key: "memory", size: true, min: MinMemoryBytes, max: MaxMemoryBytes,
			get: func() int64 { return l.MemoryBytes }, set: func(v int64) { l.MemoryBytes = v }},
		{key: "cpu_weight", min: MinCPUWeight, max: MaxCPUWeight,
			get: func() int64 { return int64(l.CPUWeight) }, set: func(v int64) { l.CPUWeight = int(v) }},
		{key: "disk", size: true, min: MinDiskBytes, max: MaxDiskBytes,
			get: func() int64 { return l.DiskBytes }, set: func(v int64) { l.DiskBytes = v }},
	}
}

func (q *InboxQuota) fields() []field {
	return []field{
		{key: "max_unread_items", min: MinInboxUnreadItems, max: MaxInboxUnreadItems,
			get: func() int64 { return int64(q.MaxUnreadItems) }, set: func(v int64) { q.MaxUnreadItems = int(v) }},
		{key: "max_unread_bytes", size: true, min: MinInboxUnreadBytes, max: MaxInboxUnreadBytes,
			get: func() int64 { return q.MaxUnreadBytes }, set: func(v int64) { q.MaxUnreadBytes = v }},
		{key: "read_retention_days", min: MinReadRetentionDays, max: MaxReadRetentionDays,
			get: func() int64 { return int64(q.ReadRetentionDays) }, set: func(v int64) { q.ReadRetentionDays = int(v) }},
	}
}

func (t *Tree) fields() []field {
	return []field{
		{key: "max_children", min: MinTreeChildren, max: MaxTreeChildren,
			get: func() int64 { return int64(t.MaxChildren) }, set: func(v int64) { t.MaxChildren = int(v) }},
		{key: "max_queued_spawns", min: MinTreeQueuedSpawns, max: MaxTreeQueuedSpawns,
			get: func() int64 { return int64(t.MaxQueuedSpawns) }, set: func(v int64) { t.MaxQueuedSpawns = int(v) }},
		{key: "max_spawns_per_hour", min: MinTreeSpawnsPerHour, max: MaxTreeSpawnsPerHour,
			get: func() int64 { return int64(t.MaxSpawnsPerHour) }, set: func(v int64) { t.MaxSpawnsPerHour = int(v) }},
		{key: "max_unread_items", min: MinInboxUnreadItems, max: MaxInboxUnreadItems,
			get: func() int64 { return int64(t.MaxUnreadItems) }, set: func(v int64) { t.MaxUnreadItems = int(v) }},
		{key: "max_unread_bytes", size: true, min: MinInboxUnreadBytes, max: MaxInboxUnreadBytes,
			get: func() int64 { return t.MaxUnreadBytes }, set: func(v int64) { t.MaxUnreadBytes = v }},
		{key: "max_connections", min: MinTreeConnections, max: MaxTreeConnections,
			get: func() int64 { return int64(t.MaxConnections) }, set: func(v int64) { t.MaxConnections = int(v) }},
	}
}

func (r *UIDRange) fields() []field {
	return []field{
		{key: "first", min: MinSandboxUID, max: MaxSandboxUID,
			get: func() int64 { return int64(r.First) }, set: func(v int64) { r.First = uint32(v) }},
		{key: "count", min: MinSandboxUIDCount, max: MaxSandboxUIDCount,
			get: func() int64 { return int64(r.Count) }, set: func(v int64) { r.Count = uint32(v) }},
	}
}

func (f field) inBounds(v int64) bool { return f.min <= v && v <= f.max }

func (f field) boundsMsg() string {
	if f.size {
		return fmt.Sprintf("must be %s to %s", FormatSize(f.min), FormatSize(f.max))
	}
	return fmt.Sprintf("must be %d to %d", f.min, f.max)
}

// decimalRE is the only integer text accepted: YAML would also read 0x10,
// 0o17, 0b1, 1_000 and 017 (octal!) as integers.
var decimalRE = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// decode reads one value node of the field; bounds are checked too.
func (f field) decode(n *yaml.Node, path string) (int64, error) {
	var v int64
	if f.size {
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!str" && n.Tag != "!!float") {
			return 0, errAt(path, n, "must be %s", sizeSyntax)
		}
		var err error
		if v, err = ParseSize(n.Value); err != nil {
			return 0, errAt(path, n, "%s", err.Error())
		}
	} else {
		// YAML reads digits past uint64 as a float: still an integer here,
		// refused below for its bounds.
		digits := n.Tag == "!!float" && decimalRE.MatchString(n.Value)
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && !digits) {
			return 0, errAt(path, n, "must be an integer")
		}
		if !decimalRE.MatchString(n.Value) {
			return 0, errAt(path, n, "must be a plain decimal integer (no sign but -, no 0x, 0o, 0b, _ or leading zeros)")
		}
		var err error
		if v, err = strconv.ParseInt(n.Value, 10, 64); err != nil {
			return 0, errAt(path, n, "%s", f.boundsMsg()) // past int64: past the bounds too
		}
	}
	if !f.inBounds(v) {
		return 0, errAt(path, n, "%s", f.boundsMsg())
	}
	return v, nil
}

// decodeFields decodes the mapping n (null: nothing set) into fields,
// refusing unknown and duplicate keys and aliases; it returns the keys set
// to a non-null value.
func decodeFields(n *yaml.Node, path string, fields []field) (map[string]bool, error) {
	seen := map[string]bool{}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return seen, nil
	}
	err := eachKey(n, path, func(key string, k, v *yaml.Node) error {
		p := join(path, key)
		for _, f := range fields {
			if f.key != key {
				continue
			}
			if v.Kind == yaml.AliasNode {
				return errAt(p, v, "YAML aliases are not supported")
			}
			if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
				return nil
			}
			val, err := f.decode(v, p)
			if err != nil {
				return err
			}
			f.set(val)
			seen[key] = true
			return nil
		}
		return errAt(p, k, "unknown key")
	})
	return seen, err
}

// eachKey calls fn for each key of the mapping n, refusing an alias, a
// node that is not a mapping, and duplicate or non-string keys.
func eachKey(n *yaml.Node, path string, fn func(key string, k, v *yaml.Node) error) error {
	if n.Kind == yaml.AliasNode {
		return errAt(path, n, "YAML aliases are not supported")
	}
	if n.Kind != yaml.MappingNode {
		return errAt(path, n, "must be a mapping")
	}
	return eachPair(n, path, fn)
}
