package endpoint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"agentbox/internal/managed/spool"
)

// MaxConcurrent bounds the connections Serve handles at a time; further
// ones wait in the listen backlog.
const MaxConcurrent = 16

// Handler answers one request frame (the raw line, without its newline)
// with a payload, one JSON value. On an error no response is sent: the
// connection closes, which the dispatcher sees as a transport failure.
// ctx ends when Serve stops.
type Handler func(ctx context.Context, frame []byte) (payload []byte, err error)

// IDs are a request frame's ids, echoed in its response.
type IDs = spool.IDs

// FrameIDs decodes a request frame with spool.DecodeFrame (strict: one
// JSON object, exactly the six frame fields once each, version "1") and
// returns its ids. Its errors never hold a value from the frame.
func FrameIDs(frame []byte) (IDs, error) {
	ids, _, err := spool.DecodeFrame(frame)
	if err != nil {
		return IDs{}, errors.New("malformed request frame: " + err.Error())
	}
	return ids, nil
}

// encodeResponse is the response line: the canonical spool.Response
// (compact, payload compacted) and "\n".
func encodeResponse(ids IDs, payload []byte) ([]byte, error) {
	var compacted bytes.Buffer
	if err := json.Compact(&compacted, payload); err != nil || !json.Valid(payload) {
		return nil, errors.New("the payload is not one JSON value")
	}
	r := spool.Response{Version: spool.Version, RunID: ids.RunID, LeaseID: ids.LeaseID, Consumer: ids.Consumer,
		RequestID: ids.RequestID, Payload: compacted.Bytes()}
	line := r.Bytes()
	if len(line) > spool.MaxResponseBytes {
		return nil, fmt.Errorf("the response is over the limit (%d bytes)", spool.MaxResponseBytes)
	}
	return line, nil
}

// Serve listens on a Unix socket at path and answers each connection's
// frame through h until ctx is done; then it closes the listener, waits for
// the connections in progress (h's ctx is done too), removes the socket
// file and returns nil. A file already at path is replaced only when it is
// a socket nothing listens on; any other file is left in place and Serve
// fails. The socket is bound in a private directory, made mode 0600 and
// only then linked at path, so nothing connects to it before that.
//
// For each connection (at most MaxConcurrent at a time) it reads the frame
// until a newline or EOF (at most spool.MaxRequestBytes+1 bytes, within
// Timeout), checks it with FrameIDs, calls h, and writes the response
// {version,run_id,lease_id,consumer,request_id,payload} + "\n" (within
// Timeout); a malformed or oversized frame, an error of h, or a response
// over spool.MaxResponseBytes closes the connection without a response.
// logf (nil: no log) gets one line per connection: the request id and the
// outcome, never a payload.
func Serve(ctx context.Context, path string, h Handler, logf func(format string, args ...any)) error {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	ln, own, err := listen(path)
	if err != nil {
		return err
	}
	defer func() {
		// Remove the socket only if it is still this listener's.
		if fi, err := os.Lstat(path); err == nil && os.SameFile(fi, own) {
			_ = os.Remove(path)
		}
	}()
	defer context.AfterFunc(ctx, func() { _ = ln.Close() })()
	logf("listening on %s", path)

	sem := make(chan struct{}, MaxConcurrent)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	for {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		conn, err := ln.AcceptUnix()
		if err != nil {
			<-sem
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) {
				logf("accept: %v (retrying)", err)
				select {
				case <-time.After(100 * time.Millisecond):
				case <-ctx.Done():
				}
				continue
			}
			return fmt.Errorf("tool endpoint: accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			serveConn(ctx, conn, h, logf)
		}()
	}
}

// listen binds the socket at a temporary name in a new private directory
// next to path, makes it 0600, and links it at path (never replacing a
// file: a stale socket is removed first). It returns the listener and the
// socket file's identity.
func listen(path string) (*net.UnixListener, os.FileInfo, error) {
	if err := removeStale(path); err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".endpoint-")
	if err != nil {
		return nil, nil, fmt.Errorf("tool endpoint: %w", err)
	}
	// The temporary name goes; the socket stays linked at path.
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("tool endpoint: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	var fi os.FileInfo
	if err = os.Chmod(tmp, 0o600); err == nil {
		if err = os.Link(tmp, path); err == nil {
			fi, err = os.Lstat(path)
		}
	}
	if err != nil {
		_ = ln.Close()
		return nil, nil, fmt.Errorf("tool endpoint: %w", err)
	}
	return ln, fi, nil
}

// removeStale removes a socket at path that nothing listens on; any other
// file, or a socket something answers on, is refused.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tool endpoint: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("tool endpoint: %s exists and is not a socket (left in place)", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("tool endpoint: something already listens on %s", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("tool endpoint: the socket at %s is neither live nor stale: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("tool endpoint: %w", err)
	}
	return nil
}

// serveConn answers one connection, or closes it without a response.
func serveConn(ctx context.Context, conn *net.UnixConn, h Handler, logf func(string, ...any)) {
	defer conn.Close()
	// Stopping aborts a frame still being read; once read, the exchange
	// runs to its end (h sees ctx).
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	frame, err := readFrame(conn)
	if !stop() {
		return
	}
	if err != nil {
		logf("refused a connection: %v", err)
		return
	}
	ids, err := FrameIDs(frame)
	if err != nil {
		logf("refused a connection: %v", err)
		return
	}
	payload, err := h(ctx, frame)
	if err != nil {
		logf("request %q: no response: %v", ids.RequestID, err)
		return
	}
	resp, err := encodeResponse(ids, payload)
	if err != nil {
		logf("request %q: no response: %v", ids.RequestID, err)
		return
	}
	err = conn.SetWriteDeadline(time.Now().Add(Timeout))
	if err == nil {
		_, err = conn.Write(resp)
	}
	if err != nil {
		logf("request %q: the response was not delivered: %v", ids.RequestID, err)
		return
	}
	logf("request %q: answered", ids.RequestID)
}

// readFrame reads one frame: the bytes before the first newline, or before
// EOF; at most spool.MaxRequestBytes, within Timeout.
func readFrame(conn *net.UnixConn) ([]byte, error) {
	if err := conn.SetReadDeadline(time.Now().Add(Timeout)); err != nil {
		return nil, fmt.Errorf("reading the frame: %w", err)
	}
	line, err := bufio.NewReader(io.LimitReader(conn, spool.MaxRequestBytes+1)).ReadBytes('\n')
	switch {
	case err == nil:
		return line[:len(line)-1], nil
	case err != io.EOF:
		return nil, fmt.Errorf("reading the frame: %w", err)
	case len(line) > spool.MaxRequestBytes:
		return nil, fmt.Errorf("the frame is over the limit (%d bytes)", spool.MaxRequestBytes)
	}
	return line, nil
}
