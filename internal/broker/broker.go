// Package broker is the jailbee orchestration broker's server: one Unix
// listener per sandbox, connection caps, the store-query pool, the
// executor, parked `next`, the round loop and its snapshot. It knows
// sockets and scheduling; what a manifest does lives in orchestrate.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"agentbox/internal/backend"
	"agentbox/internal/orchestrate"
	"agentbox/internal/secfs"
	"agentbox/internal/store"
)

// File names inside the state dir.
const (
	DBFile     = "broker.db"
	LockFile   = "broker.lock"
	AdminSock  = "admin.sock"
	SockDir    = "sock"
	SocketName = "broker.sock"
)

// ErrLocked: another broker holds the state dir.
var ErrLocked = errors.New("another broker holds this state dir")

// Config configures a broker.
type Config struct {
	StateDir string
	Backend  backend.Backend
	Logger   *slog.Logger
	// Insecure is recorded so host commands (exec) run the same way.
	Insecure bool
	// InboxQuota bounds every sandbox's unread inbox; a zero bound means
	// its default (DefaultInboxMaxUnreadItems, DefaultInboxMaxUnreadBytes).
	InboxQuota store.Quota
}

// Broker serves every sandbox's socket and the host admin socket.
type Broker struct {
	cfg   Config
	log   *slog.Logger
	store *store.Store
	lock  *os.File

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	serving map[string]*sandboxServer // by sandbox name
	admin   net.Listener

	queries  queryPool
	executor executor
	roundMu  sync.Mutex // one round at a time (the loop, admin ops)
	snap     atomic.Pointer[Snapshot]

	orchestrator *orchestrate.Orchestrator

	queryHook atomic.Pointer[func(op string)] // test hook, see SetQueryHookForTest
	execHook  atomic.Pointer[func()]          // test hook, see SetExecHookForTest
}

// Open takes the state dir's lock, opens broker.db and prepares the
// broker; Serve starts it.
func Open(cfg Config) (*Broker, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	quota, err := inboxQuota(cfg.InboxQuota)
	if err != nil {
		return nil, err
	}
	if err := secfs.EnsurePrivateDir(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	lock, err := lockStateDir(filepath.Join(cfg.StateDir, LockFile))
	if err != nil {
		return nil, err
	}
	st, err := store.Open(filepath.Join(cfg.StateDir, DBFile))
	if err != nil {
		lock.Close()
		return nil, err
	}
	st.SetQuota(quota)
	if err := secfs.EnsurePrivateDir(filepath.Join(cfg.StateDir, SockDir)); err != nil {
		st.Close()
		lock.Close()
		return nil, fmt.Errorf("socket dir: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Broker{
		cfg: cfg, log: cfg.Logger, store: st, lock: lock,
		ctx: ctx, cancel: cancel,
		serving: map[string]*sandboxServer{},
		queries: queryPool{workers: make(chan struct{}, QueryWorkers)},
	}
	b.orchestrator = &orchestrate.Orchestrator{Store: st, Backend: cfg.Backend, Notify: b.notify}
	b.snap.Store(&Snapshot{})
	return b, nil
}

func lockStateDir(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	return f, nil
}

// Store exposes the broker's store to tests in this module.
func (b *Broker) Store() *store.Store { return b.store }

// Serve starts the workers, the admin socket and one listener per sandbox.
// It returns once everything listens; Close stops it.
func (b *Broker) Serve() error {
	if err := b.listenAdmin(); err != nil {
		return err
	}
	sbs, err := b.store.Sandboxes(b.ctx)
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		if err := b.serveSandbox(sb); err != nil {
			b.log.Error("cannot serve sandbox", "sandbox", sb.Name, "err", err)
		}
	}
	b.runRound()
	b.goWorker(b.roundLoop)
	b.log.Info("broker serving", "sandboxes", len(sbs), "backend", b.cfg.Backend.Type())
	return nil
}

func (b *Broker) goWorker(fn func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		fn()
	}()
}

// Close stops listening, drops every connection and waits for workers.
func (b *Broker) Close() error {
	b.cancel()
	b.mu.Lock()
	if b.admin != nil {
		b.admin.Close()
	}
	for _, s := range b.serving {
		s.close()
	}
	b.mu.Unlock()
	b.wg.Wait()
	err := b.store.Close()
	b.lock.Close()
	return err
}

// SetExecHookForTest installs fn to run on the executor before each job
// is looked at, so tests can hold the executor busy.
func (b *Broker) SetExecHookForTest(fn func()) {
	if fn == nil {
		b.execHook.Store(nil)
		return
	}
	b.execHook.Store(&fn)
}

// SetQueryHookForTest installs fn to run in a query worker before each
// store query, so tests can hold queries in flight.
func (b *Broker) SetQueryHookForTest(fn func(op string)) {
	if fn == nil {
		b.queryHook.Store(nil)
		return
	}
	b.queryHook.Store(&fn)
}

// BackendForRestart returns the broker's backend, so a caller can reopen a
// broker on the same state dir with it (tests restart brokers in-process).
func (b *Broker) BackendForRestart() backend.Backend { return b.cfg.Backend }
