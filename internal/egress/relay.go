package egress

import (
	"errors"
	"io"
	"net"
	"time"
)

// Relay is the in-sandbox end of the proxy: it accepts on ln (the
// sandbox's loopback listener, the address its proxy variables name) and
// joins each connection to a fresh connection to the proxy's Unix socket
// at sock, bytes both ways. The socket is dialled per connection: a
// broker that restarts, or a socket attached after the sandbox started,
// needs nothing of the relay. It returns when ln is closed.
func Relay(ln net.Listener, sock string) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// A transient error (EMFILE) must not end the relay.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go relayOne(c, sock)
	}
}

// relayOne joins c to the proxy; without the proxy, c is closed.
func relayOne(c net.Conn, sock string) {
	up, err := net.Dial("unix", sock)
	if err != nil {
		c.Close()
		return
	}
	done := make(chan struct{})
	go func() {
		_, err := io.Copy(up, c)
		endCopy(up, c, err)
		close(done)
	}()
	_, err = io.Copy(c, up)
	endCopy(c, up, err)
	<-done
	c.Close()
	up.Close()
}
