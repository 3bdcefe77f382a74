package unit

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakeSupervisor serves one exec on a real socket: it answers the pid,
// then waits for the broker's side to shut, and then runs answer.
func fakeSupervisor(t *testing.T, answer func(*net.UnixConn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "control.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		conn, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer conn.Close()
		_, files, err := readRequest(conn)
		closeAll(files)
		if err != nil {
			return
		}
		pid := 7
		writeReply(conn, Reply{PID: &pid})
		var b [1]byte
		conn.Read(b[:]) // the broker's side shut: a cancel
		answer(conn)
	}()
	return sock
}

func devNulls(t *testing.T) [3]*os.File {
	t.Helper()
	f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return [3]*os.File{f, f, f}
}

// TestCancelledExecWaitsForTheKill: a cancelled Exec returns only once the
// supervisor has said that the command is gone, and with ctx's error.
func TestCancelledExecWaitsForTheKill(t *testing.T) {
	answered := make(chan struct{})
	sock := fakeSupervisor(t, func(conn *net.UnixConn) {
		time.Sleep(200 * time.Millisecond) // the kill under way
		close(answered)
		killed := 137
		writeReply(conn, Reply{Exit: &killed})
	})
	ctx, cancel := context.WithCancel(t.Context())
	_, err := Exec(ctx, sock, Request{Argv: []string{"sleep", "9"}}, devNulls(t), cancel)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled Exec: err = %v, want context.Canceled", err)
	}
	select {
	case <-answered:
	default:
		t.Fatal("a cancelled Exec returned before the supervisor said the command was gone")
	}
}

// TestCancelledExecSilentSupervisor: the supervisor is the sandbox's; one
// that never answers a cancel holds Exec for cancelTimeout, not for ever.
func TestCancelledExecSilentSupervisor(t *testing.T) {
	sock := fakeSupervisor(t, func(*net.UnixConn) { <-t.Context().Done() })
	ctx, cancel := context.WithCancel(t.Context())
	_, err := Exec(ctx, sock, Request{Argv: []string{"sleep", "9"}}, devNulls(t), cancel)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled Exec: err = %v, want context.Canceled", err)
	}
}
