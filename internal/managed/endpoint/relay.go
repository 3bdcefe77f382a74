// Package endpoint is the wire between branchbox's dispatcher and a trusted
// tool endpoint: a Unix socket outside any container.
//
// One connection carries one exchange. The dispatcher (Relay) writes one
// request frame, compact JSON
//
//	{"version":"1","run_id":..,"lease_id":..,"consumer":..,"request_id":..,"payload":<any JSON>}
//
// followed by "\n", shuts down its write side and reads the response until
// EOF: compact JSON {"version","run_id","lease_id","consumer","request_id",
// "payload"} with the request's ids, then "\n". The endpoint (Serve) answers
// each frame through a Handler, or closes the connection without a
// response.
//
// Connect, write and read are each bounded by Timeout; a request frame by
// spool.MaxRequestBytes and a response by spool.MaxResponseBytes. No error
// of this package holds a frame's or a payload's bytes.
package endpoint

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"time"

	"agentbox/internal/managed/spool"
)

// Timeout bounds each of connect, write and read, on both sides.
const Timeout = 30 * time.Second

// TransportError is a failure to deliver the frame or to read an answer:
// the connection refused, reset or timed out, or closed before any byte of
// a response. It is the retryable class: the caller decides whether a retry
// is allowed. It never holds the frame's bytes.
type TransportError struct {
	// Op is the step that failed: "connect", "write" or "read".
	Op  string
	Err error
}

func (e *TransportError) Error() string {
	return "tool endpoint transport: " + e.Op + ": " + e.Err.Error()
}

func (e *TransportError) Unwrap() error { return e.Err }

// ErrOversized reports a response over spool.MaxResponseBytes. It is
// terminal.
var ErrOversized = errors.New("the endpoint's response is over the limit")

// ErrFrame reports a frame Relay refuses to send: empty, over
// spool.MaxRequestBytes, or holding a newline. It is terminal.
var ErrFrame = errors.New("the frame to relay is not one line of at most the request limit")

// errNoResponse is a TransportError's Err when the endpoint closed the
// connection without writing a byte.
var errNoResponse = errors.New("the endpoint closed the connection without a response")

// Relay connects to the Unix socket at path, writes frame + "\n", shuts
// down its write side, and reads the response until EOF (at most
// spool.MaxResponseBytes+1 bytes). It returns the raw response bytes;
// validating them is the caller's. A response over the limit is
// ErrOversized; an empty one, and any connect, write or read failure
// (timeouts and ctx's end included), is a *TransportError.
func Relay(ctx context.Context, path string, frame []byte) ([]byte, error) {
	return relay(ctx, path, frame, Timeout)
}

// relay is Relay with its timeout as a parameter (for tests).
func relay(ctx context.Context, path string, frame []byte, timeout time.Duration) ([]byte, error) {
	if len(frame) == 0 || len(frame) > spool.MaxRequestBytes || bytes.IndexByte(frame, '\n') >= 0 {
		return nil, ErrFrame
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, transportError(ctx, "connect", err)
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	// ctx's end aborts whatever step is running, for good.
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()

	line := make([]byte, 0, len(frame)+1)
	line = append(append(line, frame...), '\n')
	if err := conn.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return nil, transportError(ctx, "write", err)
	}
	if _, err := conn.Write(line); err != nil {
		return nil, transportError(ctx, "write", err)
	}
	if err := conn.CloseWrite(); err != nil {
		return nil, transportError(ctx, "write", err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, transportError(ctx, "read", err)
	}
	resp, err := io.ReadAll(io.LimitReader(conn, spool.MaxResponseBytes+1))
	switch {
	case len(resp) > spool.MaxResponseBytes:
		return nil, ErrOversized
	case err != nil:
		return nil, transportError(ctx, "read", err)
	case len(resp) == 0:
		return nil, transportError(ctx, "read", errNoResponse)
	}
	return resp, nil
}

// transportError wraps err, or ctx's error once ctx is done (the
// connection was closed because of it). A *net.OpError gives way to its
// cause: its text names the socket's path, a source path of the
// assignment, which no message prints.
func transportError(ctx context.Context, op string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		err = ctxErr
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err
	}
	return &TransportError{Op: op, Err: err}
}
