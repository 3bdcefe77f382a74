// Package serial runs the broker's mutations one at a time, in arrival
// order, and lets a mutation step out of line while it waits on work it
// does not control.
//
// An Executor hands out turns. A holder's context carries its turn; when
// the holder runs something slow that another party controls (git inside
// a sandbox, a transfer from one, an fsync shared with other writers) it
// wraps that in Outside, which gives the turn to the next waiter and
// queues for a new one afterwards. So a sandbox that stalls its own git
// stalls only the request that runs it: every other mutation runs in the
// meantime. What a holder read before Outside may have changed after it:
// it reads the store again where that matters.
package serial

import (
	"context"
	"errors"
	"slices"
	"sync"
)

// ErrFull is returned by Run when the queue already holds its cap.
var ErrFull = errors.New("the executor's queue is full")

// Executor runs one holder at a time, first come first served.
type Executor struct {
	// Cap bounds the waiting holders; 0 means unbounded.
	Cap int

	mu    sync.Mutex
	busy  bool
	queue []chan struct{} // waiting turns, oldest first; closed = your turn
}

// Wait queues for a turn and returns once it is the caller's: ErrFull when
// Cap holders already wait; ctx's error when ctx ends first (nothing was
// taken). The caller must Release the turn. Wait never hands a turn to a
// caller whose ctx ended: a turn that arrives as ctx ends is passed on.
func (e *Executor) Wait(ctx context.Context) error { return e.wait(ctx, true) }

// wait is Wait; a turn taken back after Outside ignores Cap (capped false):
// it was in line already.
func (e *Executor) wait(ctx context.Context, capped bool) error {
	e.mu.Lock()
	if !e.busy {
		e.busy = true
		e.mu.Unlock()
		return nil
	}
	if capped && e.Cap > 0 && len(e.queue) >= e.Cap {
		e.mu.Unlock()
		return ErrFull
	}
	turn := make(chan struct{})
	e.queue = append(e.queue, turn)
	e.mu.Unlock()
	select {
	case <-turn:
		if ctx.Err() != nil { // it came as the caller left
			e.Release()
			return ctx.Err()
		}
		return nil
	case <-ctx.Done():
		e.mu.Lock()
		if i := slices.Index(e.queue, turn); i >= 0 {
			e.queue = slices.Delete(e.queue, i, i+1)
			e.mu.Unlock()
			return ctx.Err()
		}
		e.mu.Unlock()
		e.Release() // handed over as the caller left: pass it on
		return ctx.Err()
	}
}

// Waiting is how many holders wait for a turn.
func (e *Executor) Waiting() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.queue)
}

// Release hands the turn to the oldest waiter, or frees the executor.
func (e *Executor) Release() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.queue) == 0 {
		e.busy = false
		return
	}
	next := e.queue[0]
	e.queue = slices.Delete(e.queue, 0, 1)
	close(next)
}

// Run runs fn holding a turn (Wait, then Release after fn); fn's context
// carries the turn, for Outside.
func (e *Executor) Run(ctx context.Context, fn func(context.Context)) error {
	if err := e.Wait(ctx); err != nil {
		return err
	}
	ctx, end := Holding(ctx, e)
	defer end()
	fn(ctx)
	return nil
}

// Holding returns ctx carrying a turn of e that the caller holds (got
// with Wait), so Outside calls under it can give the turn away; end gives
// the turn up, and the caller must not Release it itself. A goroutine the
// holder started may still be in Outside when the holder ends: the turn
// is then not the holder's (Outside gave it away), so end releases
// nothing and that Outside does not take a turn back when it returns.
// Outside under the context after end runs fn in place: the turn is no
// longer the context's to give.
func Holding(ctx context.Context, e *Executor) (_ context.Context, end func()) {
	t := &turn{e: e}
	return context.WithValue(ctx, turnKey{}, t), func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.ended {
			return
		}
		t.ended = true
		if t.away == 0 {
			e.Release()
		}
	}
}

// Pin returns ctx under which Outside keeps the turn (runs fn in place).
// A holder pins before it takes a mutex of its own: were the turn given
// away while it holds the mutex, the next holder could wait for that
// mutex while the pinned one waits for the turn.
func Pin(ctx context.Context) context.Context {
	t, _ := ctx.Value(turnKey{}).(*turn)
	return context.WithValue(context.WithValue(ctx, pinnedKey{}, t), turnKey{}, (*turn)(nil))
}

// Unpin returns a pinned ctx with its turn again, for Outside: a step of
// the pinned holder that may run out of line because nobody waits with a
// turn for what the holder holds (a mutex every taker waits for
// outside its turn). Unpin of a ctx never pinned is ctx.
func Unpin(ctx context.Context) context.Context {
	t, ok := ctx.Value(pinnedKey{}).(*turn)
	if !ok {
		return ctx
	}
	return context.WithValue(ctx, turnKey{}, t)
}

type turnKey struct{}

// pinnedKey holds the turn a Pin hid.
type pinnedKey struct{}

// turn is one holder's turn. Outside calls may overlap (the two ends of a
// transfer): the first gives the turn away, the last takes a new one.
type turn struct {
	e     *Executor
	mu    sync.Mutex
	away  int
	ended bool // the holder let the turn go (Holding's end)
}

// Outside runs fn without the turn ctx carries, if any: the executor
// serves others meanwhile, and Outside returns once fn has and the turn is
// the caller's again. Without a turn in ctx, it just runs fn.
func Outside(ctx context.Context, fn func()) {
	t, _ := ctx.Value(turnKey{}).(*turn)
	if t == nil {
		fn()
		return
	}
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		fn()
		return
	}
	if t.away++; t.away == 1 {
		t.e.Release()
	}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.away--; t.away == 0 && !t.ended {
			// The holder's own context may have ended; it still needs its
			// turn back to finish what it started.
			t.e.wait(context.WithoutCancel(ctx), false)
		}
	}()
	fn()
}
