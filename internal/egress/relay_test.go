package egress_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"agentbox/internal/egress"
)

// startRelay relays a loopback TCP listener to sock until the test ends
// and returns its address.
func startRelay(t *testing.T, sock string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go egress.Relay(ln, sock)
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// TestRelay: a CONNECT sent to the relay's TCP port reaches the proxy
// behind its Unix socket and the tunnel carries bytes both ways; the
// half-close of the client reaches the destination.
func TestRelay(t *testing.T) {
	echo := startEcho(t, "127.0.0.1:0")
	tp := startProxy(t, egress.Config{Policy: rights("127.0.0.1")})
	c, err := net.Dial("tcp", startRelay(t, tp.sock))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "CONNECT 127.0.0.1:"+echo.port()+" HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT through the relay: %v %v", resp, err)
	}
	if err := roundTrip(c, br, "through the relay"); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after the half-close: %q, %v", rest, err)
	}
	if r := tp.record(t); r.Verdict != egress.Allowed || r.Up != int64(len("through the relay")) {
		t.Fatalf("record %+v", r)
	}
}

// TestRelayWithoutProxy: with no proxy at the socket, a connection to the
// relay is closed, and the relay goes on serving.
func TestRelayWithoutProxy(t *testing.T) {
	addr := startRelay(t, filepath.Join(t.TempDir(), "none.sock"))
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("read %d, %v; want the connection closed", n, err)
		}
		c.Close()
	}
}
