// Package local is the embedded sandbox backend: a sandbox is a directory
// holding its own git clone, and commands run in it under bubblewrap with
// new namespaces (user, pid, mount, ipc, uts, net, cgroup), a read-only
// system, a generated /etc and the checkout writable at /workspace.
package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"agentbox/internal/backend"
	"agentbox/internal/gitx"
	"agentbox/internal/secfs"
)

// Type names this backend.
const Type = "local"

var _ backend.Backend = (*Backend)(nil)

// Paths a sandboxed command sees.
const (
	WorkspacePath = "/workspace"       // the checkout, writable; default working dir
	HomePath      = "/home/agent"      // the agent's persistent home, writable
	ClientBinDir  = "/run/jailbee/bin" // first on PATH; holds the client
	ClientName    = "jailbee"          // the client's name on PATH
	AgentUser     = "agent"            // login name of backend.AgentUID
)

// SocketEnv is set in insecure mode, where no mount puts the socket at
// backend.SocketMountPath, to tell the client where it is.
const SocketEnv = "JAILBEE_ORCHESTRATION_SOCKET"

// SocketFile is the broker socket's name in an attached directory.
const SocketFile = "broker.sock"

// Layout of one sandbox directory under Root.
const (
	metaFile    = "meta.json" // sandbox state, written atomically
	checkoutDir = "checkout"  // the git clone, bound at WorkspacePath
	homeDir     = "home"      // bound at HomePath
	etcDir      = "etc"       // generated /etc files, bound read-only
	// insecureBinDir (under Root, not a valid sandbox name) holds the
	// client symlink that insecure mode puts first on PATH.
	insecureBinDir = ".insecure-bin"
)

// Options configures a local backend.
type Options struct {
	// Root is the directory holding one subdirectory per sandbox
	// (the broker passes <state>/sandboxes). Created 0700 if missing.
	Root string
	// ClientBinary is bound read-only as `jailbee` on the sandbox's PATH
	// (the broker passes its own executable). Empty: no client inside.
	ClientBinary string
	// Insecure runs commands directly on the host in the checkout, with no
	// namespaces at all (the broker's --insecure-no-sandbox).
	Insecure bool
}

// Backend runs sandboxes as directories and bubblewrap processes.
type Backend struct {
	root     string
	client   string // absolute path of the client binary, or ""
	insecure bool
	bwrap    string // absolute path of bwrap; "" in insecure mode

	mu       sync.Mutex
	creating map[string]bool              // names whose Create is under way
	procs    map[string]map[*process]bool // running Execs per sandbox
}

// process is one running Exec, tracked so Stop and Destroy can end it.
type process struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed when the command has been waited for
	killed bool          // ended by Stop or Destroy (guarded by Backend.mu)
}

// New opens (creating if needed) a local backend rooted at opts.Root.
// Without Insecure it needs bwrap on PATH.
func New(opts Options) (*Backend, error) {
	if opts.Root == "" {
		return nil, errors.New("local backend: no root directory")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, err
	}
	if err := secfs.EnsurePrivateDir(root); err != nil {
		return nil, fmt.Errorf("local backend root: %w", err)
	}
	b := &Backend{
		root:     root,
		insecure: opts.Insecure,
		creating: map[string]bool{},
		procs:    map[string]map[*process]bool{},
	}
	if opts.ClientBinary != "" {
		if b.client, err = filepath.Abs(opts.ClientBinary); err != nil {
			return nil, err
		}
		fi, err := os.Stat(b.client)
		if err != nil {
			return nil, fmt.Errorf("client binary: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("client binary %s is not a regular file", b.client)
		}
	}
	if opts.Insecure {
		if err := b.linkInsecureClient(); err != nil {
			return nil, err
		}
		return b, nil
	}
	if b.bwrap, err = exec.LookPath("bwrap"); err != nil {
		return nil, errors.New("bubblewrap (bwrap) not found on PATH: install bubblewrap (apt-get install bubblewrap) or run with --insecure-no-sandbox")
	}
	return b, nil
}

// Type returns "local".
func (b *Backend) Type() string { return Type }

// dir is the host directory of a sandbox; name must be valid.
func (b *Backend) dir(name string) string { return filepath.Join(b.root, name) }

// Create clones opts.Source into a new, stopped sandbox with a fresh uuid.
func (b *Backend) Create(ctx context.Context, opts backend.CreateOptions) (backend.Instance, error) {
	name := opts.Name
	if err := backend.ValidateName(name); err != nil {
		return backend.Instance{}, err
	}
	if opts.Source.Repo == "" {
		return backend.Instance{}, errors.New("create: no source repository")
	}
	if err := b.claim(name); err != nil {
		return backend.Instance{}, err
	}
	defer func() {
		b.mu.Lock()
		delete(b.creating, name)
		b.mu.Unlock()
	}()
	dir := b.dir(name)
	inst, err := b.populate(ctx, name, dir, opts.Source)
	if err != nil {
		// Nothing outside dir was created; meta.json is written last, so a
		// failure leaves no sandbox behind.
		os.RemoveAll(dir)
		return backend.Instance{}, fmt.Errorf("create %s: %w", name, err)
	}
	return inst, nil
}

// claim reserves name for a Create: it makes the sandbox directory, which
// must not exist, except as the leftover of a Create a crash interrupted
// (a directory without metadata that no Create of this process is filling).
func (b *Backend) claim(name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.creating[name] {
		return fmt.Errorf("%w: %s", backend.ErrExists, name)
	}
	dir := b.dir(name)
	if _, err := b.loadLocked(name); err == nil {
		return fmt.Errorf("%w: %s", backend.ErrExists, name)
	} else if errors.Is(err, errIncomplete) {
		if err := removeSandboxDir(dir); err != nil {
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
	b.creating[name] = true
	return nil
}

// populate fills a claimed sandbox directory; the metadata file comes last.
func (b *Backend) populate(ctx context.Context, name, dir string, src backend.GitSource) (backend.Instance, error) {
	if err := gitx.Clone(ctx, src.Repo, filepath.Join(dir, checkoutDir), src.Branch, src.Commit); err != nil {
		return backend.Instance{}, err
	}
	if err := secfs.MkdirFresh(filepath.Join(dir, homeDir)); err != nil {
		return backend.Instance{}, err
	}
	if err := writeEtc(filepath.Join(dir, etcDir), name); err != nil {
		return backend.Instance{}, err
	}
	id, err := newUUID()
	if err != nil {
		return backend.Instance{}, err
	}
	if err := saveMeta(dir, meta{UUID: id}); err != nil {
		return backend.Instance{}, err
	}
	return backend.Instance{Name: name, UUID: id}, nil
}

// Start marks the sandbox running; starting a running sandbox is a no-op.
func (b *Backend) Start(ctx context.Context, name string) error {
	return b.update(name, func(m *meta) { m.Running = true })
}

// Stop marks the sandbox stopped and ends every command Exec started in
// it, returning once they have exited (or ctx is done). Stopping a stopped
// sandbox is a no-op.
func (b *Backend) Stop(ctx context.Context, name string) error {
	b.mu.Lock()
	m, err := b.loadLocked(name)
	if err == nil && m.Running {
		m.Running = false
		err = saveMeta(b.dir(name), m)
	}
	var waits []chan struct{}
	if err == nil {
		waits = b.killLocked(name)
	}
	b.mu.Unlock()
	if err != nil {
		return err
	}
	return waitAll(ctx, waits)
}

// Destroy ends the sandbox's commands and removes its directory. A
// sandbox directory that is a symlink is refused, never followed.
func (b *Backend) Destroy(ctx context.Context, name string) error {
	if err := backend.ValidateName(name); err != nil {
		return err
	}
	b.mu.Lock()
	if b.creating[name] {
		b.mu.Unlock()
		return fmt.Errorf("destroy %s: a create is in progress", name)
	}
	dir := b.dir(name)
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		b.mu.Unlock()
		return fmt.Errorf("%w: %s", backend.ErrNotFound, name)
	}
	if err == nil && !fi.IsDir() { // a symlink is not IsDir under Lstat
		err = fmt.Errorf("destroy %s: %w: not a real directory", name, secfs.ErrUnsafe)
	}
	if err != nil {
		b.mu.Unlock()
		return err
	}
	// The sandbox disappears for List and Exec before it is emptied, so a
	// failure halfway never leaves a half-removed sandbox that looks whole.
	err = os.Remove(filepath.Join(dir, metaFile))
	waits := b.killLocked(name)
	b.mu.Unlock()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := waitAll(ctx, waits); err != nil {
		return err
	}
	return removeSandboxDir(dir)
}

// killLocked kills every command running in the sandbox and returns
// channels closed when each has been waited for.
func (b *Backend) killLocked(name string) []chan struct{} {
	var waits []chan struct{}
	for p := range b.procs[name] {
		p.killed = true
		p.kill()
		waits = append(waits, p.done)
	}
	return waits
}

func waitAll(ctx context.Context, waits []chan struct{}) error {
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// AttachSocket records dir as the sandbox's socket directory: Execs that
// start from now on see it read-only at backend.SocketMountPath.
func (b *Backend) AttachSocket(ctx context.Context, name, dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("attach socket: %q is not an absolute path", dir)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("attach socket: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("attach socket: %w: not a real directory", secfs.ErrUnsafe)
	}
	return b.update(name, func(m *meta) { m.SocketDir = filepath.Clean(dir) })
}

// DetachSocket forgets the socket directory; commands already running
// keep the mount they started with.
func (b *Backend) DetachSocket(ctx context.Context, name string) error {
	return b.update(name, func(m *meta) { m.SocketDir = "" })
}

// List returns every complete sandbox under Root, sorted by name.
func (b *Backend) List(ctx context.Context) ([]backend.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	entries, err := os.ReadDir(b.root)
	if err != nil {
		return nil, err
	}
	var out []backend.Instance
	for _, e := range entries {
		if !e.IsDir() || backend.ValidateName(e.Name()) != nil {
			continue
		}
		m, err := b.loadLocked(e.Name())
		if errors.Is(err, errIncomplete) || errors.Is(err, backend.ErrNotFound) {
			continue // being created, or a crashed create
		}
		if err != nil {
			return nil, err
		}
		out = append(out, backend.Instance{Name: e.Name(), UUID: m.UUID, Running: m.Running})
	}
	return out, nil
}

// GitRemote returns the host path of the sandbox's checkout.
func (b *Backend) GitRemote(ctx context.Context, name string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.loadLocked(name); err != nil {
		return "", err
	}
	return filepath.Join(b.dir(name), checkoutDir), nil
}

// update applies change to the sandbox's metadata and saves it durably.
func (b *Backend) update(name string, change func(*meta)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, err := b.loadLocked(name)
	if err != nil {
		return err
	}
	before := m
	change(&m)
	if m == before {
		return nil
	}
	return saveMeta(b.dir(name), m)
}

// loadLocked reads a sandbox's metadata. It returns backend.ErrNotFound
// for a missing sandbox and errIncomplete for a directory Create has not
// finished.
func (b *Backend) loadLocked(name string) (meta, error) {
	if err := backend.ValidateName(name); err != nil {
		return meta{}, err
	}
	dir := b.dir(name)
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return meta{}, fmt.Errorf("%w: %s", backend.ErrNotFound, name)
	}
	if err != nil {
		return meta{}, err
	}
	if !fi.IsDir() {
		return meta{}, fmt.Errorf("sandbox %s: %w: not a real directory", name, secfs.ErrUnsafe)
	}
	return loadMeta(dir)
}
