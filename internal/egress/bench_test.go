package egress_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"agentbox/internal/egress"
	"agentbox/internal/testutil/serve"
)

// downloadBytes is BenchmarkEgress's transfer.
const downloadBytes = 64 << 20

// startSource serves downloadBytes on every connection to a loopback port.
func startSource(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 256<<10)
	serve.Serve(b, ln, func(c net.Conn) {
		for sent := 0; sent < downloadBytes; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	return ln.Addr().String()
}

// connectThrough opens a tunnel to target through the proxy at network
// and addr (its socket, or a relay in front of it).
func connectThrough(b *testing.B, network, addr, target string) (net.Conn, *bufio.Reader) {
	c, err := net.Dial(network, addr)
	if err != nil {
		b.Fatal(err)
	}
	io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("CONNECT: %v %v", resp, err)
	}
	return c, br
}

// BenchmarkEgress measures, in one run, a 64 MiB download and connection
// setup (connect, one byte each way) through the proxy (its Unix socket,
// CONNECT, the destination on loopback) against the same over plain
// loopback, and reports both and their ratios (the targets are at most
// 1.2x for throughput and 2x for setup; nothing is asserted).
func BenchmarkEgress(b *testing.B) {
	tp := startProxy(b, egress.Config{Policy: rights("127.0.0.1")})
	go func() {
		for range tp.records {
		}
	}()

	b.Run("download", func(b *testing.B) {
		src := startSource(b)
		var direct, proxied time.Duration
		for b.Loop() {
			t0 := time.Now()
			c, err := net.Dial("tcp", src)
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, c)
			c.Close()
			direct += time.Since(t0)

			t0 = time.Now()
			pc, br := connectThrough(b, "unix", tp.sock, src)
			m, _ := io.Copy(io.Discard, br)
			pc.Close()
			proxied += time.Since(t0)
			if n != downloadBytes || m != downloadBytes {
				b.Fatalf("downloaded %d direct, %d proxied", n, m)
			}
		}
		mib := float64(downloadBytes) / (1 << 20) * float64(b.N)
		b.ReportMetric(mib/direct.Seconds(), "direct-MiB/s")
		b.ReportMetric(mib/proxied.Seconds(), "proxy-MiB/s")
		b.ReportMetric(proxied.Seconds()/direct.Seconds(), "time-ratio")
	})

	// The sandbox's path: its loopback relay in front of the proxy's
	// socket, against the proxy's socket alone.
	b.Run("relay-download", func(b *testing.B) {
		src := startSource(b)
		relay := startRelay(b, tp.sock)
		var viaSocket, viaRelay time.Duration
		for b.Loop() {
			t0 := time.Now()
			pc, br := connectThrough(b, "unix", tp.sock, src)
			n, _ := io.Copy(io.Discard, br)
			pc.Close()
			viaSocket += time.Since(t0)

			t0 = time.Now()
			rc, rbr := connectThrough(b, "tcp", relay, src)
			m, _ := io.Copy(io.Discard, rbr)
			rc.Close()
			viaRelay += time.Since(t0)
			if n != downloadBytes || m != downloadBytes {
				b.Fatalf("downloaded %d through the socket, %d through the relay", n, m)
			}
		}
		mib := float64(downloadBytes) / (1 << 20) * float64(b.N)
		b.ReportMetric(mib/viaSocket.Seconds(), "socket-MiB/s")
		b.ReportMetric(mib/viaRelay.Seconds(), "relay-MiB/s")
		b.ReportMetric(viaRelay.Seconds()/viaSocket.Seconds(), "time-ratio")
	})

	b.Run("setup", func(b *testing.B) {
		echo := startEcho(b, "127.0.0.1:0")
		target := "127.0.0.1:" + echo.port()
		one := []byte{1}
		var direct, proxied time.Duration
		for b.Loop() {
			t0 := time.Now()
			c, err := net.Dial("tcp", target)
			if err != nil {
				b.Fatal(err)
			}
			c.Write(one)
			io.ReadFull(c, one)
			direct += time.Since(t0)
			c.Close()

			t0 = time.Now()
			pc, br := connectThrough(b, "unix", tp.sock, target)
			pc.Write(one)
			io.ReadFull(br, one)
			proxied += time.Since(t0)
			pc.Close()
		}
		b.ReportMetric(float64(direct.Microseconds())/float64(b.N), "direct-µs/conn")
		b.ReportMetric(float64(proxied.Microseconds())/float64(b.N), "proxy-µs/conn")
		b.ReportMetric(proxied.Seconds()/direct.Seconds(), "time-ratio")
	})
}
