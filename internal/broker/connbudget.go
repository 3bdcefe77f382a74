package broker

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"agentbox/internal/store"
)

// The budget of model and egress connections. Each sandbox's sockets
// bound their own connections (modelproxy.MaxConns per model socket,
// egress.MaxConns), but those bounds multiply with the children of an
// orchestrator and with its LiteLLM profiles: one tree could otherwise
// take every descriptor the broker may open, and then no sandbox could
// connect, no git could run and no host command could reach the broker.
const (
	// DefaultTreeMaxConns is tree.max_connections when broker.yaml does
	// not set it: the model and egress connections one orchestrator and
	// all its children may hold open at once.
	DefaultTreeMaxConns = 1024
	// ReservedDescriptors are kept out of the connection budget for the
	// broker's own work: broker.db, the admin socket and its connections,
	// the backend's commands.
	ReservedDescriptors = 1024
	// descriptorsPerSandbox are kept out of it for each sandbox served:
	// its MaxConnsPerSandbox protocol connections and the pipes of its
	// one request in flight (a git transfer, an exec).
	descriptorsPerSandbox = MaxConnsPerSandbox + 8
	// descriptorsPerConn is what one model or egress connection may hold:
	// the sandbox's end and the upstream's.
	descriptorsPerConn = 2
	// lowConnBudget: with room for fewer connections than this (before
	// any sandbox's reserve), the broker warns when it opens.
	lowConnBudget = 256
)

// connBudget admits model and egress connections: at most treeMax per
// orchestrator tree, shared between an orchestrator and its children
// (treeshare.go), and no more across all sandboxes than the descriptors
// left once the reserves are kept. A sandbox's own sockets may take more
// than a tree's bound (64 on each model socket, 256 on its egress proxy).
type connBudget struct {
	treeMax     int
	descriptors int // the process's limit less what it had open and ReservedDescriptors

	mu             sync.Mutex
	held           int // connections admitted and not yet released
	treeTally[int]     // held, by tree, children and sandbox
}

func newConnBudget(treeMax, descriptors int) *connBudget {
	return &connBudget{treeMax: treeMax, descriptors: descriptors, treeTally: newTreeTally[int]()}
}

// admit takes a place for one connection of sandbox (its uuid, name for
// the refusal; child: not tree's orchestrator) of tree while served
// sandboxes are served, or says which bound refuses it.
func (c *connBudget) admit(tree, sandbox, name string, child bool, served int) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.bySandbox[sandbox]; n >= sandboxShare(c.treeMax, child) {
		return nil, fmt.Errorf("sandbox %s holds %d model and egress connections at once, the most it may (%s of tree.max_connections); close some and try again", name, n, shareName(child))
	}
	if n := c.childrenOf[tree]; child && n >= childrenShare(c.treeMax) {
		return nil, fmt.Errorf("the children of orchestrator %s hold %d model and egress connections at once, the most they may together (half of tree.max_connections: the rest is kept for %s); close some and try again", tree, n, tree)
	}
	if n := c.byTree[tree]; n >= c.treeMax {
		return nil, fmt.Errorf("orchestrator %s and its children hold %d model and egress connections at once, the most tree.max_connections allows; close some and try again", tree, n)
	}
	if (c.held+1)*descriptorsPerConn > c.descriptors-served*descriptorsPerSandbox {
		return nil, fmt.Errorf("the broker holds as many model and egress connections as its open-file limit allows (%d across all sandboxes); try again later", c.held)
	}
	c.held++
	c.add(tree, sandbox, child, 1)
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.held--
			c.add(tree, sandbox, child, -1)
		})
	}, nil
}

// spareDescriptors is how many more descriptors this process may open
// beyond what it holds now and ReservedDescriptors: RLIMIT_NOFILE's soft
// limit (which Go raises to the hard one at start) less the descriptors
// open in /proc/self/fd. Unknown (no /proc) counts as the limit alone.
func spareDescriptors() (int, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("open-file limit: %w", err)
	}
	open := 0
	if names, err := os.ReadDir("/proc/self/fd"); err == nil {
		open = len(names)
	}
	return int(min(lim.Cur, 1<<30)) - open - ReservedDescriptors, nil
}

// admitConn is a model or egress socket's AdmitConn for sb.
func (b *Broker) admitConn(sb store.Sandbox) func() (func(), error) {
	tree, child := sb.Tree(), sb.Parent != ""
	return func() (func(), error) {
		b.mu.Lock()
		served := len(b.serving)
		b.mu.Unlock()
		return b.proxyConns.admit(tree, sb.UUID, sb.Name, child, served)
	}
}
