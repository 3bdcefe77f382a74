package broker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"agentbox/internal/wire"
)

// acceptLoop accepts connections on ln until the broker shuts down or
// ln is closed. An accept error (EMFILE, ENFILE, ENOBUFS) never ends the
// loop: it backs off from acceptBackoffMin, doubling up to
// acceptBackoffMax, as net/http's server does.
func (b *Broker) acceptLoop(ln *net.UnixListener, what string, handle func(*net.UnixConn)) {
	var delay time.Duration
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || b.ctx.Err() != nil {
				return
			}
			delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
			b.log.Warn("accept failed; retrying", "listener", what, "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-b.ctx.Done():
				return
			}
			continue
		}
		delay = 0
		handle(conn)
	}
}

// serveListener accepts one sandbox's connections. The caller identity is
// the listener's, bound to the connection here and never taken from a
// request.
func (b *Broker) serveListener(srv *sandboxServer) {
	b.acceptLoop(srv.ln, "sandbox "+srv.caller.Sandbox, func(conn *net.UnixConn) {
		if srv.conns.Add(1) > MaxConnsPerSandbox {
			srv.conns.Add(-1)
			b.refuseConn(conn, wire.Errorf(wire.CodeBusy, "too many connections (at most %d per sandbox)", MaxConnsPerSandbox))
			return
		}
		if !srv.track(conn) {
			srv.conns.Add(-1)
			conn.Close()
			return
		}
		b.goWorker(func() {
			ctx := withCaller(b.ctx, srv.caller)
			release := func() {
				srv.untrack(conn)
				srv.conns.Add(-1)
			}
			b.serveConn(ctx, conn, release, func(ctx context.Context, cc *connCtx, req *wire.Request) *reply {
				return b.dispatch(ctx, srv, cc, req)
			})
		})
	})
}

func (b *Broker) refuseConn(conn net.Conn, e *wire.Error) {
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	if line, err := wire.Marshal(wire.Fail(e)); err == nil {
		conn.Write(line)
	}
	conn.Close()
}

// reply is a handler's answer. onLost runs when the reply could not be
// written (the client went away), so promised-but-undelivered items can be
// put back.
type reply struct {
	resp   *wire.Response
	onLost func()
	hangup bool // the client hung up while the request waited: no reply
}

func replyOK(result any) *reply {
	resp, err := wire.OK(result)
	if err != nil {
		return replyErr(err)
	}
	return &reply{resp: resp}
}

func replyErr(err error) *reply { return &reply{resp: wire.Fail(wire.AsError(err))} }

// connCtx lets a handler watch for the client hanging up while it waits.
type connCtx struct {
	conn net.Conn
	r    *bufio.Reader
}

// takeFiles returns the descriptors the client sent with its request (an
// admin connection's exec), or nil.
func (cc *connCtx) takeFiles() []*os.File {
	if rc, ok := cc.conn.(*rightsConn); ok {
		return rc.take()
	}
	return nil
}

// watchHangup returns a context cancelled when the client closes or
// half-closes the connection (a half-close before the reply is a
// disconnect). Pipelined bytes are not a hangup: they stay buffered and are
// read after the reply. stop must be called before the connection is read
// again.
func (cc *connCtx) watchHangup(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	var wg sync.WaitGroup
	wg.Add(1)
	stopping := make(chan struct{})
	go func() {
		defer wg.Done()
		_, err := cc.r.Peek(1)
		select {
		case <-stopping: // deadline set by stop: not a hangup
		default:
			if err != nil {
				cancel()
			}
		}
	}()
	return ctx, func() {
		close(stopping)
		cc.conn.SetReadDeadline(time.Unix(1, 0))
		wg.Wait()
		cc.conn.SetReadDeadline(time.Time{})
		cancel()
	}
}

// hungUp reports, without blocking, whether the client has closed or
// half-closed its side: a zero-byte MSG_PEEK read. Bytes it already sent
// (pipelined requests) mean it has not.
func (cc *connCtx) hungUp() bool {
	if cc.r.Buffered() > 0 {
		return false
	}
	sc, ok := cc.conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	eof := false
	raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		eof = n == 0 && err == nil
		return true
	})
	return eof
}

// readers holds the read buffers of connections between requests: an
// idle connection keeps none (every sandbox may hold MaxConnsPerSandbox
// idle connections, and 1,000 sandboxes' would add up to 32 MiB).
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readBufBytes) }}

// awaitRequest waits, holding no read buffer, until the client sends a
// byte or hangs up; then cc.r reads the connection. Bytes already
// buffered (pipelined requests) keep their buffer.
func (cc *connCtx) awaitRequest() error {
	if cc.r != nil && cc.r.Buffered() > 0 {
		return nil
	}
	cc.releaseReader()
	if err := waitReadable(cc.conn); err != nil {
		return err
	}
	cc.r = readers.Get().(*bufio.Reader)
	cc.r.Reset(cc.conn)
	return nil
}

// releaseReader gives cc's read buffer back to readers.
func (cc *connCtx) releaseReader() {
	if cc.r == nil {
		return
	}
	cc.r.Reset(nil)
	readers.Put(cc.r)
	cc.r = nil
}

// waitReadable blocks until conn has a byte to read, or its end (a
// one-byte MSG_PEEK: nothing is consumed, descriptors sent with the bytes
// stay queued). An error: conn was closed.
func waitReadable(conn net.Conn) error {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return err != syscall.EAGAIN
	})
}

type handlerFunc func(ctx context.Context, cc *connCtx, req *wire.Request) *reply

// serveConn runs one connection: read a line, answer it, and only then
// read the next (one request in flight per connection). release, if not
// nil, gives back the connection's slot just before the connection is
// closed, so a client that has seen the broker close it can connect again
// at once.
func (b *Broker) serveConn(ctx context.Context, conn net.Conn, release func(), handle handlerFunc) {
	defer func() {
		if release != nil {
			release()
		}
		conn.Close()
	}()
	defer func() {
		if p := recover(); p != nil {
			b.log.Error("connection handler panic", "panic", p, "stack", string(debug.Stack()))
		}
	}()
	cc := &connCtx{conn: conn}
	if !b.conns.add(cc) {
		return // shutting down
	}
	defer b.conns.remove(cc)
	defer cc.releaseReader()
	for {
		// Idle between requests: a shutdown closes the connection here.
		if !b.conns.setBusy(cc, false) {
			return
		}
		if err := cc.awaitRequest(); err != nil {
			return // closed
		}
		// A line begun must end in time: its buffer is the broker's.
		conn.SetReadDeadline(time.Now().Add(LineReadTimeout))
		line, err := wire.ReadLine(cc.r, wire.MaxLineBytes)
		conn.SetReadDeadline(time.Time{})
		b.conns.setBusy(cc, true)
		if errors.Is(err, wire.ErrLineTooLong) {
			b.writeReply(conn, &reply{resp: wire.Fail(wire.Errorf(wire.CodeBadRequest, "request line exceeds %d bytes", wire.MaxLineBytes))})
			return
		}
		if err != nil {
			return // EOF, half-close, reset or a line not ended in time
		}
		req, werr := decodeRequest(line)
		var rep *reply
		if werr != nil {
			// Descriptors sent with a line that is no request belong to
			// no request: never to the next one.
			closeFiles(cc.takeFiles())
			rep = &reply{resp: wire.Fail(werr)}
		} else {
			rep = handle(ctx, cc, req)
		}
		if rep.hangup || !b.writeReply(conn, rep) {
			return
		}
	}
}

// writeReply writes one reply line; false if the client did not take it.
func (b *Broker) writeReply(conn net.Conn, rep *reply) bool {
	line, err := wire.AppendResponse(make([]byte, 0, 256), rep.resp)
	if err != nil {
		line, _ = wire.AppendResponse(nil, wire.Fail(wire.AsError(err)))
	}
	conn.SetWriteDeadline(time.Now().Add(WriteTimeout))
	_, err = conn.Write(line)
	conn.SetWriteDeadline(time.Time{})
	if err != nil {
		if rep.onLost != nil {
			rep.onLost()
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) {
			b.log.Debug("reply not delivered", "err", err)
		}
		return false
	}
	return true
}

// decodeRequest decodes a request line strictly. Another v is answered
// with code version whatever else the line holds, so a line that fails the
// strict decode is probed for its v before it is called bad_request.
func decodeRequest(line []byte) (*wire.Request, *wire.Error) {
	var req wire.Request
	if err := wire.DecodeStrict(line, &req); err != nil {
		var probe struct {
			V json.RawMessage `json:"v"`
		}
		if json.Unmarshal(line, &probe) != nil {
			return nil, wire.Errorf(wire.CodeBadRequest, "request is not a JSON object")
		}
		if string(probe.V) != "1" {
			return nil, versionError
		}
		return nil, wire.Errorf(wire.CodeBadRequest, "malformed request envelope")
	}
	if req.V != wire.Version {
		return nil, versionError
	}
	if req.Op == "" {
		return nil, wire.Errorf(wire.CodeBadRequest, "request has no op")
	}
	return &req, nil
}

var versionError = wire.Errorf(wire.CodeVersion, "protocol version %d required", wire.Version)

// connTracker knows every open connection and whether it is handling a
// request, so a shutdown can close the idle ones at once and let the busy
// ones finish their request.
type connTracker struct {
	mu       sync.Mutex
	conns    map[*connCtx]bool // true while a request is handled
	draining bool
	drained  chan struct{} // closed when draining starts
}

func newConnTracker() connTracker {
	return connTracker{conns: map[*connCtx]bool{}, drained: make(chan struct{})}
}

// add records cc; false once draining started.
func (t *connTracker) add(cc *connCtx) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.draining {
		return false
	}
	t.conns[cc] = false
	return true
}

func (t *connTracker) remove(cc *connCtx) {
	t.mu.Lock()
	delete(t.conns, cc)
	t.mu.Unlock()
}

// setBusy records whether cc handles a request; false when it is idle and
// the broker is draining (the caller closes it).
func (t *connTracker) setBusy(cc *connCtx, busy bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.conns[cc] = busy
	return busy || !t.draining
}

// drain stops new connections and closes the idle ones; a busy one closes
// after its reply, a parked next at once (it watches drained).
func (t *connTracker) drain() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.draining {
		return
	}
	t.draining = true
	close(t.drained)
	for cc, busy := range t.conns {
		if !busy {
			cc.conn.Close()
		}
	}
}

// busy reports how many connections are handling a request.
func (t *connTracker) busy() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, b := range t.conns {
		if b {
			n++
		}
	}
	return n
}

// closeAll closes every connection.
func (t *connTracker) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for cc := range t.conns {
		cc.conn.Close()
	}
}
