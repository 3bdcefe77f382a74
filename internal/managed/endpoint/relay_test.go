package endpoint

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/spool"
)

const testFrame = `{"version":"1","run_id":"run-1","lease_id":"lease-1","consumer":"agent","request_id":"req-1","payload":{"secret":"frame-secret-value"}}`

// oneShot listens on a fresh socket and hands the first connection to
// serve; it returns the socket path. The listener closes with the test.
func oneShot(t *testing.T, serve func(conn *net.UnixConn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ep.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer conn.Close()
		serve(conn)
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return path
}

// transport asserts err is a *TransportError of op that does not hold
// the frame.
func transport(t *testing.T, err error, op string) *TransportError {
	t.Helper()
	var te *TransportError
	if !errors.As(err, &te) || te.Op != op {
		t.Fatalf("got %v (%T), want a %s TransportError", err, err, op)
	}
	if strings.Contains(err.Error(), "frame-secret-value") || strings.Contains(err.Error(), "req-1") {
		t.Fatalf("the error holds the frame: %v", err)
	}
	return te
}

func TestRelayRoundTripAndHalfClose(t *testing.T) {
	want := []byte(`{"version":"1","run_id":"run-1","lease_id":"lease-1","consumer":"agent","request_id":"req-1","payload":true}` + "\n")
	got := make(chan []byte, 1)
	path := oneShot(t, func(conn *net.UnixConn) {
		// ReadAll returns only at EOF: the relay's half-close.
		b, err := io.ReadAll(conn)
		if err != nil {
			got <- nil
			return
		}
		got <- b
		conn.Write(want)
	})
	resp, err := Relay(context.Background(), path, []byte(testFrame))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(resp, want) {
		t.Fatalf("response %q", resp)
	}
	if b := <-got; string(b) != testFrame+"\n" {
		t.Fatalf("the server read %q", b)
	}
}

func TestRelayResponseLimit(t *testing.T) {
	for _, n := range []int{spool.MaxResponseBytes, spool.MaxResponseBytes + 1, 4 * spool.MaxResponseBytes} {
		path := oneShot(t, func(conn *net.UnixConn) {
			io.ReadAll(conn)
			conn.Write(bytes.Repeat([]byte("x"), n))
		})
		resp, err := Relay(context.Background(), path, []byte(testFrame))
		if n <= spool.MaxResponseBytes {
			if err != nil || len(resp) != n {
				t.Fatalf("%d bytes: len %d err %v", n, len(resp), err)
			}
			continue
		}
		var te *TransportError
		if !errors.Is(err, ErrOversized) || errors.As(err, &te) || resp != nil {
			t.Fatalf("%d bytes: len %d err %v, want ErrOversized", n, len(resp), err)
		}
	}
}

func TestRelayMissingSocket(t *testing.T) {
	_, err := Relay(context.Background(), filepath.Join(t.TempDir(), "none.sock"), []byte(testFrame))
	transport(t, err, "connect")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err %v", err)
	}
}

func TestRelayRefusedSocket(t *testing.T) {
	// A stale socket: nothing listens.
	path := staleSocket(t, filepath.Join(t.TempDir(), "stale.sock"))
	_, err := Relay(context.Background(), path, []byte(testFrame))
	transport(t, err, "connect")
}

// TestRelayErrorsHoldNoPath: the socket's path is a source path of the
// assignment, which no message prints; the errors of a failed connect
// name the failure only.
func TestRelayErrorsHoldNoPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "host-path-marker")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "none.sock"), staleSocket(t, filepath.Join(dir, "stale.sock"))} {
		_, err := Relay(context.Background(), path, []byte(testFrame))
		transport(t, err, "connect")
		if strings.Contains(err.Error(), "host-path-marker") {
			t.Fatalf("the error names the socket's path: %v", err)
		}
	}
}

func TestRelayClosedWithoutAnswer(t *testing.T) {
	path := oneShot(t, func(conn *net.UnixConn) { io.ReadAll(conn) })
	_, err := Relay(context.Background(), path, []byte(testFrame))
	if te := transport(t, err, "read"); te.Err != errNoResponse {
		t.Fatalf("err %v", err)
	}
	// Closed before reading the frame: a reset or an EOF, still transport.
	path = oneShot(t, func(conn *net.UnixConn) {})
	_, err = Relay(context.Background(), path, []byte(testFrame))
	var te *TransportError
	if !errors.As(err, &te) {
		t.Fatalf("err %v", err)
	}
}

func TestRelayTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	path := oneShot(t, func(conn *net.UnixConn) {
		io.ReadAll(conn)
		<-release // never answers
	})
	// One timeout bounds the dial, the write and the read: long enough
	// that a slow machine still gets through the dial and the write (the
	// server takes the frame), so only the read, which never gets an
	// answer, runs out of it.
	_, err := relay(context.Background(), path, []byte(testFrame), 2*time.Second)
	transport(t, err, "read")
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
}

func TestRelayContextCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	defer close(release)
	path := oneShot(t, func(conn *net.UnixConn) {
		io.ReadAll(conn)
		cancel()
		<-release // never answers
	})
	_, err := Relay(ctx, path, []byte(testFrame))
	transport(t, err, "read")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}

func TestRelayRefusesBadFrames(t *testing.T) {
	path := oneShot(t, func(conn *net.UnixConn) { t.Error("a bad frame was sent") })
	for _, frame := range [][]byte{nil, []byte("{}\n{}"), bytes.Repeat([]byte("x"), spool.MaxRequestBytes+1)} {
		if _, err := Relay(context.Background(), path, frame); !errors.Is(err, ErrFrame) {
			t.Fatalf("len %d: err %v", len(frame), err)
		}
	}
}

// staleSocket leaves a socket file at path that nothing listens on, as a
// crashed endpoint does, and returns path.
func staleSocket(t *testing.T, path string) string {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	return path
}
