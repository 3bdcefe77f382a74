package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/backend"
	"agentbox/internal/manifest"
	"agentbox/internal/modelproxy"
	"agentbox/internal/secfs"
	"agentbox/internal/store"
)

// Names of the model sockets on the host: <state>/model/<random part of
// the sandbox's socket directory's name>/anthropic.sock, and
// litellm-PROFILE.sock beside it for each LiteLLM profile.
const (
	ModelDir        = "model"
	ModelSocketName = agent.ModelSocketName
)

// BudgetWindow is the window model.max_output_tokens_per_hour and
// model.max_input_tokens_per_hour count over, and the least time between
// two notes to an orchestrator that one of its tree's budgets is spent.
const BudgetWindow = time.Hour

// ModelConfig is how the broker serves every orchestrator and child a
// model socket (see modelproxy): the upstream, the host's key, and the
// hourly output bound of an orchestrator tree.
type ModelConfig struct {
	// Upstream and Key are the Messages API's (anthropic.sock); no Key, no
	// such socket.
	Upstream *url.URL
	Key      string
	// LiteLLM are the endpoints of LiteLLM profiles, by name: each gets a
	// socket of its own (agent.LiteLLMSocketName) for claude-jb runners.
	LiteLLM map[string]ModelEndpoint
	// MaxOutputTokensPerHour bounds one tree's output tokens in any
	// BudgetWindow; 0 is no bound.
	MaxOutputTokensPerHour int64
	// MaxInputTokensPerHour bounds one tree's input tokens (cached or
	// not) in any BudgetWindow; 0 is no bound.
	MaxInputTokensPerHour int64
	// ProviderTools passes requests for tools the provider runs on its
	// own side (modelproxy.Config.ProviderTools); off, they are refused.
	ProviderTools bool
	// Client sends the upstream requests (nil: modelproxy's own); it
	// follows no redirect either way.
	Client *http.Client
	// ReadTimeout and StreamIdle replace modelproxy's bounds when set
	// (tests shorten them).
	ReadTimeout, StreamIdle time.Duration
}

// profiles is the set of LiteLLM profiles served (nil config: none).
func (m *ModelConfig) profiles() map[string]bool {
	if m == nil {
		return nil
	}
	out := map[string]bool{}
	for name := range m.LiteLLM {
		out[name] = true
	}
	return out
}

// ModelEndpoint is an upstream and its key.
type ModelEndpoint struct {
	Upstream *url.URL
	Key      string
}

// modelServer is one sandbox's served model sockets.
type modelServer struct {
	dir    string
	cancel context.CancelFunc
}

// budgetNotes remembers when each tree's orchestrator was last told one
// of its budgets is spent (by tree and budget), and what each tree's
// requests in flight reserve.
type budgetNotes struct {
	mu       sync.Mutex
	last     map[string]time.Time
	reserved map[string]*treeReserve
}

// treeReserve is the output a tree's requests in flight may still cost:
// each reserves its max_tokens until its usage is recorded. mu makes
// reading the tree's usage, checking and reserving one step, and a
// release (which follows its usage's record) another.
type treeReserve struct {
	mu       sync.Mutex
	tokens   int64
	requests int // in flight; the entry goes with the last
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

// serveModel gives srv's sandbox its model-socket directory: beside the
// orchestration one (modelDirOf), attached at backend.ModelMountPath,
// holding the egress proxy's socket (serveEgress) and, with a model
// configured, anthropic.sock (with a key) and litellm-PROFILE.sock for
// each LiteLLM profile, each answered by a modelproxy to its endpoint,
// usage recorded for sb.
func (b *Broker) serveModel(srv *sandboxServer, sb store.Sandbox) error {
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
	endpoints := map[string]ModelEndpoint{}
	if m := b.cfg.Model; m != nil {
		if m.Key != "" {
			endpoints[ModelSocketName] = ModelEndpoint{Upstream: m.Upstream, Key: m.Key}
		}
		for name, e := range m.LiteLLM {
			endpoints[agent.LiteLLMSocketName(name)] = e
		}
	}
	var lns []net.Listener
	var serves []func(context.Context) error
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	for _, file := range slices.Sorted(maps.Keys(endpoints)) {
		ln, proxy, err := b.listenModel(sb, filepath.Join(dir, file), endpoints[file])
		if err != nil {
			closeAll()
			return err
		}
		lns = append(lns, ln)
		serves = append(serves, func(ctx context.Context) error { return proxy.Serve(ctx, ln) })
	}
	ln, eg, err := b.listenEgress(sb, dir)
	if err != nil {
		closeAll()
		return err
	}
	lns = append(lns, ln)
	serves = append(serves, func(ctx context.Context) error { return eg.proxy.Serve(ctx, ln) })
	if err := b.cfg.Backend.AttachSocket(b.ctx, sb.Name, backend.ModelSocket, dir); err != nil {
		closeAll()
		return fmt.Errorf("attach model socket: %w", err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	srv.model = &modelServer{dir: dir, cancel: cancel}
	srv.egress = eg
	for i, serve := range serves {
		b.goWorker(func() {
			if err := serve(ctx); err != nil {
				b.log.Warn("model socket stopped", "sandbox", sb.Name, "socket", filepath.Base(lns[i].Addr().String()), "err", err)
			}
		})
	}
	return nil
}

// listenModel listens at sockPath (owner-only; a listener closed late
// does not unlink a successor's socket at the same path) and makes the
// proxy that answers there: e's upstream and key, usage recorded for sb.
func (b *Broker) listenModel(sb store.Sandbox, sockPath string, e ModelEndpoint) (net.Listener, *modelproxy.Proxy, error) {
	m := b.cfg.Model
	ln, err := listenPrivate(sockPath)
	if err != nil {
		return nil, nil, fmt.Errorf("model socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	proxy, err := modelproxy.New(modelproxy.Config{
		Upstream: e.Upstream, Key: e.Key, Client: m.Client,
		Record:        func(u modelproxy.Usage) { b.recordUsage(sb, u) },
		Admit:         func() error { return b.admitModel(sb) },
		Reserve:       func(charge int64) (func(), error) { return b.reserveModel(sb, charge) },
		ProviderTools: b.cfg.Model.ProviderTools,
		AdmitConn:     b.admitConn(sb),
		AdmitBody:     b.admitBody(sb),
		Log:           b.log.With("sandbox", sb.Name, "socket", filepath.Base(sockPath)),
		ReadTimeout:   m.ReadTimeout, StreamIdle: m.StreamIdle,
	})
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	return ln, proxy, nil
}

// recordUsage adds one response's usage to sb's durable totals.
func (b *Broker) recordUsage(sb store.Sandbox, u modelproxy.Usage) {
	err := b.store.AddUsage(context.WithoutCancel(b.ctx), sb.Name, sb.UUID, sb.Tree(), u, time.Now())
	if err != nil {
		b.log.Error("cannot record model usage", "sandbox", sb.Name, "err", err)
	}
}

// errBudgetUnknown: the tree's usage cannot be read, so the request is
// refused (fail closed).
var errBudgetUnknown = errors.New("the model budget of this sandbox's orchestrator cannot be checked; try again later")

// admitModel refuses a request of sb when its tree has used its hourly
// output or input budget, and tells the tree's orchestrator once per
// BudgetWindow. The input a request will cost is known only from its
// answer, so a tree passes its input budget by at most what its requests
// in flight at the moment it is reached carry.
func (b *Broker) admitModel(sb store.Sandbox) error {
	tree, now := sb.Tree(), time.Now()
	for _, bu := range []struct {
		kind, key string
		limit     int64
		since     func(context.Context, string, time.Time) (int64, error)
	}{
		{"output", "max_output_tokens_per_hour", b.cfg.Model.MaxOutputTokensPerHour, b.store.TreeOutputSince},
		{"input", "max_input_tokens_per_hour", b.cfg.Model.MaxInputTokensPerHour, b.store.TreeInputSince},
	} {
		if bu.limit <= 0 {
			continue
		}
		used, err := bu.since(b.ctx, tree, now.Add(-BudgetWindow))
		if err != nil {
			b.log.Error("cannot read model usage", "tree", tree, "err", err)
			return errBudgetUnknown
		}
		if used < bu.limit {
			continue
		}
		b.noteBudgetSpent(tree, bu.kind, fmt.Sprintf("%d %s tokens in the last hour reached model.%s (%d)", used, bu.kind, bu.key, bu.limit), now)
		return fmt.Errorf("the %s token budget of orchestrator %s (model.%s: %d) is spent for now: %d %s tokens in the last hour", bu.kind, tree, bu.key, bu.limit, used, bu.kind)
	}
	return nil
}

// reserveModel admits one Messages request of sb that may cost charge
// output tokens when its tree's usage in the last hour and what its
// requests in flight reserve are under the hourly budget, and reserves
// charge until release (called after its usage is recorded). Checked
// against the usage alone, each of a tree's concurrent requests (8 per
// model socket, per sandbox) saw the same total, which counted none of
// them: the tree could pass its budget by its concurrency times
// max_tokens, every hour.
func (b *Broker) reserveModel(sb store.Sandbox, charge int64) (release func(), err error) {
	limit := b.cfg.Model.MaxOutputTokensPerHour
	if limit <= 0 {
		return func() {}, nil
	}
	tree := sb.Tree()
	b.budget.mu.Lock()
	if b.budget.reserved == nil {
		b.budget.reserved = map[string]*treeReserve{}
	}
	tr := b.budget.reserved[tree]
	if tr == nil {
		tr = &treeReserve{}
		b.budget.reserved[tree] = tr
	}
	tr.requests++
	b.budget.mu.Unlock()
	done := func() {
		b.budget.mu.Lock()
		if tr.requests--; tr.requests == 0 {
			delete(b.budget.reserved, tree)
		}
		b.budget.mu.Unlock()
	}

	tr.mu.Lock()
	defer tr.mu.Unlock()
	used, err := b.store.TreeOutputSince(b.ctx, tree, time.Now().Add(-BudgetWindow))
	if err != nil {
		done()
		b.log.Error("cannot read model usage", "tree", tree, "err", err)
		return nil, errBudgetUnknown
	}
	if used+tr.tokens >= limit {
		done()
		return nil, fmt.Errorf("the output token budget of orchestrator %s (model.max_output_tokens_per_hour: %d) is spent for now: %d output tokens in the last hour and %d reserved by requests in flight (each reserves its max_tokens until its usage is known); try again when they end", tree, limit, used, tr.tokens)
	}
	tr.tokens += charge
	var once sync.Once
	return func() {
		once.Do(func() {
			tr.mu.Lock()
			tr.tokens -= charge
			tr.mu.Unlock()
			done()
		})
	}, nil
}

// noteBudgetSpent tells tree's orchestrator, at most once per
// BudgetWindow for each budget (kind: output or input), that its model
// requests are refused, and why.
func (b *Broker) noteBudgetSpent(tree, kind, why string, now time.Time) {
	key := tree + "\x00" + kind
	b.budget.mu.Lock()
	if last, ok := b.budget.last[key]; ok && now.Sub(last) < BudgetWindow {
		b.budget.mu.Unlock()
		return
	}
	if b.budget.last == nil {
		b.budget.last = map[string]time.Time{}
	}
	b.budget.last[key] = now
	b.budget.mu.Unlock()
	body := fmt.Sprintf("model requests of %s and its children are refused: %s; they are admitted again as the hour's usage ages out", tree, why)
	if _, err := b.store.DeliverHostMessage(context.WithoutCancel(b.ctx), tree, tree, manifest.MsgNote, body); err != nil {
		b.log.Warn("cannot tell the orchestrator its model budget is spent", "tree", tree, "err", err)
		return
	}
	b.notify(tree)
}
