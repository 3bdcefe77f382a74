package broker

import (
	"agentbox/internal/wire"
	"context"
	"errors"
)

// The connection's caller (wire.Caller) rides in its context.
type callerKey struct{}

// errNoCaller: a request reached a handler without an identity; refuse.
var errNoCaller = errors.New("connection has no caller identity")

func withCaller(ctx context.Context, c wire.Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

func callerFrom(ctx context.Context) (wire.Caller, error) {
	c, ok := ctx.Value(callerKey{}).(wire.Caller)
	if !ok || c.Sandbox == "" {
		return wire.Caller{}, errNoCaller
	}
	return c, nil
}
