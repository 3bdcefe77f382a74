// Package admittest stands in for the broker's connection budget in the
// tests of the sockets that ask it (egress, modelproxy): it refuses or
// admits each connection, and counts the admissions not yet given back.
package admittest

import (
	"sync"
	"testing"

	"agentbox/internal/testutil/wait"
)

// Gate is an AdmitConn for a proxy's Config.
type Gate struct {
	mu     sync.Mutex
	refuse error // nil admits
	held   int
}

// Refuse makes every later connection refused with err (nil: admitted).
func (g *Gate) Refuse(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refuse = err
}

// AdmitConn refuses or admits one connection.
func (g *Gate) AdmitConn() (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refuse != nil {
		return nil, g.refuse
	}
	g.held++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.held--
	}, nil
}

// WaitReleased waits until every admission was given back.
func (g *Gate) WaitReleased(t testing.TB) {
	t.Helper()
	wait.For(t, "every admitted connection to give its place back", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.held == 0
	})
}
