package unit

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"agentbox/internal/wire"
)

// dialTimeout bounds connecting to a supervisor.
const dialTimeout = 5 * time.Second

// Dial connects to a supervisor's control socket.
func Dial(ctx context.Context, socket string) (*net.UnixConn, error) {
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// Ping asks the supervisor behind socket whether it serves.
func Ping(ctx context.Context, socket string) error {
	conn, err := Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	conn.SetDeadline(time.Now().Add(dialTimeout))
	if err := sendRequest(conn, Request{Op: "ping"}, nil); err != nil {
		return err
	}
	r, err := readReply(bufio.NewReaderSize(conn, MaxReplyBytes))
	if err != nil {
		return err
	}
	if !r.OK {
		return fmt.Errorf("%w: unexpected ping reply", ErrProtocol)
	}
	return nil
}

// cancelTimeout bounds how long a cancelled Exec waits for the
// supervisor to say the command's process group is gone: twice the
// supervisor's own bound on that wait, so a supervisor that gives up
// looking is still heard.
const cancelTimeout = 2 * groupEndTimeout

// Exec runs req (op exec) with files as its stdin, stdout and stderr and
// returns its exit status. started (if not nil) is called once the
// supervisor holds its own copies of files and the command runs.
// Cancelling ctx kills the command: Exec returns ctx's error once the
// command's process group is gone, or after cancelTimeout.
func Exec(ctx context.Context, socket string, req Request, files [3]*os.File, started func()) (int, error) {
	req.Op = "exec"
	conn, err := Dial(ctx, socket)
	if err != nil {
		return -1, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() {
		// Half-closed, the connection tells the supervisor to kill the
		// command; it answers once nothing of the command runs. It is
		// sandbox-controlled: that wait is bounded.
		conn.CloseWrite()
		conn.SetReadDeadline(time.Now().Add(cancelTimeout))
	})
	defer stop()
	if err := sendRequest(conn, req, files[:]); err != nil {
		return -1, ctxOr(ctx, err)
	}
	r := bufio.NewReaderSize(conn, MaxReplyBytes)
	for {
		rep, err := readReply(r)
		if err != nil {
			return -1, ctxOr(ctx, err)
		}
		if rep.Exit != nil {
			return *rep.Exit, ctx.Err()
		}
		if rep.PID == nil {
			return -1, fmt.Errorf("%w: unexpected exec reply", ErrProtocol)
		}
		if started != nil {
			started()
			started = nil
		}
	}
}

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// readReply reads one bounded reply line of the (sandbox-controlled)
// supervisor.
func readReply(r *bufio.Reader) (Reply, error) {
	line, err := wire.ReadLine(r, MaxReplyBytes)
	if err != nil {
		return Reply{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	var rep Reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return Reply{}, fmt.Errorf("%w: reply is not JSON", ErrProtocol)
	}
	if rep.Exit != nil && (*rep.Exit < 0 || *rep.Exit > 255) {
		return Reply{}, fmt.Errorf("%w: exit status out of range", ErrProtocol)
	}
	return rep, nil
}
