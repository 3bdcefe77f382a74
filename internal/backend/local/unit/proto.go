// Package unit is a local sandbox as one running unit: the launcher that
// starts it and the supervisor that holds it.
//
// The broker starts `jailbee _sandbox-launch` (LaunchMain). As root, the
// launcher joins the sandbox's cgroups, stages the sandbox's directories
// in a private mount namespace where the sandbox's unprivileged host uid
// can reach them, drops to that uid and executes bubblewrap, which runs
// `jailbee _sandbox-init` (InitMain) as the sandbox's pid 1. The
// supervisor holds every namespace, outlives the broker, and runs the
// commands the broker asks for over a control socket whose listening fd it
// inherited; it never learns the socket's host path. Killing the
// supervisor ends the pid namespace, so every process of the sandbox.
//
// The control protocol is one JSON request line per connection, with the
// command's stdin, stdout and stderr passed as SCM_RIGHTS along with it:
//
//	-> {"op":"exec","argv":[...],"env":[...],"dir":"/workspace","tty":false} + 3 fds
//	<- {"pid":N}         the command started (N: its pid inside)
//	<- {"exit":S}        it ended with status S (128+n for signal n)
//
// or {"op":"ping"} -> {"ok":true}. The broker shutting its side of the
// connection (or closing it) before the exit line kills the command's
// process group; the supervisor then sends {"exit":137} once the group is
// empty, which a cancelled Exec waits for. Everything the supervisor says
// is treated by the broker as sandbox-controlled.
package unit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"

	"agentbox/internal/fdpass"
)

// Limits of the control protocol.
const (
	// MaxRequestBytes bounds a request line: argv and environment.
	MaxRequestBytes = 1 << 20
	// MaxReplyBytes bounds a reply line from the (sandbox-controlled)
	// supervisor.
	MaxReplyBytes = 256
	// maxFDs is the most descriptors a request carries (stdin, stdout, stderr).
	maxFDs = 3
)

// Request is one control request.
type Request struct {
	Op   string   `json:"op"` // "exec" or "ping"
	Argv []string `json:"argv,omitempty"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	TTY  bool     `json:"tty,omitempty"`
}

// Reply is one control reply line; exactly one field is set.
type Reply struct {
	OK   bool `json:"ok,omitempty"`
	PID  *int `json:"pid,omitempty"`
	Exit *int `json:"exit,omitempty"`
}

// ErrProtocol: the peer broke the control protocol.
var ErrProtocol = errors.New("sandbox control protocol error")

// sendRequest writes req as one line with files as SCM_RIGHTS.
func sendRequest(conn *net.UnixConn, req Request, files []*os.File) error {
	line, err := json.Marshal(req)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	oob := fdpass.Rights(files)
	n, oobn, err := conn.WriteMsgUnix(line, oob, nil)
	if err != nil {
		return err
	}
	if n != len(line) || oobn != len(oob) {
		return fmt.Errorf("%w: short write", ErrProtocol)
	}
	return nil
}

// readRequest reads one request line and the descriptors sent with it.
// The caller owns (and must close) the returned files, also on error.
func readRequest(conn *net.UnixConn) (Request, []*os.File, error) {
	var line []byte
	var files []*os.File
	buf := make([]byte, 64<<10)
	for {
		n, got, truncated, err := fdpass.Read(conn, buf, maxFDs)
		files = append(files, got...)
		if truncated {
			return Request{}, files, fmt.Errorf("%w: too many descriptors", ErrProtocol)
		}
		line = append(line, buf[:n]...)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			if i != len(line)-1 {
				return Request{}, files, fmt.Errorf("%w: data after the request", ErrProtocol)
			}
			line = line[:i]
			break
		}
		if len(line) > MaxRequestBytes {
			return Request{}, files, fmt.Errorf("%w: request over %d bytes", ErrProtocol, MaxRequestBytes)
		}
		if err != nil {
			return Request{}, files, err
		}
		if n == 0 {
			return Request{}, files, fmt.Errorf("%w: connection closed before a request", ErrProtocol)
		}
	}
	if len(line) > MaxRequestBytes {
		return Request{}, files, fmt.Errorf("%w: request over %d bytes", ErrProtocol, MaxRequestBytes)
	}
	if len(files) > maxFDs {
		return Request{}, files, fmt.Errorf("%w: %d descriptors", ErrProtocol, len(files))
	}
	var req Request
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Request{}, files, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return req, files, nil
}

// writeReply writes one reply line.
func writeReply(conn net.Conn, r Reply) error {
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = conn.Write(append(line, '\n'))
	return err
}
