package broker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"agentbox/internal/backend"
	"agentbox/internal/secfs"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// socketDirRandomBytes is the random part of <uuid>.<random>: 8 bytes (16
// hex) never repeat in practice, and the broker also refuses a name it
// has claimed before.
const socketDirRandomBytes = 8

// maxSocketPathBytes is the longest path a Unix socket address holds
// (sun_path is 108 bytes with the terminating NUL).
const maxSocketPathBytes = 107

// sandboxServer is one sandbox's listener and its per-sandbox bounds.
type sandboxServer struct {
	caller   wire.Caller
	dir      string
	ln       *net.UnixListener
	conns    atomic.Int32
	querySem chan struct{}
	// sends is the sandbox's own queue for send: MaxSendsPerSandbox in
	// flight, the rest waiting in their connections (at most one request
	// per connection, so at most MaxConnsPerSandbox-1 wait). One sandbox
	// thus holds at most one place in the executor's line, which serves
	// sandboxes in turn however many connections each floods.
	sends  chan struct{}
	parked atomic.Bool

	mu      sync.Mutex
	changed chan struct{} // closed and replaced when the inbox changes
	open    map[net.Conn]struct{}
	closed  bool
	model   *modelServer  // nil: no model-socket directory
	egress  *egressServer // nil: not served
}

func newSandboxServer(c wire.Caller) *sandboxServer {
	return &sandboxServer{
		caller:   c,
		querySem: make(chan struct{}, MaxQueriesPerSandbox),
		sends:    make(chan struct{}, MaxSendsPerSandbox),
		changed:  make(chan struct{}),
		open:     map[net.Conn]struct{}{},
	}
}

// inboxChanged returns a channel closed at the next inbox change.
func (s *sandboxServer) inboxChanged() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *sandboxServer) signal() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func (s *sandboxServer) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.open[c] = struct{}{}
	return true
}

func (s *sandboxServer) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.open, c)
	s.mu.Unlock()
}

// close stops the listener and drops every connection.
func (s *sandboxServer) close() {
	s.mu.Lock()
	s.closed = true
	conns := s.open
	s.open = map[net.Conn]struct{}{}
	s.mu.Unlock()
	if s.ln != nil {
		s.ln.Close()
	}
	if s.model != nil {
		s.model.cancel()
	}
	if s.egress != nil {
		s.egress.stop()
	}
	for c := range conns {
		c.Close()
	}
}

// socketRoot is <state>/sock.
func (b *Broker) socketRoot() string { return filepath.Join(b.cfg.StateDir, SockDir) }

// freshSocketDir creates <state>/sock/<uuid>.<random>, a name never used
// before (claimed in broker.db), mode 0700, and records it for sb.
func (b *Broker) freshSocketDir(sb store.Sandbox) (string, error) {
	for range 8 {
		var r [socketDirRandomBytes]byte
		if _, err := rand.Read(r[:]); err != nil {
			return "", err
		}
		dir := filepath.Join(b.socketRoot(), sb.UUID+"."+hex.EncodeToString(r[:]))
		if err := b.store.ClaimSocketDir(b.ctx, sb.Name, dir); err != nil {
			if errors.Is(err, store.ErrExists) {
				continue
			}
			return "", err
		}
		if err := secfs.MkdirFresh(dir); err != nil {
			if errors.Is(err, os.ErrExist) {
				continue
			}
			return "", err
		}
		return dir, nil
	}
	return "", errors.New("could not pick a fresh socket directory")
}

// isCurrentSocketDir reports whether dir is a usable <uuid>.<random>
// directory of sb: right name shape, a real directory, ours, mode 0700.
func (b *Broker) isCurrentSocketDir(sb store.Sandbox, dir string) bool {
	if dir == "" || filepath.Dir(dir) != b.socketRoot() || !strings.HasPrefix(filepath.Base(dir), sb.UUID+".") {
		return false
	}
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		return false
	}
	return true
}

// serveSandbox starts the listener of an orchestrator or child: it reuses
// its current socket directory, or makes a fresh one (replacing a legacy
// <state>/sock/<uuid>/, removed once the new one is attached).
func (b *Broker) serveSandbox(sb store.Sandbox) error {
	if sb.Role != wire.RoleOrchestrator && sb.Role != wire.RoleChild {
		return nil // only orchestrators and children get a socket
	}
	dir := sb.SocketDir
	if !b.isCurrentSocketDir(sb, dir) {
		var err error
		if dir, err = b.freshSocketDir(sb); err != nil {
			return err
		}
	}
	ln, err := listenPrivate(filepath.Join(dir, SocketName))
	if err != nil {
		return err
	}
	if err := b.cfg.Backend.AttachSocket(b.ctx, sb.Name, backend.OrchestrationSocket, dir); err != nil {
		ln.Close()
		return fmt.Errorf("attach socket: %w", err)
	}
	b.removeLegacySocketDir(sb)
	srv := newSandboxServer(wire.Caller{Sandbox: sb.Name, Role: sb.Role, Parent: sb.Parent})
	srv.dir, srv.ln = dir, ln
	if err := b.serveModel(srv, sb); err != nil {
		ln.Close()
		return err
	}
	b.mu.Lock()
	old := b.serving[sb.Name]
	if old != nil {
		old.close()
	}
	b.serving[sb.Name] = srv
	b.mu.Unlock()
	// A rights change while the sockets were made (its refresh found no
	// server, or the old one) reaches the proxy now.
	b.RefreshEgress(b.ctx, sb.Name)
	if old != nil && old.model != nil && (srv.model == nil || old.model.dir != srv.model.dir) {
		if err := secfs.RemoveTree(old.model.dir); err != nil {
			b.log.Warn("cannot remove model socket dir", "sandbox", sb.Name, "err", err)
		}
	}
	b.goWorker(func() { b.serveListener(srv) })
	return nil
}

// listenPrivate listens at sockPath, owner-only, in place of whatever
// socket a dead listener left there.
func listenPrivate(sockPath string) (*net.UnixListener, error) {
	if len(sockPath) > maxSocketPathBytes {
		return nil, fmt.Errorf("socket path is %d bytes, over the %d a Unix socket allows: use a shorter state dir", len(sockPath), maxSocketPathBytes)
	}
	if err := os.Remove(sockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sockPath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	if err := secfs.Chmod(sockPath, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// removeLegacySocketDir removes <state>/sock/<uuid>/ (the pre-random
// layout) if present; never through a symlink.
func (b *Broker) removeLegacySocketDir(sb store.Sandbox) {
	legacy := filepath.Join(b.socketRoot(), sb.UUID)
	if err := secfs.RemoveTree(legacy); err != nil {
		b.log.Warn("cannot remove legacy socket dir", "sandbox", sb.Name, "err", err)
	}
}

// stopServing closes a sandbox's listener and removes its socket dir.
func (b *Broker) stopServing(name string) {
	b.mu.Lock()
	srv := b.serving[name]
	delete(b.serving, name)
	b.mu.Unlock()
	if srv == nil {
		return
	}
	srv.close()
	// The directories belong to the sandbox's uid: removed by handles.
	if err := secfs.RemoveTree(srv.dir); err != nil {
		b.log.Warn("cannot remove socket dir", "sandbox", name, "err", err)
	}
	if srv.model != nil {
		if err := secfs.RemoveTree(srv.model.dir); err != nil {
			b.log.Warn("cannot remove model socket dir", "sandbox", name, "err", err)
		}
	}
}

func (b *Broker) server(name string) *sandboxServer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.serving[name]
}

// SocketPath returns the host path of a sandbox's broker socket, or "".
func (b *Broker) SocketPath(name string) string {
	if s := b.server(name); s != nil {
		return filepath.Join(s.dir, SocketName)
	}
	return ""
}
