// Package local is the embedded sandbox backend: a sandbox is a directory
// holding its checkout and home, and a running sandbox is one unit: a
// bubblewrap process tree (new user, pid, mount, ipc, uts, net and cgroup
// namespaces, no nested user namespaces, read-only system and /proc/sys)
// whose pid 1 is a supervisor (package unit) that outlives the broker and
// runs every command of the sandbox. It runs as an unprivileged host uid,
// in cgroups that bound its tasks, memory and CPU share.
package local

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"agentbox/internal/backend"
	"agentbox/internal/cgroup"
	"agentbox/internal/secfs"
	"agentbox/internal/serial"
)

// Type names this backend.
const Type = "local"

var _ backend.Backend = (*Backend)(nil)

// Paths a sandboxed command sees.
const (
	WorkspacePath = backend.WorkspacePath // the checkout, writable; default working dir
	HomePath      = "/home/agent"         // the agent's persistent home, writable
	ClientBinDir  = "/run/jailbee/bin"    // first on PATH; holds the client
	ClientName    = "jailbee"             // the client's name on PATH
	AgentUser     = "agent"               // login name of backend.AgentUID
)

// SocketFile is the broker socket's name in an attached directory.
const SocketFile = "broker.sock"

// Layout of one sandbox directory under Root.
const (
	metaFile    = "meta.json"      // sandbox state, written atomically
	checkoutDir = "checkout"       // bound at WorkspacePath, owned by the sandbox's uid
	homeDir     = "home"           // bound at HomePath, owned by the sandbox's uid
	etcDir      = "etc"            // generated /etc files, bound read-only
	controlSock = "control.sock"   // the supervisor's control socket (owner only)
	unitLog     = "supervisor.log" // stderr of the launcher, bubblewrap and supervisor
)

// trashDir, under Root, holds destroyed sandboxes' directories while they
// are emptied (no sandbox name starts with a dot). What a crash left
// there is emptied when the backend opens.
const trashDir = ".trash"

// Options configures a local backend.
type Options struct {
	// Root is the directory holding one subdirectory per sandbox
	// (the broker passes <state>/sandboxes). Created 0700 if missing.
	Root string
	// Binary is the jailbee executable (static): the launcher on the host,
	// the supervisor and the client inside. The broker passes its own.
	Binary string
	// NoLimits runs sandboxes without cgroups: limits are not set and
	// Create's Limits are ignored. Without it, New fails where per-sandbox
	// limits cannot be set.
	NoLimits bool
	// AgentBinaries are host files bound read-only into every sandbox on
	// its PATH, by the name they run as (e.g. "claude" -> <state>/agents/claude/2.1.332/bin/claude).
	AgentBinaries map[string]string
}

// Backend runs sandboxes as directories and bubblewrap units.
type Backend struct {
	root   string
	binary string
	bwrap  string
	agents map[string]string // name on PATH -> absolute host path
	cg     *cgroup.Hierarchy // nil with NoLimits
	// asRoot: the broker runs as root, so each sandbox runs as its own
	// unprivileged host uid, and the launcher stages its directories.
	asRoot bool

	mu    sync.Mutex
	locks map[string]*sync.Mutex // one lifecycle operation at a time per sandbox
}

// New opens (creating if needed) a local backend rooted at opts.Root.
func New(opts Options) (*Backend, error) {
	if opts.Root == "" {
		return nil, errors.New("local backend: no root directory")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, err
	}
	b := &Backend{root: root, asRoot: os.Geteuid() == 0, locks: map[string]*sync.Mutex{}}
	if b.bwrap, err = exec.LookPath("bwrap"); err != nil {
		return nil, errors.New("bubblewrap (bwrap) not found on PATH: install bubblewrap (apt-get install bubblewrap)")
	}
	if b.bwrap, err = filepath.Abs(b.bwrap); err != nil {
		return nil, err
	}
	if opts.Binary == "" {
		return nil, errors.New("local backend: no jailbee binary")
	}
	if b.binary, err = filepath.Abs(opts.Binary); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(b.binary); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("jailbee binary %s is not a regular file", b.binary)
	}
	b.agents = map[string]string{}
	for name, p := range opts.AgentBinaries {
		if err := backend.ValidateAgentName(name); err != nil {
			return nil, fmt.Errorf("local backend: %w", err)
		}
		if b.agents[name], err = filepath.Abs(p); err != nil {
			return nil, err
		}
	}
	if !opts.NoLimits {
		h, err := cgroup.Detect()
		if err == nil {
			err = h.Usable()
		}
		if err != nil {
			return nil, fmt.Errorf("cannot set per-sandbox limits: %v (run the broker as root, or on a cgroup v2 host give it a delegated subtree, or start it with --no-limits to run sandboxes without limits)", err)
		}
		b.cg = h
	}
	if err := secfs.EnsurePrivateDir(root); err != nil {
		return nil, fmt.Errorf("local backend root: %w", err)
	}
	if err := b.emptyTrash(); err != nil {
		return nil, fmt.Errorf("local backend root: empty %s: %w", trashDir, err)
	}
	return b, nil
}

// emptyTrash removes what destroys left half removed (a crash).
func (b *Backend) emptyTrash() error {
	trash := filepath.Join(b.root, trashDir)
	entries, err := os.ReadDir(trash)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := secfs.RemoveTree(filepath.Join(trash, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// Type returns "local".
func (b *Backend) Type() string { return Type }

// dir is the host directory of a sandbox; name must be valid.
func (b *Backend) dir(name string) string { return filepath.Join(b.root, name) }

// lock serializes Create, Start, Stop and Destroy of one sandbox.
func (b *Backend) lock(name string) func() {
	b.mu.Lock()
	l := b.locks[name]
	if l == nil {
		l = &sync.Mutex{}
		b.locks[name] = l
	}
	b.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// hostIDs are the host uid and gid of a new sandbox.
func (b *Backend) hostIDs(requested int) (int, int, error) {
	if !b.asRoot {
		if requested != 0 && requested != os.Getuid() {
			return 0, 0, fmt.Errorf("%w: a broker that is not root runs sandboxes as its own uid", backend.ErrUnsupported)
		}
		return os.Getuid(), os.Getgid(), nil
	}
	if requested <= 0 || requested == os.Getuid() {
		return 0, 0, errors.New("create: a root broker needs an unprivileged host uid for the sandbox")
	}
	return requested, requested, nil
}

// Create makes a stopped sandbox with an empty checkout and home owned by
// its host uid, and a fresh uuid.
func (b *Backend) Create(ctx context.Context, opts backend.CreateOptions) (backend.Instance, error) {
	name := opts.Name
	if err := backend.ValidateName(name); err != nil {
		return backend.Instance{}, err
	}
	uid, gid, err := b.hostIDs(opts.HostUID)
	if err != nil {
		return backend.Instance{}, err
	}
	defer b.lock(name)()
	dir := b.dir(name)
	if err := b.claim(name); err != nil {
		return backend.Instance{}, err
	}
	m := meta{UID: uid, GID: gid}
	if b.cg != nil {
		m.Limits = opts.Limits
	}
	if m.UUID, err = backend.NewUUID(); err == nil {
		err = populate(dir, name, m)
	}
	if err != nil {
		// meta.json is written last, so a failure leaves no sandbox behind.
		secfs.RemoveTree(dir)
		return backend.Instance{}, fmt.Errorf("create %s: %w", name, err)
	}
	return backend.Instance{Name: name, UUID: m.UUID}, nil
}

// claim makes the sandbox directory, which must not exist, except as the
// leftover of a Create a crash interrupted (a directory without metadata).
func (b *Backend) claim(name string) error {
	dir := b.dir(name)
	if _, err := loadSandbox(dir); err == nil {
		return fmt.Errorf("%w: %s", backend.ErrExists, name)
	} else if errors.Is(err, errIncomplete) {
		if err := secfs.RemoveTree(dir); err != nil {
			return err
		}
	} else if !errors.Is(err, backend.ErrNotFound) {
		return err
	}
	if err := secfs.MkdirFresh(dir); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %s", backend.ErrExists, name)
		}
		return err
	}
	return nil
}

// populate fills a claimed sandbox directory; the metadata file comes last.
func populate(dir, name string, m meta) error {
	for _, d := range []string{checkoutDir, homeDir} {
		if err := secfs.MkdirOwned(filepath.Join(dir, d), m.UID, m.GID); err != nil {
			return err
		}
	}
	if err := writeEtc(filepath.Join(dir, etcDir), name); err != nil {
		return err
	}
	return saveMeta(dir, m)
}

// Destroy stops the sandbox, moves its directory out of the backend's
// view (into trashDir) and removes it there by handles: nothing the
// sandbox put there (symlinks, read-only trees) can redirect it. The
// sandbox made that tree, as many entries as it liked, so it is emptied
// outside the broker's turn (serial.Outside) and without the sandbox's
// lock: other requests go on meanwhile, and its name is free.
func (b *Backend) Destroy(ctx context.Context, name string) error {
	trash, err := b.takeOut(ctx, name)
	if err != nil {
		return err
	}
	serial.Outside(ctx, func() { err = secfs.RemoveTree(trash) })
	if err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}

// takeOut stops the sandbox and moves its directory into trashDir,
// returning where it went.
func (b *Backend) takeOut(ctx context.Context, name string) (string, error) {
	dir, m, unlock, err := b.lockLoad(name)
	defer unlock()
	if errors.Is(err, errIncomplete) {
		return b.toTrash(dir) // an interrupted Create
	}
	if err != nil {
		return "", err
	}
	if err := b.stopUnit(ctx, dir, m); err != nil {
		return "", err
	}
	// The sandbox disappears for List and Exec first, so a failure halfway
	// never leaves a half-removed sandbox that looks whole.
	if err := os.Remove(filepath.Join(dir, metaFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	return b.toTrash(dir)
}

// toTrash moves dir into trashDir under a name of its own.
func (b *Backend) toTrash(dir string) (string, error) {
	trash := filepath.Join(b.root, trashDir)
	if err := secfs.EnsurePrivateDir(trash); err != nil {
		return "", err
	}
	to := filepath.Join(trash, filepath.Base(dir)+"."+rand.Text())
	if err := os.Rename(dir, to); err != nil {
		return "", err
	}
	return to, nil
}

// AttachSocket records dir as the sandbox's directory of kind, owned by
// the sandbox's uid (with its socket, when there) so its agent can
// connect. A running sandbox keeps the directories it started with; dir
// is bound from its next start.
func (b *Backend) AttachSocket(ctx context.Context, name string, kind backend.SocketKind, dir string) error {
	if !kind.Valid() {
		return fmt.Errorf("attach socket: unknown kind %v", kind)
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("attach %s socket: %q is not an absolute path", kind, dir)
	}
	m, err := b.load(name)
	if err != nil {
		return err
	}
	if err := secfs.ChownNoFollow(dir, m.UID, m.GID); err != nil {
		return fmt.Errorf("attach %s socket: %w", kind, err)
	}
	socks, err := backend.SocketsIn(dir)
	if err != nil {
		return fmt.Errorf("attach %s socket: %w", kind, err)
	}
	for _, sock := range socks {
		if err := secfs.ChownNoFollow(sock, m.UID, m.GID); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("attach %s socket: %w", kind, err)
		}
	}
	return b.update(name, func(m *meta) { *m.dirOf(kind) = filepath.Clean(dir) })
}

// DetachSocket forgets the directory of kind from the next start on.
func (b *Backend) DetachSocket(ctx context.Context, name string, kind backend.SocketKind) error {
	if !kind.Valid() {
		return fmt.Errorf("detach socket: unknown kind %v", kind)
	}
	return b.update(name, func(m *meta) { *m.dirOf(kind) = "" })
}

// List returns every complete sandbox under Root, sorted by name.
func (b *Backend) List(ctx context.Context) ([]backend.Instance, error) {
	entries, err := os.ReadDir(b.root)
	if err != nil {
		return nil, err
	}
	var out []backend.Instance
	for _, e := range entries {
		if !e.IsDir() || backend.ValidateName(e.Name()) != nil {
			continue
		}
		m, err := loadSandbox(b.dir(e.Name()))
		if errors.Is(err, backend.ErrNotFound) {
			continue // being created, or a crashed create
		}
		if err != nil {
			return nil, err
		}
		in := backend.Instance{Name: e.Name(), UUID: m.UUID, Running: m.running(), SocketDir: m.SocketDir, ModelDir: m.ModelDir}
		for _, kind := range socketKinds {
			if dir := *m.dirOf(kind); dir != "" {
				in.Mounts = append(in.Mounts, backend.Mount{Name: kind.DeviceName(), Source: dir})
			}
		}
		out = append(out, in)
	}
	return out, nil
}

// update applies change to the sandbox's metadata and saves it durably.
func (b *Backend) update(name string, change func(*meta)) error {
	dir, m, unlock, err := b.lockLoad(name)
	defer unlock()
	if err != nil {
		return err
	}
	before := m
	change(&m)
	if m == before {
		return nil
	}
	return saveMeta(dir, m)
}

// lockLoad takes the sandbox's lifecycle lock and reads its metadata. The
// caller defers unlock whatever the error (a no-op when the name is
// invalid and no lock was taken).
func (b *Backend) lockLoad(name string) (dir string, m meta, unlock func(), err error) {
	if err := backend.ValidateName(name); err != nil {
		return "", meta{}, func() {}, err
	}
	unlock = b.lock(name)
	dir = b.dir(name)
	m, err = loadSandbox(dir)
	return dir, m, unlock, err
}

// load reads a sandbox's metadata by name.
func (b *Backend) load(name string) (meta, error) {
	if err := backend.ValidateName(name); err != nil {
		return meta{}, err
	}
	return loadSandbox(b.dir(name))
}

// loadSandbox reads the metadata of the sandbox directory dir. It returns
// backend.ErrNotFound for a missing sandbox and errIncomplete for a
// directory Create has not finished.
func loadSandbox(dir string) (meta, error) {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return meta{}, fmt.Errorf("%w: %s", backend.ErrNotFound, filepath.Base(dir))
	}
	if err != nil {
		return meta{}, err
	}
	if !fi.IsDir() {
		return meta{}, fmt.Errorf("sandbox %s: %w: not a real directory", filepath.Base(dir), secfs.ErrUnsafe)
	}
	return loadMeta(dir)
}

// socketKinds are the directories a local sandbox may have attached, in
// the order List reports them.
var socketKinds = []backend.SocketKind{backend.OrchestrationSocket, backend.ModelSocket}

// DetachMount implements backend.Backend: a local sandbox's attachments
// are its socket directories and its named host mounts.
func (b *Backend) DetachMount(ctx context.Context, name, mount string) error {
	if backend.IsHostMountDevice(mount) {
		return b.detachHostMount(ctx, name, mount)
	}
	for _, kind := range socketKinds {
		if mount == kind.DeviceName() {
			return b.DetachSocket(ctx, name, kind)
		}
	}
	return nil
}

// Restore implements backend.Backend: nothing inside a local sandbox can
// cover what its unit binds (its processes have no mount rights in the
// unit's namespace), so there is nothing to put back.
func (b *Backend) Restore(ctx context.Context, name string) error { return nil }
