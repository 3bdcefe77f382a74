package dockertest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/testutil/serve"
	"agentbox/internal/testutil/wait"
)

func TestRequireAndImageIDs(t *testing.T) {
	Require(t)
	for _, tag := range []string{ServiceImageTag, ProxyImageTag} {
		id := ImageID(t, tag)
		if label := Docker(t, "image", "inspect", "--format", `{{index .Config.Labels "agentbox.source"}}`, id); len(label) != 64 {
			t.Errorf("%s (%s): agentbox.source label %q, want a sha256 hex digest", tag, id, label)
		}
	}
}

func TestServiceImageRunsAsDev(t *testing.T) {
	id := ImageID(t, ServiceImageTag)
	out := Docker(t, "run", "--rm", "--user", "1000:1000", id, "sh", "-c",
		`id -u; id -un; echo "$HOME"; stat -c %u:%g /home/dev; agentbox-probe seccomp`)
	// Seccomp 2: Docker's default profile puts the container in filter mode.
	want := "1000\ndev\n/home/dev\n1000:1000\n2"
	if out != want {
		t.Errorf("service image as 1000:1000 printed\n%s\nwant\n%s", out, want)
	}
}

// TestProxyImageForwards runs the proxy image as branchbox does (exactly
// the two arguments) in front of an echo server on the host, reached
// through the engine's host-gateway.
func TestProxyImageForwards(t *testing.T) {
	id := ImageID(t, ProxyImageTag)
	if ep := Docker(t, "image", "inspect", "--format", "{{json .Config.Entrypoint}}", id); ep != `["/tcp-proxy"]` {
		t.Errorf("proxy image entrypoint %s, want [\"/tcp-proxy\"]", ep)
	}
	echo := echoServer(t, "0.0.0.0:0")
	_, echoPort, _ := net.SplitHostPort(echo.Addr().String())
	cid := Docker(t, "run", "-d", "--add-host", "target:host-gateway", "-p", "127.0.0.1::8080",
		id, "8080", "target:"+echoPort)
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", cid).Run() })
	waitFor(t, func() string { return dockerLogs(cid) }, "listening on 0.0.0.0:8080, forwarding to target:"+echoPort)
	addr := Docker(t, "port", cid, "8080/tcp")
	if i := strings.IndexByte(addr, '\n'); i >= 0 {
		addr = addr[:i]
	}
	roundTrip(t, addr)
	waitFor(t, func() string { return dockerLogs(cid) }, "-> target:"+echoPort+": 12 bytes sent, 12 received")
}

// TestTCPProxyForwards runs the proxy binary on the host (no engine
// needed) and checks bytes and half-closes go through both ways.
func TestTCPProxyForwards(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tcp-proxy")
	build := exec.Command("go", "build", "-o", bin, "./tcpproxy")
	build.Env = append(build.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./tcpproxy: %v\n%s", err, out)
	}
	echo := echoServer(t, "127.0.0.1:0")
	port := freePort(t)
	proxy := exec.Command(bin, strconv.Itoa(port), echo.Addr().String())
	var stderr syncBuffer
	proxy.Stderr = &stderr
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Process.Kill(); proxy.Wait() })
	waitFor(t, stderr.String, fmt.Sprintf("listening on 0.0.0.0:%d", port))
	roundTrip(t, fmt.Sprintf("127.0.0.1:%d", port))
	waitFor(t, stderr.String, "-> "+echo.Addr().String()+": 12 bytes sent, 12 received")

	// A target that refuses: the client's connection is closed, and the
	// proxy logs the dial error and keeps serving.
	dead := freePort(t)
	port2 := freePort(t)
	proxy2 := exec.Command(bin, strconv.Itoa(port2), fmt.Sprintf("127.0.0.1:%d", dead))
	var stderr2 syncBuffer
	proxy2.Stderr = &stderr2
	if err := proxy2.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy2.Process.Kill(); proxy2.Wait() })
	waitFor(t, stderr2.String, "listening on")
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port2))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("read from a proxy with a dead target: %d bytes, %v; want EOF or a reset", n, err)
	}
	waitFor(t, stderr2.String, "connection refused")

	for _, args := range [][]string{{}, {"8080"}, {"x", "h:1"}, {"8080", "nohostport"}} {
		err := exec.Command(bin, args...).Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("tcp-proxy %q: %v, want exit status 2", args, err)
		}
	}
}

// roundTrip sends a message through the proxy at addr, half-closes, and
// expects the echo server's answer, which it sends only after that EOF,
// followed by the server's own close. A connection that ends with no
// answer at all (docker-proxy accepting before the container listens) is
// retried.
func roundTrip(t *testing.T, addr string) {
	t.Helper()
	const msg = "hello, proxy"
	deadline := time.Now().Add(wait.Guard)
	for {
		got, err := exchange(addr, msg)
		if err == nil && got == strings.ToUpper(msg) {
			return
		}
		if err == nil && got != "" {
			t.Fatalf("through the proxy: got %q, want %q", got, strings.ToUpper(msg))
		}
		if time.Now().After(deadline) {
			t.Fatalf("through the proxy at %s: got %q, %v", addr, got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func exchange(addr, msg string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return "", err
	}
	got, err := io.ReadAll(c)
	return string(got), err
}

// echoServer answers each connection, once the client has half-closed,
// with what it sent in upper case, then closes.
func echoServer(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	serve.Serve(t, ln, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		data, err := io.ReadAll(c)
		if err != nil {
			return
		}
		c.Write(bytes.ToUpper(data))
	})
	return ln
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func dockerLogs(cid string) string {
	out, _ := exec.Command("docker", "logs", cid).CombinedOutput()
	return string(out)
}

// waitFor waits up to wait.Guard for get() to contain want.
func waitFor(t *testing.T, get func() string, want string) {
	t.Helper()
	deadline := time.Now().Add(wait.Guard)
	for {
		s := get()
		if strings.Contains(s, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %q in:\n%s", wait.Guard, want, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe to read while a process writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
