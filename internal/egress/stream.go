package egress

import (
	"bufio"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// established answers a CONNECT that reached its destination.
const established = "HTTP/1.1 200 Connection established\r\n\r\n"

// tunnel answers the CONNECT and copies both ways until both have ended
// (or one broke: then both are closed), and returns the bytes each way.
// What the client sent after its head is passed on first. Once one way
// has ended, the other goes on only while something moves on it within
// idle (copyTunnel). Copying between the raw connections lets the kernel
// splice them.
func tunnel(c net.Conn, br *bufio.Reader, up net.Conn, idle time.Duration) (upN, downN int64) {
	c.SetWriteDeadline(time.Now().Add(replyTimeout))
	if _, err := io.WriteString(c, established); err != nil {
		return 0, 0
	}
	c.SetWriteDeadline(time.Time{})
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		k, err := up.Write(b)
		upN += int64(k)
		if err != nil {
			return upN, 0
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		n, err := copyTunnel(up, c, idle)
		upN += n
		endCopy(up, c, err)
		up.SetReadDeadline(time.Now()) // the way back now runs against idle
	})
	n, err := copyTunnel(c, up, idle)
	downN = n
	endCopy(c, up, err)
	c.SetReadDeadline(time.Now())
	wg.Wait()
	return upN, downN
}

// errIdle ends a tunnel whose remaining way moved nothing within its idle
// period.
var errIdle = errors.New("nothing moved after the other way ended")

// copyTunnel copies r to w until r ends. r has no deadline until the other
// way has ended and set one in the past: that interrupts the copy (no
// bytes are lost, a deadline only stops the wait for more), and from then
// on each copy runs against a fresh deadline idle ahead; one that passes
// with nothing moved ends the tunnel with errIdle. Copying in periods
// rather than counting each read keeps the kernel's splice.
func copyTunnel(w, r net.Conn, idle time.Duration) (int64, error) {
	var total int64
	timed := false
	for {
		n, err := io.Copy(w, r)
		total += n
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return total, err
		}
		if timed && n == 0 {
			return total, errIdle
		}
		timed = true
		r.SetReadDeadline(time.Now().Add(idle))
	}
}

// endCopy passes on the end of one direction: the reader's EOF as a
// half-close of the writer, a broken copy as the end of both.
func endCopy(w, r net.Conn, err error) {
	if err != nil {
		w.Close()
		r.Close()
		return
	}
	if cw, ok := w.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	w.Close()
}

// hopByHop are headers that concern one connection only (RFC 9110, 7.6.1):
// neither the client's nor the destination's are passed on, nor what
// their Connection header names.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// forward sends one plain request to the destination in origin form and
// its response back, both ends told the connection closes after it, and
// returns the bytes each way. Each read of the client's body, each write
// of the request to the destination and each write of the answer to the
// client has idle to go through. Once the request is written the client
// has nothing more to send: its end (a close or a half-close) ends the
// forward at once, as a proxy does for a client that gave up, so a silent
// destination cannot keep the slot of a client that left. An httpError is
// returned only while nothing of the response has been written.
func forward(c net.Conn, req *http.Request, up net.Conn, idle time.Duration) (upN, downN int64, err error) {
	removeHopByHop(req.Header)
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		// Said here, so the client sends its body while the proxy writes
		// the request (which reads that body) to the destination.
		req.Header.Del("Expect")
		if _, err := io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return 0, 0, err
		}
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // Write would add Go's own
	}
	req.Close = true
	body := &idleReader{r: req.Body, c: c, idle: idle}
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = body // no body stays none (Write would send one of unknown length)
	}
	upw := &idleWriter{c: up, idle: idle}
	uw := &counter{w: upw}
	if err := req.Write(uw); err != nil {
		switch {
		case body.timedOut:
			return uw.n, 0, &httpError{http.StatusRequestTimeout, "the request body did not arrive in time"}
		case upw.timedOut:
			return uw.n, 0, &httpError{http.StatusGatewayTimeout, "the destination did not take the request in time"}
		}
		return uw.n, 0, &httpError{http.StatusBadGateway, "the request could not be passed on"}
	}
	up.SetWriteDeadline(time.Time{})
	// Whatever the client sends now (a pipelined request) is dropped; its
	// end closes the destination, which ends the reads and writes below.
	c.SetReadDeadline(time.Time{})
	var left atomic.Bool
	var watch sync.WaitGroup
	watch.Go(func() {
		if _, err := io.Copy(io.Discard, c); !errors.Is(err, os.ErrDeadlineExceeded) {
			left.Store(true)
			up.Close()
		}
	})
	defer func() {
		c.SetReadDeadline(time.Now()) // stops the watch
		watch.Wait()
		if err != nil && left.Load() {
			err = errClientLeft
		}
	}()
	upr := &upReader{c: up}
	resp, err := readResponse(upr, req)
	if err != nil {
		return uw.n, 0, err
	}
	defer resp.Body.Close()
	upr.idle = idle // each read of the body now has idle to bring something
	removeHopByHop(resp.Header)
	resp.Close = true
	cw := &counter{w: &idleWriter{c: c, idle: idle}}
	err = resp.Write(cw)
	if err != nil && upr.timedOut {
		err = errDestinationIdle
	}
	return uw.n, cw.n, err
}

// errClientLeft ends a forwarded request whose client closed its end
// before the whole answer was passed on.
var errClientLeft = errors.New("the client left before the answer ended")

// errDestinationIdle ends a forwarded request whose destination sent
// nothing more of its answer's body for its idle period.
var errDestinationIdle = errors.New("the destination's answer stopped coming")

// upReader reads a forwarded request's answer from its destination c:
// while idle is zero, under the deadline c already has (the head's);
// then each read is given idle to bring something.
type upReader struct {
	c        net.Conn
	idle     time.Duration
	timedOut bool
}

func (r *upReader) Read(b []byte) (int, error) {
	if r.idle > 0 {
		r.c.SetReadDeadline(time.Now().Add(r.idle))
	}
	n, err := r.c.Read(b)
	if r.idle > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		r.timedOut = true
	}
	return n, err
}

// idleReader reads a forwarded request's body from its client, each read
// given idle to bring something.
type idleReader struct {
	r        io.ReadCloser
	c        net.Conn
	idle     time.Duration
	timedOut bool
}

func (r *idleReader) Read(b []byte) (int, error) {
	r.c.SetReadDeadline(time.Now().Add(r.idle))
	n, err := r.r.Read(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		r.timedOut = true
	}
	return n, err
}

func (r *idleReader) Close() error { return r.r.Close() }

// idleWriter writes to c, each write given idle to go through: an answer
// to its client, a request to its destination.
type idleWriter struct {
	c        net.Conn
	idle     time.Duration
	timedOut bool
}

func (w *idleWriter) Write(b []byte) (int, error) {
	w.c.SetWriteDeadline(time.Now().Add(w.idle))
	n, err := w.c.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		w.timedOut = true // net/http does not always wrap what it is given
	}
	return n, err
}

// readResponse reads the destination's response head from up, bounded by
// MaxResponseHeadBytes (its interim heads included), MaxResponseHeaderLines
// (each head) and ResponseHeadTimeout; interim (1xx) responses are dropped
// (the client's 100 Continue was the proxy's own). It leaves up with no
// deadline: the caller bounds the body's reads (upReader.idle).
func readResponse(up *upReader, req *http.Request) (*http.Response, error) {
	lr := &io.LimitedReader{R: up, N: MaxResponseHeadBytes}
	hl := newHeadLines(lr, MaxResponseHeaderLines, false)
	br := bufio.NewReader(hl)
	up.c.SetReadDeadline(time.Now().Add(ResponseHeadTimeout))
	for {
		resp, err := http.ReadResponse(br, req)
		switch {
		case err == nil && resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, &httpError{http.StatusBadGateway, "the destination switched protocols"}
		case err == nil && resp.StatusCode < 200:
			continue
		case err == nil:
			up.c.SetReadDeadline(time.Time{})
			lr.N = math.MaxInt64
			hl.off = true
			return resp, nil
		case hl.over:
			return nil, &httpError{http.StatusBadGateway, "the destination's response head has more than " + strconv.Itoa(MaxResponseHeaderLines) + " header lines"}
		case lr.N <= 0:
			return nil, &httpError{http.StatusBadGateway, "the destination's response head is too large"}
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, &httpError{http.StatusGatewayTimeout, "the destination did not answer in time"}
		default:
			return nil, &httpError{http.StatusBadGateway, "the destination's answer is not HTTP"}
		}
	}
}

// counter counts the bytes written through it.
type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
