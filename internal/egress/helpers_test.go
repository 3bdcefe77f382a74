package egress_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/egress"
	"agentbox/internal/grant"
	"agentbox/internal/testutil/serve"
)

// fakeResolver answers names from a table, as the host's resolver would.
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	names, ok := f[strings.TrimSuffix(host, ".")]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, n := range names {
		out = append(out, netip.MustParseAddr(n))
	}
	return out, nil
}

// testProxy is a proxy serving a Unix socket of its own, and the records
// it logged.
type testProxy struct {
	*egress.Proxy
	sock    string
	records chan egress.Record
	stop    func() // stops the proxy and waits for Serve to return
}

func rights(egressEntries ...string) egress.Rights {
	return egress.Rights{Rights: grant.Rights{Egress: egressEntries}}
}

// startProxy serves a proxy on a Unix socket until the test ends. Unless
// cfg says otherwise, every refusal is logged one by one (each refusal
// log period is over at once): only the tests of that limit meet it.
func startProxy(t testing.TB, cfg egress.Config) *testProxy {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, ln, cfg, sock)
}

func serveOn(t testing.TB, ln net.Listener, cfg egress.Config, addr string) *testProxy {
	t.Helper()
	tp := &testProxy{sock: addr, records: make(chan egress.Record, 1024)}
	cfg.Sandbox = "fix-12"
	cfg.Log = func(r egress.Record) { tp.records <- r }
	if cfg.RefusalLogPeriod == 0 {
		cfg.RefusalLogPeriod = time.Nanosecond
	}
	tp.Proxy = egress.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tp.Serve(ctx, ln) }()
	tp.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	t.Cleanup(tp.stop)
	return tp
}

// record waits for the next connection's record.
func (tp *testProxy) record(t testing.TB) egress.Record {
	t.Helper()
	select {
	case r := <-tp.records:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no record logged")
		return egress.Record{}
	}
}

func (tp *testProxy) dial(t testing.TB) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", tp.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ask sends a raw request head and reads the proxy's answer.
func (tp *testProxy) ask(t testing.TB, head string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c := tp.dial(t)
	c.SetDeadline(time.Now().Add(10 * time.Second)) // a broken proxy fails the test rather than hangs it
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("reading the proxy's answer: %v", err)
	}
	return c, br, resp
}

// refusal asks head and returns the status and the body of the answer.
func (tp *testProxy) refusal(t testing.TB, head string) (int, string) {
	t.Helper()
	c, br, resp := tp.ask(t, head)
	defer c.Close()
	body, _ := io.ReadAll(io.LimitReader(br, 4096))
	return resp.StatusCode, string(body)
}

// echoServer accepts on addr and echoes each connection until it ends;
// accepted counts the connections it got.
type echoServer struct {
	ln       net.Listener
	mu       sync.Mutex
	accepted int
}

func startEcho(t testing.TB, addr string) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	serve.Serve(t, ln, func(c net.Conn) {
		e.mu.Lock()
		e.accepted++
		e.mu.Unlock()
		io.Copy(c, c)
	})
	return e
}

func (e *echoServer) port() string { return portOf(e.ln.Addr()) }

func (e *echoServer) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.accepted
}

func portOf(a net.Addr) string {
	_, p, _ := net.SplitHostPort(a.String())
	return p
}

// roundTrip writes msg through c and reads it back from the echo server.
func roundTrip(c net.Conn, br io.Reader, msg string) error {
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil {
		return err
	}
	if string(got) != msg {
		return errors.New("echo differs: " + string(got))
	}
	return nil
}
