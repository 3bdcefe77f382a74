package egress_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"agentbox/internal/egress"
	"agentbox/internal/testutil/serve"
	"agentbox/internal/testutil/wait"
)

// headerLines is n header lines of distinct names, each ended by eol.
func headerLines(n int, eol string) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X-H%d: v%s", i, eol)
	}
	return b.String()
}

// TestRequestHeaderLines: a request head of MaxRequestHeaderLines header
// lines is read whole (and refused as not granted); one more line is
// answered 431 before it is parsed, whatever ends its lines.
func TestRequestHeaderLines(t *testing.T) {
	tp := startProxy(t, egress.Config{})
	for _, eol := range []string{"\r\n", "\n"} {
		head := func(n int) string { return "CONNECT pypi.org:443 HTTP/1.1" + eol + headerLines(n, eol) + eol }
		status, body := tp.refusal(t, head(egress.MaxRequestHeaderLines))
		if r := tp.record(t); status != http.StatusForbidden || r.Verdict != egress.Refused {
			t.Fatalf("%q: a head of %d header lines answered %d %q; want 403 (read whole, not granted)", eol, egress.MaxRequestHeaderLines, status, body)
		}
		status, body = tp.refusal(t, head(egress.MaxRequestHeaderLines+1))
		want := fmt.Sprintf("the request head has more than %d header lines", egress.MaxRequestHeaderLines)
		if status != http.StatusRequestHeaderFieldsTooLarge || body != want+"\n" {
			t.Fatalf("%q: a head of one more line answered %d %q", eol, status, body)
		}
		if r := tp.record(t); r.Verdict != egress.Refused || r.Reason != want {
			t.Fatalf("record %+v", r)
		}
	}
}

// TestRequestHeaderLinesNotBody: the lines of a forwarded request's body,
// sent with its head in one write, are not counted as header lines.
func TestRequestHeaderLinesNotBody(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 1)
	serve.Serve(t, ln, func(c net.Conn) {
		r, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			seen <- err.Error()
			return
		}
		b, _ := io.ReadAll(r.Body)
		seen <- fmt.Sprintf("%d headers, %q", len(r.Header), b)
		io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
	})
	tp := startProxy(t, egress.Config{Policy: rights("127.0.0.1")})
	body := strings.Repeat("\n", 3000) + "end"
	// Content-Length is one of the lines; Host and User-Agent are sent
	// as the client sent them.
	head := fmt.Sprintf("POST http://127.0.0.1:%s/ HTTP/1.1\r\nContent-Length: %d\r\n%s\r\n", portOf(ln.Addr()), len(body), headerLines(egress.MaxRequestHeaderLines-1, "\r\n"))
	c, _, resp := tp.ask(t, head+body)
	c.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("answered %s", resp.Status)
	}
	if got, want := <-seen, fmt.Sprintf("%d headers, %q", egress.MaxRequestHeaderLines+1, body); got != want {
		t.Fatalf("the destination saw %s; want %s (the lines and the User-Agent the proxy keeps)", got, want)
	}
}

// TestResponseHeaderLines: an answer head of MaxResponseHeaderLines header
// lines is passed on, one of more is answered 502; each head is counted
// on its own (an interim one and the final one), and the body's lines,
// sent with the head, are not counted.
func TestResponseHeaderLines(t *testing.T) {
	max := egress.MaxResponseHeaderLines
	body := strings.Repeat("\r\n", 2000) + "end"
	final := func(n int) string {
		return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s", len(body), headerLines(n-1, "\r\n"), body)
	}
	interim := "HTTP/1.1 103 Early Hints\n" + headerLines(max, "\n") + "\n"
	over := fmt.Sprintf("the destination's response head has more than %d header lines", max)
	for _, tc := range []struct {
		name, answer, reason string
	}{
		{"at the limit", final(max), ""},
		{"past the limit", final(max + 1), over},
		{"interim and final at the limit", interim + final(max), ""},
		{"final past the limit", interim + final(max+1), over},
		{"interim past the limit", "HTTP/1.1 103 Early Hints\n" + headerLines(max+1, "\n") + "\n" + final(max), over},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := hangUpServer(t, tc.answer)
			tp := startProxy(t, egress.Config{Policy: rights("127.0.0.1")})
			c, br, resp := tp.ask(t, "GET http://127.0.0.1:"+port+"/ HTTP/1.1\r\n\r\n")
			got, _ := io.ReadAll(br)
			c.Close()
			r := tp.record(t)
			if tc.reason == "" {
				last := fmt.Sprintf("X-H%d", max-2)
				if resp.StatusCode != http.StatusOK || resp.Header.Get("X-H0") != "v" || resp.Header.Get(last) != "v" || string(got) != body || r.Verdict != egress.Allowed {
					t.Fatalf("answered %s with %d headers, %d bytes of body; record %+v", resp.Status, len(resp.Header), len(got), r)
				}
				return
			}
			if resp.StatusCode != http.StatusBadGateway || string(got) != tc.reason+"\n" || r.Verdict != egress.Failed || r.Reason != tc.reason {
				t.Fatalf("answered %s, %d bytes of body; record %+v", resp.Status, len(got), r)
			}
		})
	}
}

// TestResponseHeadBytes: an answer head of MaxResponseHeadBytes is passed
// on, one byte more is answered 502.
func TestResponseHeadBytes(t *testing.T) {
	head := func(n int) string {
		const start, end = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: ", "\r\n\r\n"
		return start + strings.Repeat("a", n-len(start)-len(end)) + end
	}
	for _, tc := range []struct {
		n      int
		status int
		body   string
	}{
		{egress.MaxResponseHeadBytes, http.StatusOK, "ok"},
		{egress.MaxResponseHeadBytes + 1, http.StatusBadGateway, "the destination's response head is too large\n"},
	} {
		port := hangUpServer(t, head(tc.n)+"ok")
		tp := startProxy(t, egress.Config{Policy: rights("127.0.0.1")})
		c, br, resp := tp.ask(t, "GET http://127.0.0.1:"+port+"/ HTTP/1.1\r\n\r\n")
		got, _ := io.ReadAll(br)
		c.Close()
		if resp.StatusCode != tc.status || string(got) != tc.body {
			t.Fatalf("a head of %d bytes answered %s %q; want %d %q", tc.n, resp.Status, got, tc.status, tc.body)
		}
	}
}

// TestForwardDestinationIdle: an answer whose body stops coming while its
// client waits for it ends after ClientIdleTimeout with nothing moving. On
// the old code the destination's read had no deadline once the answer's
// head was read: the slot was held for as long as the destination kept
// the connection open.
func TestForwardDestinationIdle(t *testing.T) {
	port := stallServer(t, true, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
	tp := startProxy(t, egress.Config{Policy: rights("127.0.0.1"), ClientIdleTimeout: 200 * time.Millisecond})
	c, br, resp := tp.ask(t, "GET http://127.0.0.1:"+port+"/ HTTP/1.1\r\n\r\n")
	defer c.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("answered %s", resp.Status)
	}
	// The client stays, reading what comes.
	got, _ := io.ReadAll(br)
	if string(got) != "abc" {
		t.Fatalf("passed on %q of the body", got)
	}
	if r := tp.record(t); r.Verdict != egress.Failed || r.Reason != "the destination's answer stopped coming" {
		t.Fatalf("record %+v", r)
	}
}

// TestForwardDestinationSlow: an answer whose body keeps coming, each
// piece well within ClientIdleTimeout but all of them together longer, is
// passed on whole: the bound is on each wait, not on the answer.
func TestForwardDestinationSlow(t *testing.T) {
	// Each pause is far within the bound (a loaded machine stretches it),
	// and all of them together, at least pieces × pause = 6s, longer.
	const pieces, pause, bound = 20, 300 * time.Millisecond, 5 * time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve.Serve(t, ln, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", pieces)
		for range pieces {
			time.Sleep(pause)
			if _, err := io.WriteString(c, "x"); err != nil {
				return
			}
		}
	})
	tp := startProxy(t, egress.Config{Policy: rights("127.0.0.1"), ClientIdleTimeout: bound})
	c, br, resp := tp.ask(t, "GET http://127.0.0.1:"+portOf(ln.Addr())+"/ HTTP/1.1\r\n\r\n")
	defer c.Close()
	// The body takes longer than ask's 10s guard may leave on a loaded
	// machine: a hang guard of its own for it.
	c.SetDeadline(time.Now().Add(wait.Guard))
	got, _ := io.ReadAll(br)
	if resp.StatusCode != http.StatusOK || string(got) != strings.Repeat("x", pieces) {
		t.Fatalf("answered %s %q", resp.Status, got)
	}
	if r := tp.record(t); r.Verdict != egress.Allowed {
		t.Fatalf("record %+v", r)
	}
}
