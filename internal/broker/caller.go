package broker

import (
	"context"
	"errors"
)

// Caller is who is speaking on a connection, fixed when the connection is
// accepted, from the listener that accepted it. Nothing in a request can
// change it.
type Caller struct {
	Sandbox string // sandbox name (short name)
	Role    string // store.RoleOrchestrator or store.RoleChild
	Parent  string // a child's orchestrator
}

type callerKey struct{}

// errNoCaller: a request reached a handler without an identity; refuse.
var errNoCaller = errors.New("connection has no caller identity")

func withCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

func callerFrom(ctx context.Context) (Caller, error) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	if !ok || c.Sandbox == "" {
		return Caller{}, errNoCaller
	}
	return c, nil
}
