package serial

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holders counts who holds a turn, failing the test on any overlap.
type holders struct {
	t *testing.T
	n atomic.Int32
}

func (h *holders) in() {
	if h.n.Add(1) != 1 {
		h.t.Error("two holders at once")
	}
}
func (h *holders) out() { h.n.Add(-1) }

// TestOutsideLetsOthersRun: a holder waiting in Outside does not keep
// another from running, and has its turn back (alone) afterwards.
func TestOutsideLetsOthersRun(t *testing.T) {
	var e Executor
	h := &holders{t: t}
	release := make(chan struct{})
	inside := make(chan struct{})
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		e.Run(context.Background(), func(ctx context.Context) {
			h.in()
			h.out()
			Outside(ctx, func() {
				close(inside)
				<-release // a stalled sandbox, say
			})
			h.in() // the turn is A's again
			h.out()
		})
	}()
	<-inside
	// B runs to the end while A is outside.
	if err := e.Run(context.Background(), func(context.Context) { h.in(); h.out() }); err != nil {
		t.Fatal(err)
	}
	close(release)
	<-aDone
	// And the executor is free again.
	if err := e.Run(context.Background(), func(context.Context) {}); err != nil {
		t.Fatal(err)
	}
}

// TestOverlappingOutside: the two ends of a transfer step outside at
// once; the turn goes once and comes back once, after both.
func TestOverlappingOutside(t *testing.T) {
	var e Executor
	h := &holders{t: t}
	both := make(chan struct{})
	var bRan atomic.Bool
	e.Run(context.Background(), func(ctx context.Context) {
		h.in()
		h.out()
		var wg sync.WaitGroup
		var entered sync.WaitGroup
		entered.Add(2)
		for range 2 {
			wg.Go(func() {
				Outside(ctx, func() {
					entered.Done()
					<-both
				})
			})
		}
		entered.Wait()
		// Both ends are outside: another holder runs.
		if err := e.Run(context.Background(), func(context.Context) { h.in(); bRan.Store(true); h.out() }); err != nil {
			t.Error(err)
		}
		close(both)
		wg.Wait()
		h.in()
		h.out()
	})
	if !bRan.Load() {
		t.Fatal("another holder did not run while both ends were outside")
	}
}

// TestWaitCap: Cap bounds the waiters (ErrFull past it); a turn taken
// back after Outside waits in line even when the queue is full.
func TestWaitCap(t *testing.T) {
	e := Executor{Cap: 1}
	h := &holders{t: t}
	outside := make(chan struct{})
	back := make(chan struct{})
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		e.Run(context.Background(), func(ctx context.Context) {
			Outside(ctx, func() { close(outside); <-back })
			h.in() // A's turn again: nobody else holds one
			h.out()
		})
	}()
	<-outside
	// W1 holds the turn A gave away; W2 fills the queue.
	w1Holds, w1Go := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 2)
	go func() {
		errs <- e.Run(context.Background(), func(context.Context) { h.in(); close(w1Holds); <-w1Go; h.out() })
	}()
	<-w1Holds
	go func() { errs <- e.Run(context.Background(), func(context.Context) { h.in(); h.out() }) }()
	waitQueue(&e, 1)
	if err := e.Wait(context.Background()); !errors.Is(err, ErrFull) {
		t.Fatalf("wait past the cap: %v, want ErrFull", err)
	}
	close(back) // A comes back with the queue full: it waits in line
	waitQueue(&e, 2)
	close(w1Go)
	<-aDone
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// waitQueue spins until n holders wait.
func waitQueue(e *Executor, n int) {
	for {
		e.mu.Lock()
		got := len(e.queue)
		e.mu.Unlock()
		if got == n {
			return
		}
		runtime.Gosched()
	}
}

// TestWaitLeaves: a waiter whose context ends leaves the queue, takes
// nothing, and the executor serves the next.
func TestWaitLeaves(t *testing.T) {
	var e Executor
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- e.Wait(ctx) }()
	waitQueue(&e, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("wait: %v", err)
	}
	e.Release()
	if err := e.Run(context.Background(), func(context.Context) {}); err != nil {
		t.Fatal(err)
	}
}

// TestOutsideWithoutTurn just runs fn.
func TestOutsideWithoutTurn(t *testing.T) {
	ran := false
	Outside(context.Background(), func() { ran = true })
	if !ran {
		t.Fatal("fn did not run")
	}
}

// TestPinKeepsTheTurn: under a pinned context Outside keeps the turn, so
// nobody else runs while a holder holds a mutex of its own.
func TestPinKeepsTheTurn(t *testing.T) {
	var e Executor
	h := &holders{t: t}
	inside := make(chan struct{})
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(context.Background(), func(ctx context.Context) {
			h.in()
			Outside(Pin(ctx), func() { close(inside); <-release })
			h.out()
		})
	}()
	<-inside
	bRan := make(chan struct{})
	go func() {
		e.Run(context.Background(), func(context.Context) { h.in(); h.out() })
		close(bRan)
	}()
	waitQueue(&e, 1) // B waits: A kept the turn
	close(release)
	<-done
	<-bRan
}

// TestUnpinGivesTheTurnAway: Outside under an unpinned context gives the
// pinned holder's turn to the next one, and the holder has it back after.
func TestUnpinGivesTheTurnAway(t *testing.T) {
	var e Executor
	inside := make(chan struct{})
	release := make(chan struct{})
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		e.Run(context.Background(), func(ctx context.Context) {
			Outside(Unpin(Pin(ctx)), func() { close(inside); <-release })
		})
	}()
	<-inside
	bRan := make(chan struct{})
	go func() {
		e.Run(context.Background(), func(context.Context) {})
		close(bRan)
	}()
	select {
	case <-bRan: // B ran while A was outside
	case <-time.After(30 * time.Second):
		t.Fatal("B never ran: the unpinned Outside kept A's turn")
	}
	close(release)
	<-aDone
	if got := Unpin(context.Background()); got != context.Background() {
		t.Fatalf("Unpin of a context never pinned changed it")
	}
}

// TestOutsideAfterTheTurnEnded: a goroutine that outlived its request
// steps outside under the request's context: nothing is given away (the
// turn is not its to give), so the executor keeps one holder at a time.
func TestOutsideAfterTheTurnEnded(t *testing.T) {
	var e Executor
	h := &holders{t: t}
	var late context.Context
	e.Run(context.Background(), func(ctx context.Context) { late = ctx })
	if err := e.Wait(context.Background()); err != nil { // H holds the turn
		t.Fatal(err)
	}
	h.in()
	wDone := make(chan struct{})
	go func() {
		e.Run(context.Background(), func(context.Context) { h.in(); h.out() })
		close(wDone)
	}()
	waitQueue(&e, 1)
	// Had this given H's turn away, W would run beside H.
	Outside(late, func() { time.Sleep(50 * time.Millisecond) })
	h.out()
	e.Release()
	<-wDone
}

// TestOutsideOutlivesItsHolder: a holder ends while a goroutine it
// started is still in Outside under its context (the turn given away).
// Its end gives back nothing (the old end released the turn a second
// time), and that Outside, when it returns, takes no turn (the old one
// took a turn nobody would release: the executor served no one again).
func TestOutsideOutlivesItsHolder(t *testing.T) {
	var e Executor
	h := &holders{t: t}
	inside, unblock, gDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	e.Run(context.Background(), func(ctx context.Context) {
		h.in()
		go func() {
			defer close(gDone)
			Outside(ctx, func() { close(inside); <-unblock })
		}()
		<-inside
		h.out()
	})
	others := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a bound on the test only
		defer cancel()
		if err := e.Run(ctx, func(context.Context) { h.in(); h.out() }); err != nil {
			t.Fatalf("another holder got no turn: %v", err)
		}
	}
	others()
	close(unblock)
	<-gDone
	others()
}
