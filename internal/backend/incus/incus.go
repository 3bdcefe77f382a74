// Package incus is the production sandbox backend: a sandbox is an
// unprivileged Incus system container made from the jailbee image
// (BuildImage), driven through the incus command line and `incus query`
// (the REST API as JSON), never the Incus Go client. Every process of a
// sandbox runs in its container; git on its checkout runs there through
// Exec (`incus exec`), so no host process reads what a sandbox controls.
package incus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/serial"
	"agentbox/internal/untrusted"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"
)

// What some refusals of incus mean (incusError).
var (
	errAlreadyRunning = errors.New("already running")
	errNoDevice       = errors.New("no such device")
)

// ErrDaemonDown: incusd does not answer.
var ErrDaemonDown = errors.New("incusd does not answer: is it running? (docs/incus.md says how to start it)")

// Type names this backend.
const Type = "incus"

var (
	_ backend.Backend        = (*Backend)(nil)
	_ backend.SteppedStarter = (*Backend)(nil)
)

// Paths and names inside a sandbox.
const (
	WorkspacePath = backend.WorkspacePath    // the checkout, owned by the agent
	HomePath      = "/home/agent"            // the agent's home
	AgentUser     = "agent"                  // login name of AgentUID
	AgentUID      = backend.AgentUID         // the agent user's uid and gid
	ClientPath    = "/usr/local/bin/jailbee" // the jailbee client, a read-only disk device
	clientDevice  = "jailbee-client"
	AgentBinDir   = "/usr/local/bin" // agent binaries, beside the client
	agentDevice   = "jailbee-agent-" // + the agent's name: its read-only disk device
)

// Config keys jailbee sets on its containers.
const (
	managedKey  = "user.jailbee.managed" // "true" on every container this backend made
	labelPrefix = "user.jailbee."        // + a CreateOptions label key
	uuidKey     = "volatile.uuid"
)

// labelKey is the shape of a label key.
var labelKey = regexp.MustCompile(`^[a-z][a-z-]{0,31}$`)

// Retries of a config change that lost an ETag race to another writer.
const (
	etagAttempts = 5
	etagBackoff  = 200 * time.Millisecond // times the attempt number
)

// Options configures an Incus backend.
type Options struct {
	Project string // Incus project ("" = default)
	Image   string // image alias (default DefaultImage)
	// Pool is the storage pool of new sandboxes ("" = the root disk of
	// the project's default profile). On btrfs (or zfs, lvm-thin) a
	// sandbox is a snapshot of the unpacked image; on dir every create
	// unpacks the whole image again.
	Pool string
	// Client is the host path of the jailbee binary mounted read-only in
	// every sandbox at ClientPath (the broker passes its own).
	Client string
	// NoLimits ignores Create's Limits.
	NoLimits bool
	// AgentBinaries are host files bound read-only into every sandbox on
	// its PATH, by the name they run as (e.g. "claude" -> <state>/agents/claude/2.1.332/bin/claude).
	AgentBinaries map[string]string
	// Incus is the incus command (default "incus" on PATH).
	Incus string
}

// Backend is the Incus backend.
type Backend struct {
	opts Options

	// managed maps the containers this backend made to whether they
	// were running, as last seen (List each broker round, and every read
	// or change of one here). Exec skips its own look at a container seen
	// running; Start, AttachSocket and DetachSocket at one seen at all. An
	// incus call costs 25-80 ms and a spawn runs a dozen commands, while a
	// command in a container that has gone or stopped since fails anyway
	// (Exec then looks and says why). The one thing the look would have
	// caught in that window, a container of the same name made outside
	// jailbee, takes Incus's own rights to make.
	mu      sync.Mutex
	managed map[string]bool
	inits   map[string]initProc // running containers' inits (mounts.go)
	pool    string              // the root disks' pool, once known to size them (sizedPool)
	// profilePool: the default profile's root pool, once read (rootPool).
	profilePool string
	hostIDs     map[string]mountID // host paths as a container's mount table shows them
	// agentsOK holds the containers last seen with exactly the agent
	// devices of Options: Start spares them the look.
	agentsOK map[string]bool
}

func (b *Backend) agentsCurrent(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.agentsOK[name]
}

func (b *Backend) setAgentsCurrent(name string, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.agentsOK[name] = true
	} else {
		delete(b.agentsOK, name)
	}
}

// seen records a container of this backend and whether it runs.
func (b *Backend) seen(name string, running bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.managed[name] = running
	if !running {
		delete(b.inits, name)
	}
}

// forget records that name is not (or no longer) a container of this
// backend.
func (b *Backend) forget(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.managed, name)
	delete(b.inits, name)
	delete(b.agentsOK, name)
}

// lastSeen reports whether name was last seen as a container of this
// backend, and running.
func (b *Backend) lastSeen(name string) (managed, running bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	running, managed = b.managed[name]
	return managed, running
}

// New checks that incus answers and returns the backend.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if opts.Image == "" {
		opts.Image = DefaultImage
	}
	if opts.Incus == "" {
		opts.Incus = "incus"
	}
	agents := map[string]string{}
	for name, p := range opts.AgentBinaries {
		if err := backend.ValidateAgentName(name); err != nil {
			return nil, fmt.Errorf("incus backend: %w", err)
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, err
		}
		agents[name] = abs
	}
	opts.AgentBinaries = agents
	if _, err := exec.LookPath(opts.Incus); err != nil {
		return nil, errors.New("incus not found on PATH: install Incus (see docs/incus.md)")
	}
	b := &Backend{opts: opts, managed: map[string]bool{}, inits: map[string]initProc{}, hostIDs: map[string]mountID{}, agentsOK: map[string]bool{}}
	var server struct {
		APIStatus string `json:"api_status"`
	}
	if err := b.query(ctx, "/1.0", &server); err != nil {
		if errors.Is(err, ErrDaemonDown) {
			return nil, err
		}
		return nil, fmt.Errorf("incus does not answer: %w", err)
	}
	if opts.Pool != "" {
		var pool struct{}
		if err := b.query(ctx, "/1.0/storage-pools/"+url.PathEscape(opts.Pool), &pool); err != nil {
			return nil, fmt.Errorf("no Incus storage pool %q here (see incus storage list)", opts.Pool)
		}
	}
	return b, nil
}

// Type implements backend.Backend.
func (b *Backend) Type() string { return Type }

// Create implements backend.Backend: a container from the image,
// labelled as jailbee's, with its limits, its root disk's size and the
// client device, in one `incus create` whose configuration goes in on
// stdin (a label holds a host path: never on a command line, which every
// host user can read). Its volatile.uuid is chosen here, as Incus would
// (random, version 4), so reading the new container back is spared.
func (b *Backend) Create(ctx context.Context, opts backend.CreateOptions) (backend.Instance, error) {
	if err := backend.ValidateName(opts.Name); err != nil {
		return backend.Instance{}, err
	}
	uuid, err := backend.NewUUID()
	if err != nil {
		return backend.Instance{}, err
	}
	// security.guestapi=false: the guest API (/dev/incus) would show the
	// container its user.* keys, host paths among them.
	config := map[string]string{managedKey: "true", "security.guestapi": "false", uuidKey: uuid}
	labels, err := labelConfig(opts.Labels)
	if err != nil {
		return backend.Instance{}, fmt.Errorf("create sandbox %s: %w", opts.Name, err)
	}
	settings := labels
	if !b.opts.NoLimits {
		settings = append(settings, limitConfig(opts.Limits)...)
	}
	for _, kv := range settings {
		k, v, _ := strings.Cut(kv, "=")
		config[k] = v
	}
	devices := map[string]map[string]string{}
	if b.opts.Client != "" {
		devices[clientDevice] = map[string]string{"type": "disk", "source": b.opts.Client, "path": ClientPath, "readonly": "true"}
	}
	maps.Copy(devices, b.agentDevices())
	// The root disk is the container's own: it is made with no profile
	// (--no-profiles below), so that nothing a profile holds (the default
	// profile's NIC on a host set up with `incus admin init`, an admin's
	// nesting or raw.lxc) reaches a sandbox, now or when edited later.
	pool, err := b.rootPool(ctx)
	if err != nil {
		return backend.Instance{}, fmt.Errorf("create sandbox %s: %w", opts.Name, err)
	}
	devices["root"] = map[string]string{"type": "disk", "path": "/", "pool": pool}
	if disk := opts.Limits.DiskBytes; disk > 0 && !b.opts.NoLimits {
		pool, err := b.sizedPool(ctx)
		if err != nil {
			return backend.Instance{}, fmt.Errorf("create sandbox %s: %w", opts.Name, err)
		}
		devices["root"] = map[string]string{"type": "disk", "path": "/", "pool": pool, "size": strconv.FormatInt(disk, 10) + "B"}
	}
	doc, err := yaml.Marshal(map[string]any{"config": config, "devices": devices})
	if err != nil {
		return backend.Instance{}, err
	}
	if _, err := b.run(ctx, doc, "create", b.opts.Image, opts.Name, "--no-profiles", "--quiet"); err != nil {
		if errors.Is(err, backend.ErrExists) {
			return backend.Instance{}, fmt.Errorf("%w: %s", backend.ErrExists, opts.Name)
		}
		if !b.HasImage(ctx) {
			return backend.Instance{}, fmt.Errorf("no image %q in Incus: run 'jailbee image build' once", b.opts.Image)
		}
		return backend.Instance{}, fmt.Errorf("create sandbox %s: %w", opts.Name, err)
	}
	b.seen(opts.Name, false)
	b.setAgentsCurrent(opts.Name, true)
	return rawInstance{Name: opts.Name, Config: config, Devices: devices}.instance(), nil
}

// rootPool is the pool of new sandboxes' root disks: Options.Pool, else
// the pool of the default profile's root disk (read once; the sandbox
// itself takes nothing else of the profile).
func (b *Backend) rootPool(ctx context.Context) (string, error) {
	if b.opts.Pool != "" {
		return b.opts.Pool, nil
	}
	b.mu.Lock()
	pool := b.profilePool
	b.mu.Unlock()
	if pool != "" {
		return pool, nil
	}
	var profile struct {
		Devices map[string]map[string]string `json:"devices"`
	}
	if err := b.query(ctx, "/1.0/profiles/default", &profile); err != nil {
		return "", fmt.Errorf("read the default profile's root disk: %w", err)
	}
	if root := profile.Devices["root"]; root["type"] == "disk" && root["path"] == "/" {
		pool = root["pool"]
	}
	if pool == "" {
		return "", errors.New("no storage pool for the root disk: the default profile has no root disk and no --incus-pool was given (see docs/incus.md)")
	}
	b.mu.Lock()
	b.profilePool = pool
	b.mu.Unlock()
	return pool, nil
}

// sizedPool is rootPool once its driver is known to hold a root disk to
// its size: `dir` takes a size and ignores it (unless the host filesystem
// has project quotas, which Incus does not report).
func (b *Backend) sizedPool(ctx context.Context) (string, error) {
	b.mu.Lock()
	pool := b.pool
	b.mu.Unlock()
	if pool != "" {
		return pool, nil
	}
	pool, err := b.rootPool(ctx)
	if err != nil {
		return "", err
	}
	var info struct {
		Driver string `json:"driver"`
	}
	if err := b.query(ctx, "/1.0/storage-pools/"+url.PathEscape(pool), &info); err != nil {
		return "", fmt.Errorf("read storage pool %q: %w", pool, err)
	}
	if !slices.Contains(sizingDrivers, info.Driver) {
		return "", fmt.Errorf("storage pool %q (%s) cannot hold a sandbox to its disk limit (limits.disk): "+
			"use a btrfs, zfs or lvm pool (--incus-pool jailbee, which scripts/incus-setup.sh makes), or --no-limits; see docs/incus.md",
			pool, info.Driver)
	}
	b.mu.Lock()
	b.pool = pool
	b.mu.Unlock()
	return pool, nil
}

// sizingDrivers are the storage drivers that hold a root disk to its
// size.
var sizingDrivers = []string{"btrfs", "zfs", "lvm", "lvmcluster", "ceph"}

// labelConfig maps labels to user.jailbee.KEY=VALUE config, in key order.
func labelConfig(labels map[string]string) ([]string, error) {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		v := labels[k]
		if !labelKey.MatchString(k) || labelPrefix+k == managedKey {
			return nil, fmt.Errorf("invalid label key %q", k)
		}
		if strings.ContainsAny(v, "\x00\n\r") || len(v) > maxLabelLen {
			return nil, fmt.Errorf("invalid value of label %s", k)
		}
		out = append(out, labelPrefix+k+"="+v)
	}
	return out, nil
}

// maxLabelLen bounds a label's value (a repository path is the longest).
const maxLabelLen = 4096

// limitConfig maps limits to Incus config: limits.processes,
// limits.memory and limits.cpu.allowance (a share under contention: the
// CPU weight, 1..10000 with 100 the default, as a percentage capped at
// 100%). The disk limit is the root disk's size (Create).
func limitConfig(l backend.Limits) []string {
	var out []string
	if l.Pids > 0 {
		out = append(out, "limits.processes="+strconv.FormatInt(l.Pids, 10))
	}
	if l.MemoryBytes > 0 {
		out = append(out, "limits.memory="+strconv.FormatInt(l.MemoryBytes, 10)+"B")
	}
	if l.CPUWeight > 0 {
		out = append(out, "limits.cpu.allowance="+strconv.Itoa(min(max(l.CPUWeight, 1), 100))+"%")
	}
	return out
}

// agentDevices are the disk devices of Options.AgentBinaries, by name.
func (b *Backend) agentDevices() map[string]map[string]string {
	out := map[string]map[string]string{}
	for name, src := range b.opts.AgentBinaries {
		out[agentDevice+name] = map[string]string{"type": "disk", "source": src, "path": path.Join(AgentBinDir, name), "readonly": "true"}
	}
	return out
}

// Start implements backend.Backend: StartUnit, then FinishStart.
func (b *Backend) Start(ctx context.Context, name string) error {
	if err := b.StartUnit(ctx, name); err != nil {
		return err
	}
	return b.FinishStart(ctx, name)
}

// StartUnit starts the container (backend.SteppedStarter). A container
// made by an older broker, or with other agent versions, gets the current
// agent devices first.
func (b *Backend) StartUnit(ctx context.Context, name string) error {
	// Incus would refuse the start naming the host path; the agent's name
	// is what the user installs by.
	for _, agent := range slices.Sorted(maps.Keys(b.opts.AgentBinaries)) {
		if fi, err := os.Stat(b.opts.AgentBinaries[agent]); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("start %s: the %s agent's binary is missing on the host (jailbee agent install %s)", name, agent, agent)
		}
	}
	if managed, _ := b.lastSeen(name); !managed || !b.agentsCurrent(name) {
		in, err := b.raw(ctx, name)
		if err != nil {
			return err
		}
		if err := b.syncAgents(ctx, in); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
	}
	if _, err := b.run(ctx, nil, "start", name); err != nil && !errors.Is(err, errAlreadyRunning) {
		return fmt.Errorf("start %s: %w", name, err)
	}
	b.seen(name, true)
	return nil
}

// FinishStart is Start's step inside the container: the egress relay,
// which root inside can hold up for egressTimeout (backend.SteppedStarter).
func (b *Backend) FinishStart(ctx context.Context, name string) error {
	return b.startEgressRelay(ctx, name)
}

// dropProfiles takes every profile off a container made when sandboxes
// still had the project's default one, keeping its root disk as a device
// of its own: no NIC or setting of a profile may reach a sandbox.
func (b *Backend) dropProfiles(ctx context.Context, in rawInstance) error {
	if len(in.Profiles) == 0 {
		return nil
	}
	if in.Devices["root"] == nil {
		root := in.ExpandedDevices["root"]
		if root["type"] != "disk" || root["path"] != "/" || root["pool"] == "" {
			return errors.New("its profiles give it no root disk to keep")
		}
		args := []string{"config", "device", "add", in.Name, "root", "disk", "path=/", "pool=" + root["pool"]}
		if size := root["size"]; size != "" {
			args = append(args, "size="+size)
		}
		if err := b.retryConfig(ctx, args...); err != nil {
			return fmt.Errorf("root disk: %w", err)
		}
	}
	if err := b.retryConfig(ctx, "profile", "assign", in.Name, ""); err != nil {
		return fmt.Errorf("remove its profiles: %w", err)
	}
	return nil
}

// syncAgents gives the container in the agent devices of Options (added,
// or set to the current source), and removes those of agents it no
// longer has: a device whose source is gone would keep it from starting.
func (b *Backend) syncAgents(ctx context.Context, in rawInstance) error {
	if err := b.dropProfiles(ctx, in); err != nil {
		return err
	}
	want := b.agentDevices()
	for _, dev := range slices.Sorted(maps.Keys(want)) {
		conf, have := want[dev], in.Devices[dev]
		if sameDevice(have, conf) {
			continue
		}
		if have != nil && have["type"] != conf["type"] {
			if err := b.retryConfig(ctx, "config", "device", "remove", in.Name, dev); err != nil && !errors.Is(err, errNoDevice) {
				return err
			}
			have = nil
		}
		args := []string{"config", "device", "set", in.Name, dev}
		if have == nil {
			args = []string{"config", "device", "add", in.Name, dev, conf["type"]}
		}
		for _, k := range slices.Sorted(maps.Keys(conf)) {
			if k != "type" {
				args = append(args, k+"="+conf[k])
			}
		}
		if err := b.retryConfig(ctx, args...); err != nil {
			return fmt.Errorf("agent device %s: %w", dev, err)
		}
	}
	for dev := range in.Devices {
		if _, ok := want[dev]; !ok && strings.HasPrefix(dev, agentDevice) {
			if err := b.retryConfig(ctx, "config", "device", "remove", in.Name, dev); err != nil && !errors.Is(err, errNoDevice) {
				return fmt.Errorf("agent device %s: %w", dev, err)
			}
		}
	}
	b.setAgentsCurrent(in.Name, true)
	return nil
}

// sameDevice reports whether have holds every key of want as it is.
func sameDevice(have, want map[string]string) bool {
	if have == nil {
		return false
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// agentsMatch reports whether in has exactly the agent devices of Options.
func (b *Backend) agentsMatch(in rawInstance) bool {
	if len(in.Profiles) > 0 {
		return false // Start's syncAgents takes the profiles off first
	}
	want := b.agentDevices()
	for dev := range in.Devices {
		if strings.HasPrefix(dev, agentDevice) && want[dev] == nil {
			return false
		}
	}
	for dev, conf := range want {
		if !sameDevice(in.Devices[dev], conf) {
			return false
		}
	}
	return true
}

// Stop implements backend.Backend: a forced stop ends every process of
// the container at once.
func (b *Backend) Stop(ctx context.Context, name string) error {
	in, err := b.instance(ctx, name)
	if err != nil {
		return err
	}
	if !in.Running {
		return nil
	}
	if _, err := b.run(ctx, nil, "stop", "--force", name); err != nil {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	b.seen(name, false)
	return nil
}

// Destroy implements backend.Backend. Incus removes the container's files
// as part of the delete, as many as the sandbox made, so the delete runs
// outside the broker's turn (serial.Outside): other requests go on
// meanwhile.
func (b *Backend) Destroy(ctx context.Context, name string) error {
	if _, err := b.instance(ctx, name); err != nil {
		return err
	}
	var err error
	serial.Outside(ctx, func() { _, err = b.run(ctx, nil, "delete", "--force", name) })
	if err != nil && !errors.Is(err, backend.ErrNotFound) {
		// A delete already running (another destroy's, outside its turn
		// too) makes this one fail once it has ended; the container is
		// gone all the same.
		if _, look := b.instance(ctx, name); !errors.Is(look, backend.ErrNotFound) {
			return fmt.Errorf("delete %s: %w", name, err)
		}
	}
	b.forget(name)
	return nil
}

// AttachSocket implements backend.Backend: the directory becomes the
// read-only, shifted disk device kind.DeviceName() at kind.MountPath() (so
// the agent user inside can connect through the idmap), replacing an
// earlier one. A running container gets it at once.
func (b *Backend) AttachSocket(ctx context.Context, name string, kind backend.SocketKind, dir string) error {
	if !kind.Valid() {
		return fmt.Errorf("attach socket: unknown kind %v", kind)
	}
	if managed, _ := b.lastSeen(name); !managed {
		if _, err := b.raw(ctx, name); err != nil {
			return err
		}
	}
	// shift=true shows host uids as they are: the directory and socket
	// must belong to the agent's uid to be reachable inside. Their host
	// parent (the broker's state dir, 0700) keeps any host account of
	// that uid out.
	socks, err := backend.SocketsIn(dir)
	if err != nil {
		return fmt.Errorf("attach the %s socket to %s: %w", kind, name, err)
	}
	for _, p := range append([]string{dir}, socks...) {
		if err := unix.Fchownat(unix.AT_FDCWD, p, AgentUID, AgentUID, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("attach the %s socket to %s: %w", kind, name, err)
		}
	}
	dev := kind.DeviceName()
	add := []string{"config", "device", "add", name, dev, "disk",
		"source=" + dir, "path=" + kind.MountPath(), "readonly=true", "shift=true"}
	err = b.retryConfig(ctx, add...)
	if !errors.Is(err, backend.ErrExists) {
		return err // a new sandbox has no attachment, and is spared the look
	}
	in, err := b.raw(ctx, name)
	if err != nil {
		return err
	}
	if in.Devices[dev]["source"] == dir {
		// Already there (a restarted broker serving the same directory):
		// removing and adding it again would leave the container without
		// its socket for a moment.
		return nil
	}
	if err := b.DetachSocket(ctx, name, kind); err != nil {
		return err
	}
	return b.retryConfig(ctx, add...)
}

// DetachSocket implements backend.Backend.
func (b *Backend) DetachSocket(ctx context.Context, name string, kind backend.SocketKind) error {
	if !kind.Valid() {
		return fmt.Errorf("detach socket: unknown kind %v", kind)
	}
	return b.DetachMount(ctx, name, kind.DeviceName())
}

// DetachMount implements backend.Backend: the disk device mount goes.
func (b *Backend) DetachMount(ctx context.Context, name, mount string) error {
	if backend.IsHostMountDevice(mount) {
		return b.detachHostMount(ctx, name, mount)
	}
	if managed, _ := b.lastSeen(name); !managed {
		if _, err := b.raw(ctx, name); err != nil {
			return err
		}
	}
	err := b.retryConfig(ctx, "config", "device", "remove", name, mount)
	if errors.Is(err, errNoDevice) {
		return nil
	}
	return err
}

// List implements backend.Backend: the containers this backend made.
func (b *Backend) List(ctx context.Context) ([]backend.Instance, error) {
	var all []rawInstance
	if err := b.query(ctx, "/1.0/instances?recursion=1", &all); err != nil {
		return nil, err
	}
	var out []backend.Instance
	managed, agentsOK := map[string]bool{}, map[string]bool{}
	for _, in := range all {
		if in.Config[managedKey] == "true" {
			out = append(out, in.instance())
			managed[in.Name] = in.Status == "Running"
			if b.agentsMatch(in) {
				agentsOK[in.Name] = true
			}
		}
	}
	b.mu.Lock()
	b.managed = managed
	b.agentsOK = agentsOK
	for name := range b.inits {
		if !managed[name] {
			delete(b.inits, name)
		}
	}
	b.mu.Unlock()
	for i := range out {
		if !out[i].Running {
			continue
		}
		// What root inside may have covered. A container that stopped
		// meanwhile has nothing covered; one that cannot be looked at now
		// is looked at again next round (and Exec looks for itself).
		covered, err := b.covered(ctx, out[i].Name, attached(out[i].SocketDir, out[i].ModelDir), true)
		if errors.Is(err, ErrDaemonDown) {
			return nil, err
		}
		out[i].Covered = covered
	}
	return out, nil
}

// rawInstance is the part of /1.0/instances/NAME this backend reads.
type rawInstance struct {
	Name     string                       `json:"name"`
	Status   string                       `json:"status"`
	Config   map[string]string            `json:"config"`
	Devices  map[string]map[string]string `json:"devices"`
	Profiles []string                     `json:"profiles"`
	// ExpandedDevices are Devices with the profiles' (a sandbox made
	// before sandboxes had no profile: its root disk may be one).
	ExpandedDevices map[string]map[string]string `json:"expanded_devices"`
}

func (r rawInstance) instance() backend.Instance {
	in := backend.Instance{Name: r.Name, UUID: r.Config[uuidKey], Running: r.Status == "Running",
		SocketDir: r.Devices[backend.SocketDeviceName]["source"], ModelDir: r.Devices[backend.ModelDeviceName]["source"]}
	for _, dev := range slices.Sorted(maps.Keys(r.Devices)) {
		// Every disk device with a host path (a pool's volume has none).
		if d := r.Devices[dev]; d["type"] == "disk" && d["source"] != "" && d["pool"] == "" {
			in.Mounts = append(in.Mounts, backend.Mount{Name: dev, Source: d["source"]})
		}
	}
	return in
}

// raw reads one of this backend's containers; ErrNotFound for an unknown
// name or a container jailbee did not make.
func (b *Backend) raw(ctx context.Context, name string) (rawInstance, error) {
	if backend.ValidateName(name) != nil {
		return rawInstance{}, fmt.Errorf("%w: %q", backend.ErrNotFound, name)
	}
	var in rawInstance
	if err := b.query(ctx, "/1.0/instances/"+url.PathEscape(name), &in); err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			b.forget(name)
		}
		return rawInstance{}, err
	}
	if in.Config[managedKey] != "true" {
		b.forget(name)
		return rawInstance{}, fmt.Errorf("%w: %s (not a jailbee sandbox)", backend.ErrNotFound, name)
	}
	b.seen(name, in.Status == "Running")
	b.setAgentsCurrent(name, b.agentsMatch(in))
	return in, nil
}

func (b *Backend) instance(ctx context.Context, name string) (backend.Instance, error) {
	in, err := b.raw(ctx, name)
	if err != nil {
		return backend.Instance{}, err
	}
	return in.instance(), nil
}

// run runs incus with args (in the backend's project), stdin closed unless
// given, and returns its stdout. Errors carry incus's message; "not found"
// maps to backend.ErrNotFound.
func (b *Backend) run(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	return b.incus(ctx, stdin, b.inProject(args...)...)
}

// inProject puts an incus command in the backend's project.
func (b *Backend) inProject(args ...string) []string {
	if b.opts.Project == "" {
		return args
	}
	return append([]string{"--project", b.opts.Project}, args...)
}

// runInside is run for the backend's own commands inside a container
// (`incus exec`): what they print is the container's to choose (root
// inside can put a program of its own first on their PATH, or race the
// client's check), so at most maxInsideOutput of it is read.
func (b *Backend) runInside(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	return b.incusMax(ctx, stdin, maxInsideOutput, b.inProject(args...)...)
}

// maxInsideOutput bounds the stdout of the backend's own commands inside
// a container (a stashed spec's path is the longest); maxStderr bounds
// what is kept of any incus command's stderr (its error message).
const (
	maxInsideOutput = 64 << 10
	maxStderr       = 64 << 10
)

// incus runs the incus client with args as they are (`incus query`
// refuses --project: its paths name the project) and returns its stdout.
func (b *Backend) incus(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	return b.incusMax(ctx, stdin, -1, args...)
}

// incusMax is incus reading at most max bytes of stdout (-1: all); a
// client that prints more is ended. Of stderr, maxStderr is kept and the
// rest read and dropped.
func (b *Backend) incusMax(ctx context.Context, stdin []byte, max int, args ...string) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.opts.Incus, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	stdout := &untrusted.Buffer{Max: max, OnOverflow: cancel}
	stderr := &untrusted.Buffer{Max: maxStderr}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.Env = incusEnv()
	err := cmd.Run()
	if stdout.Truncated() {
		return nil, fmt.Errorf("%w (%d bytes)", errPrintedTooMuch, max)
	}
	if err != nil {
		return nil, incusError(err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// errPrintedTooMuch: an incus command printed more than incusMax reads.
var errPrintedTooMuch = errors.New("incus: the command printed more than it may")

// projectPath is an API path in the backend's project.
func (b *Backend) projectPath(path string) string {
	if b.opts.Project == "" {
		return path
	}
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return path + sep + "project=" + url.QueryEscape(b.opts.Project)
}

// query GETs path from the Incus REST API into out.
func (b *Backend) query(ctx context.Context, path string, out any) error {
	data, err := b.incus(ctx, nil, "query", b.projectPath(path))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("incus query %s: %w", path, err)
	}
	return nil
}

// retryConfig runs a config change, again on an ETag race.
func (b *Backend) retryConfig(ctx context.Context, args ...string) error {
	var err error
	for attempt := 1; attempt <= etagAttempts; attempt++ {
		if _, err = b.run(ctx, nil, args...); err == nil || !isETagRace(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * etagBackoff):
		}
	}
	return err
}

func isETagRace(err error) bool {
	s := err.Error()
	return strings.Contains(s, "ETag") || strings.Contains(s, "Precondition Failed")
}

// incusError turns a failed incus command into an error; a message saying
// an object was not found wraps backend.ErrNotFound.
func incusError(err error, stderr string) error {
	msg := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(stderr), "Error: "))
	if msg == "" {
		msg = err.Error()
	}
	if len(msg) > 400 {
		msg = msg[:400] + "..."
	}
	// For a command inside, stderr is the container's to write, and the
	// error reaches the host's terminal.
	msg = untrusted.Printable(msg)
	lower := strings.ToLower(msg)
	switch {
	case strings.Contains(lower, "unix.socket") && (strings.Contains(lower, "connection refused") ||
		strings.Contains(lower, "no such file") || strings.Contains(lower, "doesn't appear to be started")):
		return ErrDaemonDown
	case strings.Contains(lower, "instance is not running"):
		return fmt.Errorf("%w: %s", backend.ErrNotRunning, msg)
	case strings.Contains(lower, "already running"):
		return fmt.Errorf("%w: %s", errAlreadyRunning, msg)
	case strings.Contains(lower, "device doesn't exist"):
		return fmt.Errorf("%w: %s", errNoDevice, msg)
	case strings.Contains(lower, "unique constraint failed: instances"):
		return fmt.Errorf("%w: %s", backend.ErrExists, msg)
	case strings.Contains(lower, "not found"):
		return fmt.Errorf("%w: %s", backend.ErrNotFound, msg)
	case strings.Contains(lower, "already exists"):
		return fmt.Errorf("%w: %s", backend.ErrExists, msg)
	}
	return errors.New("incus: " + msg)
}

// incusEnv is the environment of the incus client: the broker's own
// environment minus anything that could redirect it, plus what it needs.
func incusEnv() []string {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	for _, k := range []string{"HOME", "INCUS_DIR", "INCUS_CONF", "INCUS_SOCKET"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}
