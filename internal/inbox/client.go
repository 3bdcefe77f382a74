// Package inbox is the client side of the orchestration protocol: a
// connection to the broker socket and typed calls, used by the `jailbee
// inbox` commands inside sandboxes and by the host commands on the admin
// socket.
package inbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"agentbox/internal/fdpass"
	"agentbox/internal/wire"
)

// DefaultSocket is where a sandbox reaches its broker.
const DefaultSocket = "/run/jailbee/orchestration/broker.sock"

// SocketEnv overrides DefaultSocket.
const SocketEnv = "JAILBEE_ORCHESTRATION_SOCKET"

// dialTimeout bounds connecting to the local socket.
const dialTimeout = 5 * time.Second

// ErrUnreachable: the broker could not be reached, or the connection
// dropped without an answer (exit 4).
var ErrUnreachable = errors.New("broker unreachable")

// SocketPath returns the socket to use: $JAILBEE_ORCHESTRATION_SOCKET or
// the default.
func SocketPath() string {
	if p := os.Getenv(SocketEnv); p != "" {
		return p
	}
	return DefaultSocket
}

// Client is one connection to a broker socket. Calls are sequential: one
// request in flight, as the protocol requires.
type Client struct {
	conn net.Conn
	r    *bufio.Reader
}

// Dial connects to the broker socket at path.
func Dial(ctx context.Context, path string) (*Client, error) {
	d := net.Dialer{Timeout: dialTimeout}
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot connect to the broker socket", ErrUnreachable)
	}
	return &Client{conn: conn, r: bufio.NewReader(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Call sends one request and decodes the result into result (if non-nil).
// A failure reply is returned as *wire.Error; a dropped connection or a
// reply that is not a protocol line as ErrUnreachable. ctx's deadline or
// cancellation closes the connection and returns ctx.Err().
func (c *Client) Call(ctx context.Context, op string, args any, result any) error {
	return c.CallFiles(ctx, op, args, nil, result)
}

// CallFiles is Call with files sent along with the request as SCM_RIGHTS
// (the admin socket's exec). The broker has its own copies once the call
// is written; the caller keeps and closes files.
func (c *Client) CallFiles(ctx context.Context, op string, args any, files []*os.File, result any) error {
	raw, err := c.call(ctx, op, args, files)
	if err != nil {
		return err
	}
	if result == nil {
		return nil
	}
	if err := json.Unmarshal(raw, result); err != nil {
		return fmt.Errorf("%w: unexpected reply shape", ErrUnreachable)
	}
	return nil
}

// CallRaw is Call returning the raw result.
func (c *Client) CallRaw(ctx context.Context, op string, args any) (json.RawMessage, error) {
	return c.call(ctx, op, args, nil)
}

func (c *Client) call(ctx context.Context, op string, args any, files []*os.File) (json.RawMessage, error) {
	req := wire.Request{V: wire.Version, Op: op}
	if args != nil {
		a, err := json.Marshal(args)
		if err != nil {
			return nil, err
		}
		req.Args = a
	}
	line, err := wire.Marshal(req)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := c.write(line, files); err != nil {
		return nil, c.ioErr(ctx)
	}
	respLine, err := wire.ReadLine(c.r, wire.MaxLineBytes)
	if err != nil {
		return nil, c.ioErr(ctx)
	}
	var resp wire.Response
	if err := json.Unmarshal(respLine, &resp); err != nil {
		return nil, fmt.Errorf("%w: reply is not a protocol line", ErrUnreachable)
	}
	if !resp.OK {
		if resp.Error == nil {
			return nil, fmt.Errorf("%w: failure reply without an error", ErrUnreachable)
		}
		return nil, resp.Error
	}
	if resp.V != wire.Version {
		return nil, &wire.Error{Code: wire.CodeVersion, Detail: fmt.Sprintf("broker speaks protocol version %d", resp.V)}
	}
	return resp.Result, nil
}

// write sends one request line, with files attached to it.
func (c *Client) write(line []byte, files []*os.File) error {
	if len(files) == 0 {
		_, err := c.conn.Write(line)
		return err
	}
	uc, ok := c.conn.(*net.UnixConn)
	if !ok {
		return errors.New("descriptors need a Unix socket")
	}
	return fdpass.Write(uc, line, files)
}

func (c *Client) ioErr(ctx context.Context) error {
	if ctx.Err() != nil {
		c.conn.Close()
		return ctx.Err()
	}
	return fmt.Errorf("%w: the connection dropped without an answer", ErrUnreachable)
}
