package serve

import (
	"bufio"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestServe: each connection gets its own handler, at once (the second is
// answered while the first is still open), and is closed when its handler
// returns; the listener is closed at cleanup.
func TestServe(t *testing.T) {
	var ln net.Listener
	t.Run("serve", func(t *testing.T) {
		var err error
		ln, err = net.Listen("unix", filepath.Join(t.TempDir(), "s.sock"))
		if err != nil {
			t.Fatal(err)
		}
		Serve(t, ln, func(c net.Conn) {
			line, err := bufio.NewReader(c).ReadString('\n')
			if err == nil {
				io.WriteString(c, "got "+line)
			}
		})
		first, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer first.Close()
		second, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer second.Close()
		second.SetDeadline(time.Now().Add(30 * time.Second)) // hang guard
		io.WriteString(second, "hello\n")
		got, err := io.ReadAll(second) // to EOF: closed after the handler
		if err != nil || string(got) != "got hello\n" {
			t.Fatalf("read %q, %v; want %q and EOF", got, err, "got hello\n")
		}
	})
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after cleanup, Accept = %v; want the listener closed", err)
	}
}
