package egress

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// request is what a client's request head asks for.
type request struct {
	connect bool   // CONNECT host:port: a tunnel; else a plain HTTP request to forward
	host    string // checked (checkHost)
	port    uint16
	req     *http.Request // the parsed head; its Body reads the rest from the client
}

// httpError is an answer the proxy gives instead of a connection: status
// and a one-line reason that names nothing of the host.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func refused(msg string) *httpError    { return &httpError{http.StatusForbidden, msg} }
func badRequest(msg string) *httpError { return &httpError{http.StatusBadRequest, msg} }

// errNoRequest is a client that closed before it sent a request line.
var errNoRequest = errors.New("the client sent no request")

// readHead reads one request head from br, whose only source is hl
// (once, at most MaxRequestHeaderLines), whose only source is lr, and
// says what it asks for. lr must allow at most MaxHeadBytes: a head that
// does not end within them, or has more header lines than hl allows, is
// answered 431. The caller lifts lr's limit afterwards for a forwarded
// request's body.
func readHead(br *bufio.Reader, hl *headLines, lr *io.LimitedReader) (request, error) {
	req, err := http.ReadRequest(br)
	switch {
	case err == nil:
	case hl.over:
		return request{}, &httpError{http.StatusRequestHeaderFieldsTooLarge, "the request head has more than " + strconv.Itoa(hl.max) + " header lines"}
	case lr.N <= 0:
		return request{}, &httpError{http.StatusRequestHeaderFieldsTooLarge, "the request head is over " + strconv.Itoa(MaxHeadBytes) + " bytes"}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return request{}, &httpError{http.StatusRequestTimeout, "the request head did not arrive in time"}
	case errors.Is(err, io.EOF) && br.Buffered() == 0 && lr.N == MaxHeadBytes:
		return request{}, errNoRequest
	default:
		return request{}, badRequest("malformed request head")
	}
	if req.ProtoMajor != 1 {
		return request{}, badRequest("only HTTP/1.x is spoken here")
	}
	if req.Method == http.MethodConnect {
		return connectTarget(req)
	}
	return forwardTarget(req)
}

// connectTarget checks a CONNECT request: authority form host:port, no
// body.
func connectTarget(req *http.Request) (request, error) {
	if req.ContentLength != 0 || len(req.TransferEncoding) > 0 {
		return request{}, badRequest("a CONNECT request has no body")
	}
	host, port, err := net.SplitHostPort(req.RequestURI)
	if err != nil || strings.HasPrefix(req.RequestURI, "/") {
		return request{}, badRequest("CONNECT takes host:port")
	}
	return target(true, host, port, req)
}

// forwardTarget checks a plain request: an absolute http:// URL without
// credentials, port 80 unless it names one.
func forwardTarget(req *http.Request) (request, error) {
	u := req.URL
	switch {
	case u.Scheme == "https":
		return request{}, badRequest("https goes through CONNECT host:443")
	case u.Scheme != "http" || u.Host == "" || u.Opaque != "":
		return request{}, badRequest("this proxy takes CONNECT host:port or an absolute http:// URL")
	case u.User != nil:
		return request{}, badRequest("credentials in the URL are not forwarded")
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return target(false, u.Hostname(), port, req)
}

func target(connect bool, rawHost, rawPort string, req *http.Request) (request, error) {
	host, err := checkHost(rawHost)
	if err != nil {
		return request{}, badRequest(err.Error())
	}
	port, err := strconv.ParseUint(rawPort, 10, 16)
	if err != nil || port == 0 {
		return request{}, badRequest("the port must be 1 to 65535")
	}
	return request{connect: connect, host: host, port: uint16(port), req: req}, nil
}

// errHeaderLines is a head with more header lines than its headLines
// allows.
var errHeaderLines = errors.New("too many header lines")

// headLines counts the header lines of the heads read through it, before
// they are parsed: past max lines in one head, it reads nothing more and
// returns errHeaderLines (and over is set). A line is counted at its
// newline, the first line of a head (the request or status line) is not,
// and a head ends at its first empty line ("\n" or "\r\n"), as
// net/textproto reads it. With once, counting ends with the first head
// and what follows passes unread. Else each head is counted, until off:
// a read then returns no byte past a head's end (what the source gave
// beyond it is kept for the next read), so the next head, or the body
// once the caller has set off, starts afresh.
type headLines struct {
	r    io.Reader
	max  int
	once bool
	off  bool // counting has ended: reads pass through

	pending []byte // read from r, past a head's end
	err     error  // r's error that came with pending
	first   bool   // in the first line of a head
	lines   int    // header lines of the head so far
	state   uint8  // where in the current line: lineStart, lineCR, lineMid
	over    bool
}

const (
	lineStart = iota // at the start of a line
	lineCR           // after a line's leading '\r'
	lineMid          // within a line
)

func newHeadLines(r io.Reader, max int, once bool) *headLines {
	return &headLines{r: r, max: max, once: once, first: true}
}

func (h *headLines) Read(p []byte) (int, error) {
	if h.over {
		return 0, errHeaderLines
	}
	var n int
	var err error
	if len(h.pending) > 0 {
		n = copy(p, h.pending)
		h.pending = h.pending[n:]
	} else if h.err != nil {
		n, err, h.err = 0, h.err, nil
	} else {
		n, err = h.r.Read(p)
	}
	if h.off {
		return n, err
	}
	for i := 0; i < n; i++ {
		b := p[i]
		end := false
		switch {
		case h.state == lineStart && b == '\r':
			h.state = lineCR
		case h.state != lineMid && b == '\n':
			end = true
		case b == '\n':
			h.state = lineStart
			if h.first {
				h.first = false
			} else if h.lines++; h.lines > h.max {
				h.over = true
				return 0, errHeaderLines
			}
		default:
			h.state = lineMid
		}
		if !end {
			continue
		}
		h.first, h.lines, h.state = true, 0, lineStart
		if h.once {
			h.off = true
			return n, err
		}
		if rest := p[i+1 : n]; len(rest) > 0 {
			h.pending = append(append(make([]byte, 0, len(rest)+len(h.pending)), rest...), h.pending...)
			if err != nil {
				h.err, err = err, nil
			}
		}
		return i + 1, err
	}
	return n, err
}
