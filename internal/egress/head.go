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

// readHead reads one request head from br, whose only source is lr, and
// says what it asks for. lr must allow at most MaxHeadBytes: a head that
// does not end within them is answered 431. The caller lifts lr's limit
// afterwards for a forwarded request's body.
func readHead(br *bufio.Reader, lr *io.LimitedReader) (request, error) {
	req, err := http.ReadRequest(br)
	switch {
	case err == nil:
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
