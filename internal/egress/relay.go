package egress

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The relay runs inside its sandbox's task (pids) limit, which the
// sandbox's own processes may fill, and a Go program aborts when it cannot
// make a thread its scheduler needs (package threads). Waiting on a socket
// costs no thread (the runtime's poller does it), but a goroutine in a
// system call holds its thread, and when the call is slow (the kernel
// preempted the thread on a loaded machine) the scheduler hands the
// goroutine's P to another thread, made if none is idle. So however many
// connections it serves, the relay has at most relaySyscalls goroutines in
// a system call at once: every system call of a connection goes through
// syscallGate. Its listener's one accepting goroutine is the only other.
// The threads it can need are then bounded: its Ps, the gate's, the
// accepting goroutine's, the poller's, and the runtime's own.
const relaySyscalls = 2

// What a relay process reserves as it starts (threads.Reserve): Ps to run
// Go code on, and a thread for each of them, for each gate slot, for the
// accepting goroutine and for the poller's wait.
const (
	RelayProcs   = 2
	RelayThreads = RelayProcs + relaySyscalls + 2
)

// syscallGate holds a slot per connection goroutine in a system call.
var syscallGate = make(chan struct{}, relaySyscalls)

// afterSyscall runs in the gate after each system call: tests make it a
// slow system call of its own.
var afterSyscall = func() {}

// gated runs f, which makes system calls but never waits on the poller,
// holding a slot of the gate.
func gated(f func() error) error {
	syscallGate <- struct{}{}
	defer func() { <-syscallGate }()
	err := f()
	afterSyscall()
	return err
}

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
	defer gated(c.Close)
	// A Unix socket's connect never waits on the poller: it succeeds or
	// fails at once (EAGAIN when the proxy's backlog is full).
	var up net.Conn
	if err := gated(func() (err error) { up, err = net.Dial("unix", sock); return err }); err != nil {
		return
	}
	defer gated(up.Close)
	down, err1 := c.(syscall.Conn).SyscallConn()
	upRaw, err2 := up.(syscall.Conn).SyscallConn()
	if err1 != nil || err2 != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		endPump(upRaw, down, pump(upRaw, down))
		close(done)
	}()
	endPump(down, upRaw, pump(down, upRaw))
	<-done
}

// pump copies src to dst until src ends (nil) or a side fails.
func pump(dst, src syscall.RawConn) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := readRaw(src, buf)
		if n > 0 {
			if err := writeRaw(dst, buf[:n]); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// endPump passes on the end of one direction: src's end as a half-close
// of dst, a failure as the end of both ways (a shutdown, which wakes the
// other direction's wait; the descriptors are closed once both ended).
func endPump(dst, src syscall.RawConn, err error) {
	if err == nil {
		shutdownRaw(dst, unix.SHUT_WR)
		return
	}
	shutdownRaw(dst, unix.SHUT_RDWR)
	shutdownRaw(src, unix.SHUT_RDWR)
}

// readRaw reads once from rc into b, waiting on the poller (outside the
// gate) while there is nothing to read; io.EOF at the end.
func readRaw(rc syscall.RawConn, b []byte) (int, error) {
	var n int
	var err error
	werr := rc.Read(func(fd uintptr) bool {
		n, err = gatedIO(func() (int, error) { return unix.Read(int(fd), b) })
		return err != unix.EAGAIN
	})
	switch {
	case werr != nil:
		return 0, werr
	case err != nil:
		return 0, err
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// writeRaw writes all of b to rc, waiting on the poller (outside the
// gate) while rc takes no more.
func writeRaw(rc syscall.RawConn, b []byte) error {
	for len(b) > 0 {
		var n int
		var err error
		werr := rc.Write(func(fd uintptr) bool {
			n, err = gatedIO(func() (int, error) { return unix.Write(int(fd), b) })
			return err != unix.EAGAIN
		})
		if werr != nil {
			return werr
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// gatedIO runs one read or write in the gate, again when a signal
// interrupted it.
func gatedIO(f func() (int, error)) (int, error) {
	var n int
	err := gated(func() error {
		for {
			var err error
			if n, err = f(); err != unix.EINTR {
				return err
			}
		}
	})
	return max(n, 0), err
}

// shutdownRaw shuts rc down for how; a socket already gone is no matter.
func shutdownRaw(rc syscall.RawConn, how int) {
	rc.Control(func(fd uintptr) {
		gated(func() error { return unix.Shutdown(int(fd), how) })
	})
}
