package broker

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/egress"
	"agentbox/internal/grant"
	"agentbox/internal/orchestrate"
	"agentbox/internal/store"
)

// egressServer is one sandbox's egress proxy and the rights it was last
// given (to know which rights a refresh takes away).
type egressServer struct {
	proxy *egress.Proxy
	mu    sync.Mutex
	rules egress.Rights
	// expiry refreshes the rights when the first of them expires: a
	// right's end is the proxy's to apply at once (its live connections
	// cut, new ones refused), not a round's, which may come 30 s later.
	expiry  *time.Timer
	stopped bool // the sandbox is no longer served: no timer is armed
}

// stop disarms the expiry timer for good (the sandbox's server closes).
func (es *egressServer) stop() {
	es.mu.Lock()
	defer es.mu.Unlock()
	es.stopped = true
	if es.expiry != nil {
		es.expiry.Stop()
		es.expiry = nil
	}
}

// listenEgress listens at dir/egress.sock and makes the sandbox's proxy,
// decided by its rights as the store has them now (a sandbox whose
// rights cannot be read gets none). Each connection is logged.
func (b *Broker) listenEgress(sb store.Sandbox, dir string) (net.Listener, *egressServer, error) {
	ln, err := listenPrivate(filepath.Join(dir, backend.EgressSocketName))
	if err != nil {
		return nil, nil, fmt.Errorf("egress socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	es := &egressServer{}
	es.proxy = egress.New(egress.Config{Sandbox: sb.Name, Log: b.logEgress, AdmitConn: b.admitConn(sb), HeadTimeout: b.cfg.EgressHeadTimeout})
	es.refresh(func() (*egress.Rights, time.Time) { return b.egressRights(context.Background(), sb.Name) }, b.expireEgress(sb.Name))
	return ln, es, nil
}

// egressRights is the policy of sandbox name: its egress and loose rights
// as the store has them now and its repository's cap, nil (nothing
// allowed) when they cannot be read; and when the first of them expires.
func (b *Broker) egressRights(ctx context.Context, name string) (*egress.Rights, time.Time) {
	r, err := b.orchestrator.EgressRights(ctx, name)
	if err != nil {
		b.log.Warn("egress: the sandbox's rights cannot be read; it is allowed none", "sandbox", name, "err", err)
		return nil, time.Time{}
	}
	return &egress.Rights{Rights: grant.Rights{Egress: r.Egress, Loose: r.Loose}, Cap: grant.Cap{Egress: r.RepoCap}}, r.Until
}

// expireEgress refreshes sandbox name's proxy, whichever serves it then.
func (b *Broker) expireEgress(name string) func() {
	return func() {
		if b.ctx.Err() == nil { // not after the broker closed
			b.RefreshEgress(b.ctx, name)
		}
	}
}

// refresh gives the proxy the rights read returns (nil: nothing) and cuts
// the live connections of every right they no longer hold. The read and
// the change are one step under es.mu: of two refreshes, the one that
// read last applies last, so a revoke's refresh is never undone by an
// older reading.
func (es *egressServer) refresh(read func() (*egress.Rights, time.Time), expire func()) {
	es.mu.Lock()
	defer es.mu.Unlock()
	r, until := read()
	if es.expiry != nil {
		es.expiry.Stop()
		es.expiry = nil
	}
	if !until.IsZero() && !es.stopped {
		es.expiry = time.AfterFunc(time.Until(until), expire)
	}
	old := es.rules
	if r == nil {
		es.rules = egress.Rights{}
		es.proxy.SetPolicy(egress.Deny{})
	} else {
		es.rules = *r
		es.proxy.SetPolicy(*r)
	}
	for _, e := range old.Rights.Egress {
		if !slices.Contains(es.rules.Rights.Egress, e) && !grant.NamesLooseRight(e) {
			es.proxy.CloseRight(e)
		}
	}
	// loose allows what the cap allows: a changed cap may take hosts away.
	if old.Rights.Loose && (!es.rules.Rights.Loose || !slices.Equal(old.Cap.Egress, es.rules.Cap.Egress) || (old.Cap.Egress == nil) != (es.rules.Cap.Egress == nil)) {
		es.proxy.CloseRight(grant.LooseRight)
	}
}

// RefreshEgress rebuilds the egress policy of sandbox name from the store
// (its rights and its repository's cap) and cuts the live connections of
// the rights it no longer holds. Call it after a sandbox's rights change;
// a sandbox not served has nothing to refresh.
func (b *Broker) RefreshEgress(ctx context.Context, name string) error {
	srv := b.server(name)
	if srv == nil || srv.egress == nil {
		return nil
	}
	srv.egress.refresh(func() (*egress.Rights, time.Time) { return b.egressRights(ctx, name) }, b.expireEgress(name))
	return nil
}

// egressHook is the orchestrator's EgressHook: the sandbox's proxy is
// refreshed, then next (a test's observer), if any, is told.
type egressHook struct {
	b    *Broker
	next orchestrate.EgressHook
}

func (h egressHook) Changed(sandbox string, ended []store.Right) {
	h.b.RefreshEgress(h.b.ctx, sandbox)
	if h.next != nil {
		h.next.Changed(sandbox, ended)
	}
}

// logEgress writes one connection's record to the broker log.
func (b *Broker) logEgress(r egress.Record) {
	b.log.Info("egress", "sandbox", r.Sandbox, "host", r.Host, "port", r.Port, "right", r.Right,
		"up", r.Up, "down", r.Down, "verdict", string(r.Verdict), "reason", r.Reason, "duration", r.Duration)
}
