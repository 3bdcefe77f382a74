package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/manifest"
	"agentbox/internal/modelproxy"
	"agentbox/internal/secfs"
	"agentbox/internal/store"
)

// Names of the model sockets on the host: <state>/model/<name of the
// sandbox's socket directory>/anthropic.sock.
const (
	ModelDir        = "model"
	ModelSocketName = "anthropic.sock"
)

// BudgetWindow is the window model.max_output_tokens_per_hour counts
// over, and the least time between two notes to an orchestrator that its
// tree's budget is spent.
const BudgetWindow = time.Hour

// ModelConfig is how the broker serves every orchestrator and child a
// model socket (see modelproxy): the upstream, the host's key, and the
// hourly output bound of an orchestrator tree.
type ModelConfig struct {
	Upstream *url.URL
	Key      string
	// MaxOutputTokensPerHour bounds one tree's output tokens in any
	// BudgetWindow; 0 is no bound.
	MaxOutputTokensPerHour int64
	// Client sends the upstream requests (nil: modelproxy's own).
	Client *http.Client
	// ReadTimeout and StreamIdle replace modelproxy's bounds when set
	// (tests shorten them).
	ReadTimeout, StreamIdle time.Duration
}

// modelServer is one sandbox's served model socket.
type modelServer struct {
	dir    string
	cancel context.CancelFunc
}

// budgetNotes remembers when each tree's orchestrator was last told its
// budget is spent.
type budgetNotes struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// modelDirOf is the model socket directory that goes with the
// orchestration socket directory sockDir (<state>/sock/<uuid>.<random>):
// <state>/model/<random>. The random part alone keeps the socket's path
// short (a Unix socket's is at most 107 bytes); it is unique, as
// broker.db claims every socket directory's name.
func modelDirOf(sockDir string) string {
	base := filepath.Base(sockDir)
	if _, random, ok := strings.Cut(base, "."); ok && random != "" {
		base = random
	}
	return filepath.Join(filepath.Dir(filepath.Dir(sockDir)), ModelDir, base)
}

// serveModel gives srv's sandbox its model socket: a directory beside
// the orchestration one (modelDirOf), attached
// at backend.ModelMountPath, answered by a modelproxy whose usage is
// recorded for sb. Without a model configured it does nothing.
func (b *Broker) serveModel(srv *sandboxServer, sb store.Sandbox) error {
	m := b.cfg.Model
	if m == nil {
		return nil
	}
	dir := modelDirOf(srv.dir)
	// A directory that is there is kept (a running local sandbox binds
	// that very directory until its next start, as for the orchestration
	// socket); anything else at its name goes, by handles.
	fi, err := os.Lstat(dir)
	if err == nil && !fi.IsDir() {
		if err := secfs.RemoveTree(dir); err != nil {
			return fmt.Errorf("model socket: %w", err)
		}
	}
	if err != nil || !fi.IsDir() {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("model socket: %w", err)
		}
	}
	sockPath := filepath.Join(dir, ModelSocketName)
	if len(sockPath) > maxSocketPathBytes {
		return fmt.Errorf("model socket path is %d bytes, over the %d a Unix socket allows: use a shorter state dir", len(sockPath), maxSocketPathBytes)
	}
	if err := os.Remove(sockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("model socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sockPath, Net: "unix"})
	if err != nil {
		return fmt.Errorf("model socket: listen: %w", err)
	}
	// The directory goes as a whole (stopServing); a listener closed late
	// must not unlink a successor's socket at the same path.
	ln.SetUnlinkOnClose(false)
	if err := secfs.Chmod(sockPath, 0o600); err != nil {
		ln.Close()
		return err
	}
	proxy, err := modelproxy.New(modelproxy.Config{
		Upstream: m.Upstream, Key: m.Key, Client: m.Client,
		Record:      func(u modelproxy.Usage) { b.recordUsage(sb, u) },
		Admit:       func() error { return b.admitModel(sb) },
		Log:         b.log.With("sandbox", sb.Name, "socket", "model"),
		ReadTimeout: m.ReadTimeout, StreamIdle: m.StreamIdle,
	})
	if err != nil {
		ln.Close()
		return err
	}
	if err := b.cfg.Backend.AttachSocket(b.ctx, sb.Name, backend.ModelSocket, dir); err != nil {
		ln.Close()
		return fmt.Errorf("attach model socket: %w", err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	srv.model = &modelServer{dir: dir, cancel: cancel}
	b.goWorker(func() {
		if err := proxy.Serve(ctx, ln); err != nil {
			b.log.Warn("model socket stopped", "sandbox", sb.Name, "err", err)
		}
	})
	return nil
}

// recordUsage adds one response's usage to sb's durable totals.
func (b *Broker) recordUsage(sb store.Sandbox, u modelproxy.Usage) {
	err := b.store.AddUsage(context.WithoutCancel(b.ctx), sb.Name, sb.UUID, sb.Tree(), store.Usage{
		Requests: u.Requests, InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		CacheReadInputTokens: u.CacheReadInputTokens, CacheCreationInputTokens: u.CacheCreationInputTokens,
	}, time.Now())
	if err != nil {
		b.log.Error("cannot record model usage", "sandbox", sb.Name, "err", err)
	}
}

// errBudgetUnknown: the tree's usage cannot be read, so the request is
// refused (fail closed).
var errBudgetUnknown = errors.New("the model budget of this sandbox's orchestrator cannot be checked; try again later")

// admitModel refuses a request of sb when its tree has used its hourly
// output budget, and tells the tree's orchestrator once per BudgetWindow.
func (b *Broker) admitModel(sb store.Sandbox) error {
	limit := b.cfg.Model.MaxOutputTokensPerHour
	if limit <= 0 {
		return nil
	}
	tree, now := sb.Tree(), time.Now()
	used, err := b.store.TreeOutputSince(b.ctx, tree, now.Add(-BudgetWindow))
	if err != nil {
		b.log.Error("cannot read model usage", "tree", tree, "err", err)
		return errBudgetUnknown
	}
	if used < limit {
		return nil
	}
	b.noteBudgetSpent(tree, used, limit, now)
	return fmt.Errorf("the output token budget of orchestrator %s (model.max_output_tokens_per_hour: %d) is spent for now: %d output tokens in the last hour", tree, limit, used)
}

// noteBudgetSpent tells tree's orchestrator, at most once per
// BudgetWindow, that its model requests are refused.
func (b *Broker) noteBudgetSpent(tree string, used, limit int64, now time.Time) {
	b.budget.mu.Lock()
	if last, ok := b.budget.last[tree]; ok && now.Sub(last) < BudgetWindow {
		b.budget.mu.Unlock()
		return
	}
	if b.budget.last == nil {
		b.budget.last = map[string]time.Time{}
	}
	b.budget.last[tree] = now
	b.budget.mu.Unlock()
	body := fmt.Sprintf("model requests of %s and its children are refused: %d output tokens in the last hour reached model.max_output_tokens_per_hour (%d); they are admitted again as the hour's usage ages out", tree, used, limit)
	if _, err := b.store.DeliverHostMessage(context.WithoutCancel(b.ctx), tree, tree, manifest.MsgNote, body); err != nil {
		b.log.Warn("cannot tell the orchestrator its model budget is spent", "tree", tree, "err", err)
		return
	}
	b.notify(tree)
}
