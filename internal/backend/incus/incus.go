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
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"agentbox/internal/backend"

	"golang.org/x/sys/unix"
)

// ErrDaemonDown: incusd does not answer.
var ErrDaemonDown = errors.New("incusd does not answer: is it running? (docs/incus.md says how to start it)")

// Type names this backend.
const Type = "incus"

var _ backend.Backend = (*Backend)(nil)

// Paths and names inside a sandbox.
const (
	WorkspacePath = backend.WorkspacePath    // the checkout, owned by the agent
	HomePath      = "/home/agent"            // the agent's home
	AgentUser     = "agent"                  // login name of AgentUID
	AgentUID      = backend.AgentUID         // the agent user's uid and gid
	ClientPath    = "/usr/local/bin/jailbee" // the jailbee client, a read-only disk device
	clientDevice  = "jailbee-client"
	socketFile    = "broker.sock" // the broker's socket in an attached directory
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
	// Incus is the incus command (default "incus" on PATH).
	Incus string
}

// Backend is the Incus backend.
type Backend struct {
	opts Options
}

// New checks that incus answers and returns the backend.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if opts.Image == "" {
		opts.Image = DefaultImage
	}
	if opts.Incus == "" {
		opts.Incus = "incus"
	}
	if _, err := exec.LookPath(opts.Incus); err != nil {
		return nil, errors.New("incus not found on PATH: install Incus (see docs/incus.md)")
	}
	b := &Backend{opts: opts}
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

// Create implements backend.Backend: `incus init` from the image, labelled
// as jailbee's, with its limits and the client device.
func (b *Backend) Create(ctx context.Context, opts backend.CreateOptions) (backend.Instance, error) {
	if err := backend.ValidateName(opts.Name); err != nil {
		return backend.Instance{}, err
	}
	// incus init's own refusal of a taken name does not say so plainly.
	if _, err := b.instance(ctx, opts.Name); err == nil {
		return backend.Instance{}, fmt.Errorf("%w: %s", backend.ErrExists, opts.Name)
	} else if !errors.Is(err, backend.ErrNotFound) {
		return backend.Instance{}, err
	}
	// security.guestapi=false: the guest API (/dev/incus) would show the container its
	// user.* keys, host paths among them.
	args := []string{"init", b.opts.Image, opts.Name, "-c", managedKey + "=true", "-c", "security.guestapi=false"}
	if b.opts.Pool != "" {
		args = append(args, "--storage", b.opts.Pool)
	}
	labels, err := labelConfig(opts.Labels)
	if err != nil {
		return backend.Instance{}, fmt.Errorf("create sandbox %s: %w", opts.Name, err)
	}
	for _, kv := range labels {
		args = append(args, "-c", kv)
	}
	if !b.opts.NoLimits {
		for _, kv := range limitConfig(opts.Limits) {
			args = append(args, "-c", kv)
		}
	}
	if _, err := b.run(ctx, nil, args...); err != nil {
		if !b.HasImage(ctx) {
			return backend.Instance{}, fmt.Errorf("no image %q in Incus: run 'jailbee image build' once", b.opts.Image)
		}
		return backend.Instance{}, fmt.Errorf("create sandbox %s: %w", opts.Name, err)
	}
	if b.opts.Client != "" {
		if err := b.retryConfig(ctx, "config", "device", "add", opts.Name, clientDevice, "disk",
			"source="+b.opts.Client, "path="+ClientPath, "readonly=true"); err != nil {
			b.run(context.WithoutCancel(ctx), nil, "delete", "--force", opts.Name)
			return backend.Instance{}, fmt.Errorf("add the client to %s: %w", opts.Name, err)
		}
	}
	in, err := b.instance(ctx, opts.Name)
	if err != nil {
		return backend.Instance{}, err
	}
	return in, nil
}

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
// 100%).
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

// Start implements backend.Backend.
func (b *Backend) Start(ctx context.Context, name string) error {
	in, err := b.instance(ctx, name)
	if err != nil {
		return err
	}
	if in.Running {
		return nil
	}
	if _, err := b.run(ctx, nil, "start", name); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	return nil
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
	return nil
}

// Destroy implements backend.Backend.
func (b *Backend) Destroy(ctx context.Context, name string) error {
	if _, err := b.instance(ctx, name); err != nil {
		return err
	}
	if _, err := b.run(ctx, nil, "delete", "--force", name); err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return nil
		}
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// AttachSocket implements backend.Backend: the directory becomes the
// read-only, shifted disk device SocketDeviceName at SocketMountPath (so
// the agent user inside can connect through the idmap), replacing an
// earlier one. A running container gets it at once.
func (b *Backend) AttachSocket(ctx context.Context, name, dir string) error {
	if err := b.DetachSocket(ctx, name); err != nil {
		return err
	}
	// shift=true shows host uids as they are: the directory and socket
	// must belong to the agent's uid to be reachable inside. Their host
	// parent (the broker's state dir, 0700) keeps any host account of
	// that uid out.
	for _, p := range []string{dir, filepath.Join(dir, socketFile)} {
		if err := unix.Fchownat(unix.AT_FDCWD, p, AgentUID, AgentUID, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("attach the socket to %s: %w", name, err)
		}
	}
	return b.retryConfig(ctx, "config", "device", "add", name, backend.SocketDeviceName, "disk",
		"source="+dir, "path="+backend.SocketMountPath, "readonly=true", "shift=true")
}

// DetachSocket implements backend.Backend.
func (b *Backend) DetachSocket(ctx context.Context, name string) error {
	in, err := b.raw(ctx, name)
	if err != nil {
		return err
	}
	if _, ok := in.Devices[backend.SocketDeviceName]; !ok {
		return nil
	}
	return b.retryConfig(ctx, "config", "device", "remove", name, backend.SocketDeviceName)
}

// List implements backend.Backend: the containers this backend made.
func (b *Backend) List(ctx context.Context) ([]backend.Instance, error) {
	var all []rawInstance
	if err := b.query(ctx, "/1.0/instances?recursion=1", &all); err != nil {
		return nil, err
	}
	var out []backend.Instance
	for _, in := range all {
		if in.Config[managedKey] == "true" {
			out = append(out, in.instance())
		}
	}
	return out, nil
}

// rawInstance is the part of /1.0/instances/NAME this backend reads.
type rawInstance struct {
	Name    string                       `json:"name"`
	Status  string                       `json:"status"`
	Config  map[string]string            `json:"config"`
	Devices map[string]map[string]string `json:"devices"`
}

func (r rawInstance) instance() backend.Instance {
	return backend.Instance{Name: r.Name, UUID: r.Config[uuidKey], Running: r.Status == "Running",
		SocketDir: r.Devices[backend.SocketDeviceName]["source"]}
}

// raw reads one of this backend's containers; ErrNotFound for an unknown
// name or a container jailbee did not make.
func (b *Backend) raw(ctx context.Context, name string) (rawInstance, error) {
	if backend.ValidateName(name) != nil {
		return rawInstance{}, fmt.Errorf("%w: %q", backend.ErrNotFound, name)
	}
	var in rawInstance
	if err := b.query(ctx, "/1.0/instances/"+url.PathEscape(name), &in); err != nil {
		return rawInstance{}, err
	}
	if in.Config[managedKey] != "true" {
		return rawInstance{}, fmt.Errorf("%w: %s (not a jailbee sandbox)", backend.ErrNotFound, name)
	}
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
	if b.opts.Project != "" {
		args = append([]string{"--project", b.opts.Project}, args...)
	}
	cmd := exec.CommandContext(ctx, b.opts.Incus, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = incusEnv()
	if err := cmd.Run(); err != nil {
		return nil, incusError(err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// query GETs path from the Incus REST API into out.
func (b *Backend) query(ctx context.Context, path string, out any) error {
	if b.opts.Project != "" {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		path += sep + "project=" + url.QueryEscape(b.opts.Project)
	}
	cmd := exec.CommandContext(ctx, b.opts.Incus, "query", path)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = incusEnv()
	if err := cmd.Run(); err != nil {
		return incusError(err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
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
	lower := strings.ToLower(msg)
	switch {
	case strings.Contains(lower, "unix.socket") && (strings.Contains(lower, "connection refused") ||
		strings.Contains(lower, "no such file") || strings.Contains(lower, "doesn't appear to be started")):
		return ErrDaemonDown
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
