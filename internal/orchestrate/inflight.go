package orchestrate

import (
	"context"
	"errors"
	"sync"
)

// errInterrupted ends the commands a sandbox runs for the broker when the
// host stops or force-destroys it.
var errInterrupted = errors.New("the sandbox was stopped or destroyed on the host")

// inflight tracks the commands running in each sandbox for the broker, so
// a host stop or destroy --force ends them instead of waiting on them.
type inflight struct {
	mu      sync.Mutex
	cancels map[string]map[*context.CancelCauseFunc]struct{} // by sandbox
}

// begin registers a command about to run in sandbox name: ctx is cut when
// the sandbox is interrupted; done must be called when the command ends.
func (f *inflight) begin(ctx context.Context, name string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	key := &cancel
	f.mu.Lock()
	if f.cancels == nil {
		f.cancels = map[string]map[*context.CancelCauseFunc]struct{}{}
	}
	if f.cancels[name] == nil {
		f.cancels[name] = map[*context.CancelCauseFunc]struct{}{}
	}
	f.cancels[name][key] = struct{}{}
	f.mu.Unlock()
	return ctx, func() {
		f.mu.Lock()
		delete(f.cancels[name], key)
		if len(f.cancels[name]) == 0 {
			delete(f.cancels, name)
		}
		f.mu.Unlock()
		cancel(nil)
	}
}

// interrupt ends every command running in sandbox name for the broker.
func (f *inflight) interrupt(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for cancel := range f.cancels[name] {
		(*cancel)(errInterrupted)
	}
	return len(f.cancels[name])
}

// Interrupt ends the work the broker does in sandbox name (git reading
// it, a transfer from or into it, a look at its agent): the request it
// serves fails, and no other request waits on it any longer. The host's
// stop and destroy --force call it before they queue.
func (o *Orchestrator) Interrupt(name string) {
	if n := o.inflight.interrupt(name); n > 0 {
		o.logger().Info("ended the broker's commands in a sandbox stopped or destroyed on the host", "sandbox", name, "commands", n)
	}
}

// unitStops counts, per sandbox, the broker's stops of its unit: a host
// start whose last step ran out of line (StartUnit) tells by it whether a
// stop came meanwhile, which a record stopped before and after cannot
// show.
type unitStops struct {
	mu sync.Mutex
	n  map[string]uint64
}

func (u *unitStops) add(name string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n == nil {
		u.n = map[string]uint64{}
	}
	u.n[name]++
}

func (u *unitStops) count(name string) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[name]
}
