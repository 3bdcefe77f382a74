package broker

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"agentbox/internal/egress"
	"agentbox/internal/grant"
	"agentbox/internal/testutil/serve"
)

// tunnelThrough opens a CONNECT tunnel to addr through the proxy at sock.
func tunnelThrough(t *testing.T, sock, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "CONNECT "+addr+" HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT %s: %v %v", addr, resp, err)
	}
	return c
}

// TestEgressSetCutsLostRights: giving a sandbox's proxy new rights (what
// RefreshEgress does) keeps the live tunnels of the rights it kept and
// cuts those of the rights it lost.
func TestEgressSetCutsLostRights(t *testing.T) {
	dst, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve.Serve(t, dst, func(c net.Conn) { io.Copy(c, c) })
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	es := &egressServer{proxy: egress.New(egress.Config{Sandbox: "s"})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go es.proxy.Serve(ctx, ln)

	alive := func(c net.Conn) bool {
		if _, err := io.WriteString(c, "x"); err != nil {
			return false
		}
		_, err := io.ReadFull(c, make([]byte, 1))
		return err == nil
	}
	set := func(r *egress.Rights) { es.refresh(func() (*egress.Rights, time.Time) { return r, time.Time{} }, nil) }
	set(&egress.Rights{Rights: grant.Rights{Egress: []string{"127.0.0.1"}}})
	c := tunnelThrough(t, sock, dst.Addr().String())
	set(&egress.Rights{Rights: grant.Rights{Egress: []string{"127.0.0.1", "example.com"}}})
	if !alive(c) {
		t.Fatal("a tunnel of a right still held was cut")
	}
	set(&egress.Rights{Rights: grant.Rights{Egress: []string{"example.com"}}})
	// The cut closes the tunnel: reading it ends (the deadline only keeps
	// a broken cut from hanging the test).
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the tunnel of a lost right is still open: %v", err)
	}
}
