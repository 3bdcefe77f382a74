package broker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"agentbox/internal/serial"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// opSpec is one op. Where an op runs is the handler's business: list,
// read and ack take a store-query slot (runQuery), children, status and
// grant read the last round's snapshot, send takes the executor (runExec)
// and next parks on its sandbox's inbox.
type opSpec struct {
	// orchestratorOnly ops are refused to children by the dispatcher, so
	// handlers do not repeat the check.
	orchestratorOnly bool
	run              func(b *Broker, ctx context.Context, call *call) *reply
}

// call is one request in a handler's hands.
type call struct {
	caller wire.Caller
	srv    *sandboxServer
	cc     *connCtx
	args   json.RawMessage
}

var ops = map[string]opSpec{
	"list":     {run: (*Broker).opList},
	"read":     {run: (*Broker).opRead},
	"ack":      {run: (*Broker).opAck},
	"children": {orchestratorOnly: true, run: (*Broker).opChildren},
	"status":   {run: (*Broker).opStatus},
	"grant":    {run: (*Broker).opGrant},
	"next":     {run: (*Broker).opNext},
	"send":     {run: (*Broker).opSend},
}

func (b *Broker) dispatch(ctx context.Context, srv *sandboxServer, cc *connCtx, req *wire.Request) *reply {
	caller, err := callerFrom(ctx)
	if err != nil {
		return replyErr(wire.Errorf(wire.CodeDenied, "connection has no caller identity"))
	}
	spec, ok := ops[req.Op]
	if !ok {
		return replyErr(wire.Errorf(wire.CodeUnknownOp, "unknown op %q", truncate(req.Op, 32)))
	}
	if spec.orchestratorOnly && caller.Role != wire.RoleOrchestrator {
		return replyErr(wire.Errorf(wire.CodeDenied, "%s is for orchestrators", req.Op))
	}
	c := &call{caller: caller, srv: srv, cc: cc, args: req.Args}
	rep := spec.run(b, ctx, c)
	b.log.Debug("request", "op", req.Op, "sandbox", caller.Sandbox, "ok", rep.resp != nil && rep.resp.OK)
	return rep
}

// decodeArgs decodes an op's arguments strictly; absent args decode as {}.
func decodeArgs(raw json.RawMessage, v any) *wire.Error {
	if len(raw) == 0 || string(raw) == "null" || string(raw) == "{}" {
		return nil
	}
	if err := wire.DecodeStrict(raw, v); err != nil {
		return wire.Errorf(wire.CodeBadRequest, "invalid arguments: %s", truncate(err.Error(), 120))
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

var errBusyQueries = wire.Errorf(wire.CodeBusy, "the broker's query queue is full; retry")

// queryPool bounds store queries broker-wide: QueryWorkers run at once and
// QueryQueueCap more may wait. A query runs on its own connection's
// goroutine once it holds a worker slot, so a query served from the cache
// costs no hand-off to another goroutine.
type queryPool struct {
	admitted atomic.Int32  // running + waiting
	workers  chan struct{} // one token per running query

	mu     sync.Mutex
	byTree map[string]int // running + waiting, by orchestrator tree
}

// share is the most queries tree may hold queued or running now: the
// broker-wide total divided among the trees holding queries, tree itself
// and one more, and never less than one sandbox's own cap
// (MaxQueriesPerSandbox: with many trees querying, the broker-wide queue
// is the bound). A fixed share per tree let two trees fill the queue
// together; with room kept for one more tree, a tree that has no query
// waits for no hostile tree's to end while fewer than about 33 trees hold
// queries (TestStoreQueriesShared). Alone, a tree gets TreeMaxQueries.
// Call with p.mu held.
func (p *queryPool) share(tree string) int {
	trees := len(p.byTree) + 1 // and one more
	if _, ok := p.byTree[tree]; !ok {
		trees++
	}
	return max(MaxQueriesPerSandbox, (QueryWorkers+QueryQueueCap)/trees)
}

// admitTree takes one of tree's share of the queries; when none is left
// it returns false, what tree holds and its share.
func (p *queryPool) admitTree(tree string) (ok bool, held, share int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if share := p.share(tree); p.byTree[tree] >= share {
		return false, p.byTree[tree], share
	}
	if p.byTree == nil {
		p.byTree = map[string]int{}
	}
	p.byTree[tree]++
	return true, 0, 0
}

func (p *queryPool) releaseTree(tree string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byTree[tree]--; p.byTree[tree] <= 0 {
		delete(p.byTree, tree)
	}
}

// runQuery runs fn as a store query: at most MaxQueriesPerSandbox queued or
// running per sandbox (more wait here, in their connection), and busy when
// the sandbox's tree holds its share (queryPool.share) or the broker-wide
// queue is full.
func (b *Broker) runQuery(ctx context.Context, srv *sandboxServer, op string, fn func()) error {
	select {
	case srv.querySem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-srv.querySem }()
	tree := cmp.Or(srv.caller.Parent, srv.caller.Sandbox)
	if ok, held, share := b.queries.admitTree(tree); !ok {
		return wire.Errorf(wire.CodeBusy, "orchestrator %s and its children have %d store queries queued or running, at most %d now (the broker's %d, shared by the trees that query and one more); retry",
			tree, held, share, QueryWorkers+QueryQueueCap)
	}
	defer b.queries.releaseTree(tree)
	if b.queries.admitted.Add(1) > QueryWorkers+QueryQueueCap {
		b.queries.admitted.Add(-1)
		return errBusyQueries
	}
	defer b.queries.admitted.Add(-1)
	select {
	case b.queries.workers <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-b.queries.workers }()
	if h := b.queryHook.Load(); h != nil {
		(*h)(op)
	}
	fn()
	return nil
}

var (
	errBusyExec = wire.Errorf(wire.CodeBusy, "the broker's executor queue is full; retry")
	errDropped  = errors.New("request dropped: the client disconnected while it was queued")
)

// runExec runs fn on the executor (b.executor: send and host mutations,
// one at a time, in arrival order; package serial). At most ExecQueueCap
// requests wait (more get busy). While a request waits its turn, its
// connection is watched: a client that disconnects then has its request
// dropped, never run. Once fn runs it runs to the end; fn's context
// carries the turn, which sandbox-side work gives away (serial.Outside).
// cc is nil for requests with no connection to watch. lane, when not nil,
// is the requesting sandbox's own queue (sandboxServer.sends), taken
// before the executor's line.
func (b *Broker) runExec(ctx context.Context, cc *connCtx, lane chan struct{}, fn func(context.Context)) error {
	waitCtx, stop := ctx, func() {}
	if cc != nil {
		waitCtx, stop = cc.watchHangup(ctx)
	}
	if lane != nil {
		select {
		case lane <- struct{}{}:
			defer func() { <-lane }()
		case <-waitCtx.Done():
			stop()
			return errDropped
		}
	}
	err := b.executor.Wait(waitCtx)
	stop()
	switch {
	case errors.Is(err, serial.ErrFull):
		return errBusyExec
	case err != nil:
		return errDropped
	}
	ctx, end := serial.Holding(ctx, &b.executor)
	defer end()
	if h := b.execHook.Load(); h != nil {
		(*h)()
	}
	if b.ctx.Err() != nil {
		return errDropped
	}
	fn(ctx)
	return nil
}

// notify wakes the parked next of sandbox name, if it is served.
func (b *Broker) notify(name string) {
	if s := b.server(name); s != nil {
		s.signal()
	}
}

func storeErr(err error, what string) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return wire.Errorf(wire.CodeNotFound, "%s", what)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}
