// Package broker is the jailbee orchestration broker's server: one Unix
// listener per sandbox, connection caps, the store-query pool, the
// executor, parked `next`, the round loop and its snapshot. It knows
// sockets and scheduling; what a manifest does lives in orchestrate.
package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/orchestrate"
	"agentbox/internal/pubjournal"
	"agentbox/internal/secfs"
	"agentbox/internal/serial"
	"agentbox/internal/store"
)

// File names inside the state dir.
const (
	DBFile     = "broker.db"
	LockFile   = "broker.lock"
	AdminSock  = "admin.sock"
	SockDir    = "sock"
	LogDir     = "logs"    // one worker log per spawn
	PublishDir = "publish" // publish journals and budgets (pubjournal)
	SocketName = "broker.sock"
)

// ErrLocked: another broker holds the state dir.
var ErrLocked = errors.New("another broker holds this state dir")

// Config configures a broker.
type Config struct {
	StateDir string
	Backend  backend.Backend
	Logger   *slog.Logger
	// Sandboxes configures the sandboxes the broker creates: limits, and
	// the host uid range of a root broker.
	Sandboxes orchestrate.Sandboxes
	// InboxQuota bounds every sandbox's unread inbox; a zero bound means
	// its default (DefaultInboxMaxUnreadItems, DefaultInboxMaxUnreadBytes).
	InboxQuota store.Quota
	// ReadRetention is how long read items are kept (zero: its default,
	// DefaultReadRetention).
	ReadRetention time.Duration
	// Caps bound each orchestrator's children and queued spawns (a zero
	// bound: its default).
	Caps orchestrate.Caps
	// TreeMaxConns bounds the model and egress connections one
	// orchestrator and its children hold at once (zero: its default,
	// DefaultTreeMaxConns).
	TreeMaxConns int
	// Model, when set, gives every orchestrator and child a model socket
	// (model.go); nil serves none.
	Model *ModelConfig
	// Egress, when set, is told after each sandbox's proxy has been
	// refreshed for a change of its rights (tests observe it).
	Egress orchestrate.EgressHook
	// EgressHeadTimeout replaces egress.HeadTimeout when set (tests that
	// hold silent connections longer than it on a slow machine).
	EgressHeadTimeout time.Duration
	// Publish, when set, serves publish manifests with its forge: the
	// journals and budgets are kept in <state>/publish (PublishDir). Nil
	// refuses every publish.
	Publish *orchestrate.Publishing
}

// Broker serves every sandbox's socket and the host admin socket.
type Broker struct {
	cfg   Config
	log   *slog.Logger
	store *store.Store
	lock  *os.File
	// retention is how long read items are kept (sweepStorage).
	retention time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	serving map[string]*sandboxServer // by sandbox name
	admin   net.Listener
	conns   connTracker
	// proxyConns admits the model and egress sockets' connections.
	proxyConns *connBudget
	// modelBodies admits the bytes of the model sockets' request bodies.
	modelBodies *bodyBudget

	queries  queryPool
	executor serial.Executor
	roundMu  sync.Mutex // one round at a time (the loop, admin ops)
	// repairing: a round's repairs are being carried out (reconcile.go).
	repairing atomic.Bool
	restores  restoreBackoff // spaces out one sandbox's restores
	// roundsHeld: the round loop skips its rounds (HoldRoundsForTest).
	roundsHeld atomic.Bool
	// conflicted: sandboxes unserved while several instances share their
	// uuid (under mu).
	conflicted map[string]bool
	snap       atomic.Pointer[Snapshot]
	budget     budgetNotes

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
	if cfg.TreeMaxConns < 0 {
		return nil, fmt.Errorf("tree connections: the bound must be positive (got %d)", cfg.TreeMaxConns)
	}
	descriptors, err := spareDescriptors()
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
	// Every orchestrator and child has a model-socket directory: it holds
	// the egress socket even without a model.
	if err := secfs.EnsurePrivateDir(filepath.Join(cfg.StateDir, ModelDir)); err != nil {
		st.Close()
		lock.Close()
		return nil, fmt.Errorf("model socket dir: %w", err)
	}
	if p := cfg.Publish; p != nil {
		pub := *p
		if pub.Journal, err = pubjournal.Open(filepath.Join(cfg.StateDir, PublishDir)); err != nil {
			st.Close()
			lock.Close()
			return nil, fmt.Errorf("publish dir: %w", err)
		}
		cfg.Publish = &pub
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Broker{
		cfg: cfg, log: cfg.Logger, store: st, lock: lock,
		ctx: ctx, cancel: cancel,
		serving:     map[string]*sandboxServer{},
		conflicted:  map[string]bool{},
		conns:       newConnTracker(),
		proxyConns:  newConnBudget(cmp.Or(cfg.TreeMaxConns, DefaultTreeMaxConns), descriptors),
		modelBodies: newBodyBudget(TreeMaxModelBodyBytes),
		queries:     queryPool{workers: make(chan struct{}, QueryWorkers)},
		retention:   cmp.Or(cfg.ReadRetention, DefaultReadRetention),
	}
	b.executor.Cap = ExecQueueCap
	if n := descriptors / descriptorsPerConn; n < lowConnBudget {
		b.log.Warn("the open-file limit leaves room for few model and egress connections: raise it (LimitNOFILE= in a systemd unit, ulimit -Hn)",
			"connections", max(n, 0), "reserved_descriptors", ReservedDescriptors)
	}
	b.orchestrator = &orchestrate.Orchestrator{
		Store: st, Backend: cfg.Backend, Notify: b.notify, Sandboxes: cfg.Sandboxes, Caps: cfg.Caps, Log: cfg.Logger,
		Serve: b.serveSandbox, Unserve: b.stopServing, ModelSockets: cfg.Model != nil, LiteLLMProfiles: cfg.Model.profiles(),
		Go:         func(fn func(context.Context)) { b.goWorker(func() { fn(b.ctx) }) },
		Serial:     func(ctx context.Context, fn func(context.Context)) { b.runExec(ctx, nil, nil, fn) },
		LogDir:     filepath.Join(cfg.StateDir, LogDir),
		Egress:     egressHook{b: b, next: cfg.Egress},
		Publishing: cfg.Publish,
	}
	b.snap.Store(&Snapshot{})
	return b, nil
}

// lockStateDir takes the state dir's lock and writes this process's pid
// in the lock file, for a second broker to name the holder.
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
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) // only for LockHolder: the lock is the flock
	}
	return f, nil
}

// maxPIDBytes bounds the read of the lock file: a pid and a newline.
const maxPIDBytes = 32

// LockHolder is the pid of the broker that holds the state dir's lock, as
// it wrote it in the lock file; 0 when it cannot be read (a holder that
// has not written it yet).
func LockHolder(stateDir string) int {
	data, err := secfs.ReadFileNoFollow(filepath.Join(stateDir, LockFile), maxPIDBytes)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Store exposes the broker's store to tests in this module.
func (b *Broker) Store() *store.Store { return b.store }

// Serve starts the workers, the admin socket and one listener per sandbox.
// It returns once everything listens; Close stops it. The admin socket
// comes after the sandboxes' sockets: once a host command is answered,
// every sandbox's socket is there (a client inside finds it).
func (b *Broker) Serve() error {
	sbs, err := b.store.Sandboxes(b.ctx)
	if err != nil {
		return err
	}
	sbs = b.recover(sbs)
	// Expiries that passed while no broker ran apply before anyone is
	// served and before units start (which attach the mounts left).
	b.orchestrator.ExpireRights(b.ctx, time.Now())
	// Listed before any requester can send: these ran under a dead broker.
	interrupted, err := b.store.InterruptedManifests(b.ctx)
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		if sb.State == store.StateQueued {
			continue // no sandbox yet
		}
		if err := b.serveSandbox(sb); err != nil {
			b.log.Error("cannot serve sandbox", "sandbox", sb.Name, "err", err)
		}
	}
	if err := b.listenAdmin(); err != nil {
		return err
	}
	b.restartUnits(sbs)
	// Spawns a previous broker left: creating ones failed, queued resume.
	b.orchestrator.RecoverSpawns(b.ctx)
	b.orchestrator.RecoverManifests(b.ctx, interrupted)
	b.orchestrator.RecoverPublish(b.ctx)
	b.runRound()
	b.goWorker(b.roundLoop)
	b.goWorker(b.sweepLoop)
	b.log.Info("broker serving", "state_dir", b.cfg.StateDir, "pid", os.Getpid(), "sandboxes", len(sbs), "backend", b.cfg.Backend.Type())
	return nil
}

// recover finishes what a previous broker left half done between steps:
// a create (the sandbox is removed) and a destroy (it is finished). It
// returns the other sandboxes.
func (b *Broker) recover(sbs []store.Sandbox) []store.Sandbox {
	var kept []store.Sandbox
	for _, sb := range sbs {
		interruptedCreate := sb.State == store.StateCreating && sb.SpawnDoc == "" // a spawn's is its worker's: RecoverSpawns
		if !interruptedCreate && sb.State != store.StateDestroying {
			kept = append(kept, sb)
			continue
		}
		b.log.Warn("removing a sandbox whose create or destroy was interrupted", "sandbox", sb.Name, "state", sb.State)
		if err := b.cfg.Backend.Destroy(b.ctx, sb.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			b.log.Error("cannot remove an interrupted sandbox", "sandbox", sb.Name, "err", err)
			kept = append(kept, sb)
			continue
		}
		if sb.SocketDir != "" {
			secfs.RemoveTree(sb.SocketDir)
		}
		if err := b.store.DeleteSandbox(b.ctx, sb.Name); err != nil {
			b.log.Error("cannot remove an interrupted sandbox", "sandbox", sb.Name, "err", err)
		}
	}
	return kept
}

// restartUnits starts the units of sandboxes recorded running that are
// not (the host rebooted, or something killed them): a broker restart
// alone never ends a unit, it finds it running.
func (b *Broker) restartUnits(sbs []store.Sandbox) {
	insts, err := b.cfg.Backend.List(b.ctx)
	if err != nil {
		b.log.Error("cannot list the backend's sandboxes", "err", err)
		return
	}
	running := map[string]bool{}
	for _, in := range insts {
		running[in.Name] = in.Running
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, unitStartsAtOnce)
	for _, sb := range sbs {
		if (sb.State != store.StateRunning && sb.State != store.StateReady) || running[sb.Name] {
			continue
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			b.log.Warn("sandbox recorded running is not: starting it", "sandbox", sb.Name)
			if err := b.orchestrator.StartUnit(b.ctx, sb.Name); err != nil {
				b.log.Error("cannot start sandbox", "sandbox", sb.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// unitStartsAtOnce bounds the units a starting broker starts at once. A
// start may take its backend's whole bound (root inside an Incus sandbox
// can hold up its egress relay for 30 s), and the broker's recovery
// waits for them all: one at a time, N such sandboxes would hold it up N
// times over.
const unitStartsAtOnce = 8

func (b *Broker) goWorker(fn func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		fn()
	}()
}

// Close shuts the broker down like net/http's Shutdown: it stops
// listening, closes idle connections and parked waits, lets requests in
// flight finish (for at most DrainTimeout), then cancels what remains and
// waits for every worker before it closes broker.db. Sandboxes keep
// running.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.admin != nil {
		b.admin.Close()
	}
	for _, s := range b.serving {
		s.ln.Close()
	}
	b.mu.Unlock()
	b.conns.drain()
	deadline := time.Now().Add(DrainTimeout)
	for b.conns.busy() > 0 && time.Now().Before(deadline) {
		time.Sleep(drainPoll)
	}
	b.cancel()
	b.mu.Lock()
	for _, s := range b.serving {
		s.close()
	}
	b.mu.Unlock()
	b.conns.closeAll()
	b.wg.Wait()
	err := b.store.Close()
	b.lock.Close()
	return err
}

// drainPoll paces Close's wait for requests in flight.
const drainPoll = 10 * time.Millisecond

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

// BackendForTest returns the broker's backend, so a test can reopen a
// broker on the same state dir with it, or look at a sandbox directly.
func (b *Broker) BackendForTest() backend.Backend { return b.cfg.Backend }

// EgressRights is what sandbox may reach through the egress proxy now:
// its egress entries, loose, and its repository's egress cap.
func (b *Broker) EgressRights(ctx context.Context, sandbox string) (orchestrate.EgressRights, error) {
	return b.orchestrator.EgressRights(ctx, sandbox)
}
