// Package serve runs the accept loop tests set up on a listener: a
// stand-in broker, destination or echo server.
package serve

import (
	"net"
	"testing"
)

// Serve accepts connections on ln until ln is closed, which happens at
// t's cleanup, and runs handle for each in a goroutine of its own,
// closing the connection when handle returns.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}
