// Package orchestrate holds what each manifest type does, on top of the
// store, the backend and gitx. It knows nothing of sockets: the broker
// hands it a decoded, validated manifest and the requester's identity.
package orchestrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/grant"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// Refusal is a refusal the requester may read: its Detail becomes the
// refused status's detail.
type Refusal struct {
	Detail string
	err    error // a class (ErrNoSuchSandbox), or nil
}

func (r *Refusal) Error() string { return r.Detail }

func (r *Refusal) Unwrap() error { return r.err }

func refusef(format string, args ...any) error { return &Refusal{Detail: fmt.Sprintf(format, args...)} }

// ErrNoSuchSandbox marks a refusal that names a sandbox that does not exist.
var ErrNoSuchSandbox = errors.New("no such sandbox")

// AsRefusal reports whether err is a refusal and returns it.
func AsRefusal(err error) (*Refusal, bool) {
	var r *Refusal
	ok := errors.As(err, &r)
	return r, ok
}

// Orchestrator runs manifests.
type Orchestrator struct {
	Store   *store.Store
	Backend backend.Backend
	// Notify is called with the name of every sandbox whose inbox changed.
	Notify func(sandbox string)
	// Sandboxes configures new sandboxes.
	Sandboxes Sandboxes
	// Caps bound each orchestrator's children, queued spawns and spawns
	// an hour.
	Caps Caps
	// Log records failures whose cause stays out of statuses (nil: the
	// default logger).
	Log *slog.Logger
	// Go runs long work (a spawn's worker) in the background, with a
	// context that ends when the broker shuts down; nil: spawns stay
	// recorded and nothing creates them (tests of this package).
	Go func(func(ctx context.Context))
	// LogDir holds the worker logs ("": none).
	LogDir string
	// Serial runs background mutations (a done child's destroy) in order
	// with the broker's executor; nil: directly.
	Serial func(context.Context, func(context.Context))
	// Serve starts serving a sandbox's broker socket (the broker's
	// listener, attached to the sandbox); Unserve stops it and removes
	// the socket's directory. Nil: no sockets (tests of this package).
	Serve   func(sb store.Sandbox) error
	Unserve func(name string)
	// ModelSockets: the broker serves every orchestrator and child a model
	// socket, so their homes are seeded for Claude Code (no first-run
	// dialog) when they are made.
	ModelSockets bool
	// LiteLLMProfiles are the LiteLLM profiles the model sockets serve
	// (broker.yaml model.litellm): a claude-jb runner naming another is
	// refused as not served.
	LiteLLMProfiles map[string]bool
	// Egress is told when an egress or loose right ends (nil: no proxy).
	Egress EgressHook
	// Publishing serves publish manifests (nil: publish is refused).
	Publishing *Publishing

	mu sync.Mutex
	// queueMu makes counting an orchestrator's slots and taking one (a
	// queued child's claim, an admission) one step.
	queueMu sync.Mutex
	// spawns counts each orchestrator's spawns of the last hour (under
	// queueMu); now is its clock (nil: time.Now; tests move it).
	spawns spawnRate
	now    func() time.Time
	// rightsMu makes reading a sandbox's rights, attaching or detaching
	// their mounts and recording the change one step (manifests, host
	// changes, expiry and re-attachment at start alike).
	rightsMu   sync.Mutex
	inflight   inflight               // commands running in sandboxes, for Interrupt
	unitStops  unitStops              // the broker's stops of each sandbox's unit
	grants     map[string]grant.Grant // parsed grant documents by their text
	finishing  map[string]bool        // orchestrators whose pending finishes run (ScheduleFinishes)
	publishing map[string]string      // orchestrator -> its running publish manifest (one at a time)
}

func (o *Orchestrator) notify(names ...string) {
	if o.Notify == nil {
		return
	}
	for _, n := range names {
		o.Notify(n)
	}
}

// childOf returns the requester's child named name, or the spec's refusal
// with the closest names among the requester's own children.
func (o *Orchestrator) childOf(ctx context.Context, req wire.Caller, name string) (store.Sandbox, error) {
	sb, err := o.Store.Sandbox(ctx, name)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !isChildOf(sb, req.Sandbox)) {
		hint := o.suggest(ctx, name, func(sb store.Sandbox) bool { return isChildOf(sb, req.Sandbox) })
		return store.Sandbox{}, refusef("`%s` is not a child of this orchestrator%s", name, hint)
	}
	return sb, err
}

func isChildOf(sb store.Sandbox, orchestrator string) bool {
	return sb.Role == wire.RoleChild && sb.Parent == orchestrator
}
