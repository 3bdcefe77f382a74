// Package backend defines the one way the broker touches a sandbox.
// The interface is written for Incus system containers first; the local
// (bubblewrap) backend follows it.
//
// A running sandbox is one unit: every process in it (agents, services,
// git, commands from `jb exec`) runs inside it, Stop ends all of them
// whoever started them, and the unit outlives the broker process that
// started it. Nothing on the host reads what a sandbox controls: git on a
// sandbox's checkout runs inside the sandbox through Exec (see gitx).
package backend

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	"agentbox/internal/grant"
)

// SocketMountPath is where a sandbox sees its broker-socket directory.
const SocketMountPath = "/run/jailbee/orchestration"

// SocketDeviceName is the Incus disk device that carries the socket dir.
const SocketDeviceName = "jailbee-orchestration"

// ModelMountPath is where a sandbox sees its model-socket directory (the
// broker serves the model API on anthropic.sock there).
const ModelMountPath = "/run/jailbee/model"

// ModelDeviceName is the Incus disk device that carries the model dir.
const ModelDeviceName = "jailbee-model"

// EgressSocketName is the broker's egress proxy socket in the model
// directory (ModelMountPath); EgressPort is the loopback TCP port inside
// the sandbox that relays to it (docs/egress.md).
const (
	EgressSocketName = "egress.sock"
	EgressPort       = 3128
)

// ProxyEnv is the proxy environment of every process in a sandbox: its
// only way out is the egress relay on loopback. git, npm and curl honour
// these variables; local names stay direct.
func ProxyEnv() map[string]string {
	proxy := fmt.Sprintf("http://127.0.0.1:%d", EgressPort)
	noProxy := "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTPS_PROXY": proxy, "https_proxy": proxy,
		"HTTP_PROXY": proxy, "http_proxy": proxy,
		"NO_PROXY": noProxy, "no_proxy": noProxy,
	}
}

// SocketKind names one of the host directories the broker serves a
// sandbox through.
type SocketKind int

const (
	OrchestrationSocket SocketKind = iota // SocketMountPath, SocketDeviceName
	ModelSocket                           // ModelMountPath, ModelDeviceName
)

// MountPath is where the sandbox sees a directory of kind k.
func (k SocketKind) MountPath() string {
	if k == ModelSocket {
		return ModelMountPath
	}
	return SocketMountPath
}

// DeviceName is the attachment (Incus disk device) of kind k.
func (k SocketKind) DeviceName() string {
	if k == ModelSocket {
		return ModelDeviceName
	}
	return SocketDeviceName
}

// String is "orchestration" or "model".
func (k SocketKind) String() string {
	switch k {
	case OrchestrationSocket:
		return "orchestration"
	case ModelSocket:
		return "model"
	}
	return fmt.Sprintf("SocketKind(%d)", int(k))
}

// SocketFile is the socket the broker serves in a directory of kind k.
func (k SocketKind) SocketFile() string {
	if k == ModelSocket {
		return "anthropic.sock"
	}
	return "broker.sock"
}

// Valid reports whether k is one of the kinds above.
func (k SocketKind) Valid() bool { return k == OrchestrationSocket || k == ModelSocket }

// HostMountDir is where a sandbox sees the named host directories
// attached to it (broker.yaml `mounts`): HostMountDir/NAME.
const HostMountDir = "/mnt/jailbee"

// hostMountDevicePrefix starts the attachment name of a named host mount.
const hostMountDevicePrefix = "jailbee-mount-"

// HostMount is a named host directory to attach to a running sandbox.
type HostMount struct {
	Name     string // the mount name (grant.ValidMount)
	Source   string // the host directory: absolute, clean, no symlink on the way
	ReadOnly bool
}

// Path is where the sandbox sees the mount.
func (m HostMount) Path() string { return HostMountDir + "/" + m.Name }

// maxDeviceName bounds an attachment's name (Incus refuses a disk device
// whose name is longer).
const maxDeviceName = 63

// Device is the mount's attachment (Incus: the disk device), which
// DetachMount takes: jailbee-mount-NAME, or for a name too long for that,
// its start and a hash of it (always 63 long, so never a short one's).
func (m HostMount) Device() string {
	if len(hostMountDevicePrefix)+len(m.Name) < maxDeviceName {
		return hostMountDevicePrefix + m.Name
	}
	sum := sha256.Sum256([]byte(m.Name))
	tail := "-" + hex.EncodeToString(sum[:8])
	return hostMountDevicePrefix + m.Name[:maxDeviceName-len(hostMountDevicePrefix)-len(tail)] + tail
}

// Validate checks the name and the form of the source (not the host).
func (m HostMount) Validate() error {
	if !grant.ValidMount(m.Name) {
		return fmt.Errorf("attach mount: invalid mount name %q", m.Name)
	}
	if !path.IsAbs(m.Source) || path.Clean(m.Source) != m.Source || m.Source == "/" {
		return fmt.Errorf("attach mount %s: the host directory is not an absolute, clean path", m.Name)
	}
	return nil
}

// IsHostMountDevice reports whether the attachment device is a named
// host mount's (HostMount.Device).
func IsHostMountDevice(device string) bool {
	return strings.HasPrefix(device, hostMountDevicePrefix) && len(device) <= maxDeviceName
}

// WorkspacePath is the sandbox's checkout as its commands see it.
const WorkspacePath = "/workspace"

// AgentUID and AgentGID are the non-root ids commands and agents run as
// inside a sandbox.
const (
	AgentUID = 1000
	AgentGID = 1000
)

// Errors shared by every backend.
var (
	ErrNotFound   = errors.New("sandbox not found")
	ErrExists     = errors.New("sandbox already exists")
	ErrNotRunning = errors.New("sandbox is not running")
	// ErrUnsupported: the backend cannot do what the options ask (a user
	// it does not have, a limit it cannot set).
	ErrUnsupported = errors.New("not supported by this backend")
)

// Instance is what a backend knows of one sandbox.
type Instance struct {
	Name    string // backend instance name (unique per backend)
	UUID    string // stable instance uuid (Incus volatile.uuid)
	Running bool
	// SocketDir is the host directory attached as the sandbox's socket
	// ("" for none): the broker's rounds compare it with their records, as
	// a raw copy of a sandbox carries its original's attachment.
	SocketDir string
	// ModelDir is the host directory attached as the sandbox's model
	// socket ("" for none).
	ModelDir string
	// Mounts are every host path attached to the sandbox, the socket
	// directory (SocketDeviceName) and the model directory
	// (ModelDeviceName) among them: a copy may carry its original's socket
	// directory under another name.
	Mounts []Mount
	// Covered names what the backend placed in the running sandbox that
	// something inside now covers (a mount by root inside over the socket
	// directory, "socket", the model directory, "model", or the jailbee
	// client, "client"): Restore puts it back.
	Covered []string
}

// Mount is a host path attached to a sandbox.
type Mount struct {
	Name   string // the attachment (Incus: the disk device)
	Source string // the host path
}

// Limits bound one sandbox's resources. A zero field is not limited (only
// when the broker runs with --no-limits).
type Limits struct {
	Pids        int64 // tasks (processes and threads)
	MemoryBytes int64
	CPUWeight   int // relative, 1..10000 (cgroup v2 scale)
	// DiskBytes bounds the sandbox's root filesystem (Incus: the root
	// disk's size); a backend without one of its own (local) ignores it.
	DiskBytes int64
}

// IsZero reports whether no limit is set.
func (l Limits) IsZero() bool { return l == Limits{} }

// CreateOptions describes a new sandbox.
type CreateOptions struct {
	Name string
	// HostUID is the unprivileged host uid (and gid) the sandbox's
	// processes run as and that owns its files, from the broker's recorded
	// range when the broker runs as root; 0 means the broker's own uid.
	// Backends with their own id mapping (Incus) ignore it.
	HostUID int
	Limits  Limits
	// Labels describe the sandbox to someone looking at the backend's own
	// tools (Incus: user.jailbee.KEY config keys): role, parent, branch,
	// repo. Keys are lowercase letters and dashes. Never shown inside.
	Labels map[string]string
}

// ExecOptions describes one command inside a sandbox.
type ExecOptions struct {
	Argv []string
	// User is "" for the agent user; backends that have others accept
	// "root" or a numeric uid, the rest return ErrUnsupported.
	User string
	Env  map[string]string // added to the sandbox's base environment
	Dir  string            // "" = the checkout; a relative path is under the checkout
	// Stdin, Stdout and Stderr are the command's streams; nil is empty
	// input or discarded output. An *os.File is handed to the command as
	// it is, anything else is copied through a pipe.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// TTY: Stdin, Stdout and Stderr are one terminal (*os.File), which
	// becomes the command's controlling terminal.
	TTY bool
	// Started, if set, is called once the command runs with its own copies
	// of the streams: the caller may then close its copies of *os.File
	// streams, so the command's end of a pipe is the only one left.
	Started func()
}

// Backend creates, runs and removes sandboxes.
type Backend interface {
	// Type names the implementation ("local", "incus").
	Type() string
	// Create makes a stopped sandbox with an empty checkout owned by the
	// agent user. The caller attaches the socket, starts it and fills the
	// checkout (gitx) with commands run inside.
	Create(ctx context.Context, opts CreateOptions) (Instance, error)
	// Start starts the sandbox's unit; starting a running sandbox is a no-op.
	Start(ctx context.Context, name string) error
	// Stop ends every process of the sandbox and returns once they are
	// gone; stopping a stopped sandbox is a no-op.
	Stop(ctx context.Context, name string) error
	// Destroy stops the sandbox and removes it and everything it holds.
	// What the sandbox made (its files, as many as it liked) is removed
	// outside the turn ctx carries (serial.Outside), so other holders are
	// served meanwhile.
	Destroy(ctx context.Context, name string) error
	// Exec runs a command inside a running sandbox and returns its exit
	// status (128+n when a signal n ended it). Cancelling ctx ends it.
	Exec(ctx context.Context, name string, opts ExecOptions) (int, error)
	// AttachSocket binds the host directory dir read-only at
	// kind.MountPath(), replacing any earlier attachment of that kind; the
	// directory and every socket in it (SocketsIn) become the agent's, so
	// it can connect. A backend that cannot change a running sandbox's
	// mounts applies it at the next Start.
	AttachSocket(ctx context.Context, name string, kind SocketKind, dir string) error
	// DetachSocket removes the attachment of kind (no error if absent).
	DetachSocket(ctx context.Context, name string, kind SocketKind) error
	// AttachMount binds the host directory m.Source at m.Path() in the
	// running sandbox name, read-only when m.ReadOnly, without a restart.
	// The source is opened without following any symlink; the mount point
	// is one nothing inside can move. A name already attached is refused.
	// Local: the mount lasts until the sandbox stops; Incus: the device
	// stays across restarts until DetachMount.
	AttachMount(ctx context.Context, name string, m HostMount) error
	// DetachMount removes the attachment mount (an Instance.Mounts name,
	// or HostMount.Device()) of sandbox name; no error if absent. A named
	// host mount is gone from the sandbox's view when it returns: every
	// process of the sandbox still holding it (working directory, open
	// file, mapping) is killed, as Linux cannot take a held mount away.
	DetachMount(ctx context.Context, name, mount string) error
	// Restore puts back, on top, what the backend placed in a running
	// sandbox and something inside covers (Instance.Covered); a sandbox
	// with nothing covered is left as it is.
	Restore(ctx context.Context, name string) error
	// List returns every sandbox this backend manages, with uuids, so the
	// broker can detect copies and uuid conflicts.
	List(ctx context.Context) ([]Instance, error)
}

// SteppedStarter is a Backend whose Start ends with a step inside the
// sandbox, which the sandbox can hold up (Incus: root inside owns the
// container's init and can make the egress relay's start wait for its
// whole bound). Start is StartUnit then FinishStart; a caller that must
// not wait on the sandbox (the broker's executor) runs FinishStart out of
// its line.
type SteppedStarter interface {
	// StartUnit starts the unit, in a time the backend bounds.
	StartUnit(ctx context.Context, name string) error
	// FinishStart takes the step inside a started unit.
	FinishStart(ctx context.Context, name string) error
}

// CommandEnv is a command's whole environment: base, then the caller's
// extra variables over it, as sorted KEY=VALUE lines. Nothing of the
// broker's own environment leaks in. An extra name that is empty or holds
// '=' or NUL, or a value holding NUL, is refused.
func CommandEnv(base, extra map[string]string) ([]string, error) {
	env := maps.Clone(base)
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range extra {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("exec: invalid environment variable %q", k)
		}
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out, nil
}

// WorkDir resolves ExecOptions.Dir inside a sandbox: the checkout for "",
// a path under it when relative, the path itself when absolute.
func WorkDir(dir string) string {
	switch {
	case dir == "":
		return WorkspacePath
	case path.IsAbs(dir):
		return path.Clean(dir)
	default:
		return path.Join(WorkspacePath, dir)
	}
}

// NewUUID returns a random (version 4) UUID: a new sandbox's identity.
func NewUUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
