package egress_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/egress"
	"agentbox/internal/testutil/serve"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/threads"
)

// relayHelperEnv makes the test binary a relay process of its own
// (relayHelper): "SLOTS SLOW SOCK".
const relayHelperEnv = "EGRESS_TEST_RELAY"

func TestMain(m *testing.M) {
	if spec := os.Getenv(relayHelperEnv); spec != "" {
		os.Exit(relayHelper(spec))
	}
	os.Exit(m.Run())
}

// relayHelper serves a relay as the Incus sandbox's relay does (its
// threads made ahead), its gate and system calls as spec
// says, and prints its address once it serves.
func relayHelper(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 3 {
		fmt.Fprintf(os.Stderr, "%s: %q\n", relayHelperEnv, spec)
		return 2
	}
	slots, err1 := strconv.Atoi(f[0])
	slow, err2 := time.ParseDuration(f[1])
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	sock := f[2]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	egress.SetRelaySyscalls(slots, slow)
	threads.Reserve(egress.RelayProcs, egress.RelayThreads)
	fmt.Println(ln.Addr())
	egress.Relay(ln, sock)
	return 1
}

// startRelay relays a loopback TCP listener to sock until the test ends
// and returns its address.
func startRelay(t testing.TB, sock string) string {
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

// TestRelayThreadsBounded: the relay lives in its sandbox's task limit,
// where a thread it cannot make aborts it. With every system call slow
// (as on a loaded machine, where the kernel preempts a thread in its
// call), a churn of connections through it makes it no thread past those
// it made at start. The same churn through a relay whose gate lets every
// goroutine into a system call at once (the relay before the gate) does
// make threads: the case is the one that needs the gate.
func TestRelayThreadsBounded(t *testing.T) {
	sock := startUnixEcho(t)
	if grew := relayThreadGrowth(t, 1000, sock); grew <= 0 {
		t.Fatalf("an ungated relay made no thread under the churn (%d): the case does not load it", grew)
	}
	if grew := relayThreadGrowth(t, 2, sock); grew > 0 {
		t.Fatalf("the relay made %d threads under the churn", grew)
	}
}

// relayThreadGrowth runs a relay process with a gate of slots and slow
// system calls, churns connections through it to sock, checking the bytes
// come back, and returns how many threads it had more at the end.
func relayThreadGrowth(t *testing.T, slots int, sock string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d 2ms %s", relayHelperEnv, slots, sock))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the relay did not start: %v", err)
	}
	addr = strings.TrimSpace(addr)
	threadsOf := func() int {
		ents, err := os.ReadDir("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/task")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	// The runtime (the race detector's more so) may still make a thread
	// of its own just after the relay serves: the count to compare with
	// is the one it settles at before any connection: unchanged for a
	// second (a loaded machine may make those threads late).
	start, since := threadsOf(), time.Now()
	wait.For(t, "the relay's thread count to settle", func() bool {
		if n := threadsOf(); n != start {
			start, since = n, time.Now()
		}
		return time.Since(since) >= time.Second
	})
	for round := range 4 {
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				msg := fmt.Sprintf("round %d conn %d", round, i)
				io.WriteString(c, msg)
				c.(*net.TCPConn).CloseWrite()
				if got, err := io.ReadAll(c); err != nil || string(got) != msg {
					t.Errorf("through the relay: %q, %v; want %q", got, err, msg)
				}
			})
		}
		wg.Wait()
	}
	grew := threadsOf() - start
	t.Logf("gate of %d: %d threads at start, %d more after the churn", slots, start, grew)
	return grew
}

// startUnixEcho serves an echo on a Unix socket until the test ends: each
// connection gets back what it sent, then a half-close.
func startUnixEcho(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "echo.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	serve.Serve(t, ln, func(c net.Conn) {
		io.Copy(c, c)
		c.(*net.UnixConn).CloseWrite()
	})
	return sock
}
