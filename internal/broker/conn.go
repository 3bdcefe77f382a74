package broker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"agentbox/internal/wire"
)

// acceptLoop accepts one sandbox's connections. The caller identity is the
// listener's, bound to the connection here and never taken from a request.
func (b *Broker) acceptLoop(srv *sandboxServer) {
	for {
		conn, err := srv.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			b.log.Warn("accept", "sandbox", srv.caller.Sandbox, "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if srv.conns.Add(1) > MaxConnsPerSandbox {
			srv.conns.Add(-1)
			b.refuseConn(conn, wire.Errorf(wire.CodeBusy, "too many connections (at most %d per sandbox)", MaxConnsPerSandbox))
			continue
		}
		if !srv.track(conn) {
			srv.conns.Add(-1)
			conn.Close()
			return
		}
		b.goWorker(func() {
			defer srv.conns.Add(-1)
			defer srv.untrack(conn)
			ctx := withCaller(b.ctx, srv.caller)
			b.serveConn(ctx, conn, func(ctx context.Context, cc *connCtx, req *wire.Request) *reply {
				return b.dispatch(ctx, srv, cc, req)
			})
		})
	}
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

type handlerFunc func(ctx context.Context, cc *connCtx, req *wire.Request) *reply

// serveConn runs one connection: read a line, answer it, and only then
// read the next (one request in flight per connection).
func (b *Broker) serveConn(ctx context.Context, conn net.Conn, handle handlerFunc) {
	defer conn.Close()
	defer func() {
		if p := recover(); p != nil {
			b.log.Error("connection handler panic", "panic", p)
		}
	}()
	cc := &connCtx{conn: conn, r: bufio.NewReaderSize(conn, readBufBytes)}
	for {
		line, err := wire.ReadLine(cc.r, wire.MaxLineBytes)
		if errors.Is(err, wire.ErrLineTooLong) {
			b.writeReply(conn, &reply{resp: wire.Fail(wire.Errorf(wire.CodeBadRequest, "request line exceeds %d bytes", wire.MaxLineBytes))})
			return
		}
		if err != nil {
			return // EOF, half-close or reset: the client is gone
		}
		req, werr := decodeRequest(line)
		var rep *reply
		if werr != nil {
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
