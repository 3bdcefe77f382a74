package broker

import (
	"fmt"
	"sync"

	"agentbox/internal/modelproxy"
	"agentbox/internal/store"
)

// The budget of model request bodies. A model socket reads a request's
// body whole (at most modelproxy.MaxRequestBytes) before it forwards it
// and holds it until the request has ended, for up to
// modelproxy.MaxConcurrent requests at once. Those bounds multiply with
// an orchestrator's children and its LiteLLM profiles: one tree could
// hold gigabytes of the broker's memory with bodies it sends all but the
// last byte of, or whose answers it keeps streaming.
const (
	// TreeMaxModelBodyBytes is what the model request bodies of one
	// orchestrator and all its children may hold at once: 8 bodies of the
	// largest size.
	TreeMaxModelBodyBytes = 8 * modelproxy.MaxRequestBytes
	// OrchestratorMaxModelBodyBytes is what an orchestrator's own bodies
	// may hold, half of its tree's, and ChildMaxModelBodyBytes one
	// child's, a quarter: the children together hold at most the other
	// half (treeshare.go).
	OrchestratorMaxModelBodyBytes = TreeMaxModelBodyBytes / 2
	ChildMaxModelBodyBytes        = TreeMaxModelBodyBytes / 4
)

// bodyBudget admits the bytes of model request bodies: at most treeMax
// per orchestrator tree, shared between an orchestrator and its children
// (treeshare.go).
type bodyBudget struct {
	treeMax int64

	mu               sync.Mutex
	treeTally[int64] // bytes admitted and not yet released
}

func newBodyBudget(treeMax int64) *bodyBudget {
	return &bodyBudget{treeMax: treeMax, treeTally: newTreeTally[int64]()}
}

// admit takes n bytes for one body of sandbox (its uuid, name for the
// refusal; child: not tree's orchestrator) of tree, or says which bound
// refuses them.
func (c *bodyBudget) admit(tree, sandbox, name string, child bool, n int64) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if held, share := c.bySandbox[sandbox], sandboxShare(c.treeMax, child); held+n > share {
		return nil, fmt.Errorf("sandbox %s holds %s of model request bodies at once and this one may hold %s: more than it may (%s, %s of its tree's); try again when a request has ended", name, mib(held), mib(n), mib(share), shareName(child))
	}
	if held, share := c.childrenOf[tree], childrenShare(c.treeMax); child && held+n > share {
		return nil, fmt.Errorf("the children of orchestrator %s hold %s of model request bodies at once and this one may hold %s: more than they may together (%s, half of their tree's: the rest is kept for %s); try again when a request has ended", tree, mib(held), mib(n), mib(share), tree)
	}
	// The orchestrator's share and its children's together are treeMax:
	// the tree stays within it.
	c.add(tree, sandbox, child, n)
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.add(tree, sandbox, child, -n)
		})
	}, nil
}

// mib is n bytes in MiB, to one decimal.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// admitBody is a model socket's AdmitBody for sb.
func (b *Broker) admitBody(sb store.Sandbox) func(int64) (func(), error) {
	tree, child := sb.Tree(), sb.Parent != ""
	return func(n int64) (func(), error) { return b.modelBodies.admit(tree, sb.UUID, sb.Name, child, n) }
}
