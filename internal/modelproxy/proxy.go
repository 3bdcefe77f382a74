// Package modelproxy serves the Anthropic Messages API to one sandbox over
// its model socket and forwards each request to the configured upstream
// with the host's key, so the key never enters a sandbox. One Proxy serves
// one sandbox: the broker creates it for the sandbox's listener, so the
// caller is known by the socket it came through, and every limit (body
// size, concurrent requests, how long a client may take to send or an
// upstream may stay silent) holds per sandbox: no sandbox can hold what
// another one needs.
//
// Only the API's model paths pass (POST /v1/messages, POST
// /v1/messages/count_tokens, GET /v1/models and GET /v1/models/ID); any
// credential the sandbox sends is dropped and the host's put in its
// place; only known headers go either way. Responses, server-sent events
// included, are streamed through as they arrive, and their usage is
// counted (Usage) from the response body or the stream's message_start
// and message_delta events; a response that ends before its final usage,
// or a request the upstream got that ends with no response at all, is
// charged its request's max_tokens as output. Redirects are never
// followed. Failures are answered in the API's own error
// format, never with the key, the upstream's address or a host path.
package modelproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"agentbox/internal/loglimit"
	"agentbox/internal/wire"
)

// Limits of one sandbox's model socket.
const (
	// MaxRequestBytes bounds a request body: the Messages API's own limit
	// for a request (32 MB), so nothing the upstream would take is refused.
	MaxRequestBytes = 32 << 20
	// MaxConcurrent is how many requests one sandbox may have in flight
	// at once (an agent and its parallel subagents); one more is answered
	// 429 at once rather than queued.
	MaxConcurrent = 8
	// RequestReadTimeout bounds how long a client may take to send a
	// request's headers and body: a slow client holds only its own slot.
	RequestReadTimeout = 60 * time.Second
	// StreamIdleTimeout bounds how long an upstream may send nothing in a
	// response (the API pings a stream every few seconds), and how long
	// one write of an answer may wait on a client that does not read it.
	StreamIdleTimeout = 5 * time.Minute
	// ConnIdleTimeout closes a keep-alive connection with no request.
	ConnIdleTimeout = 2 * time.Minute
	// RefusalLogBurst is how many requests refused before the upstream
	// (an unknown path, too many at once, a budget spent) one socket logs
	// one by one in each RefusalLogPeriod; the period's others are only
	// counted, and logged as one summary line at the period's end (or
	// when the socket closes). Such a refusal costs the sandbox next to nothing (a 404 comes
	// before any slot), so one line each would let it fill the broker's
	// log as fast as it can send.
	RefusalLogBurst = 20
	// RefusalLogPeriod is the period of RefusalLogBurst.
	RefusalLogPeriod = time.Second
	// MaxConns is how many connections one sandbox's model socket holds
	// open at once, requests or not (a connection that never sends a
	// request still costs the broker a descriptor and a goroutine); one
	// more is closed as soon as it is accepted.
	MaxConns = 64
	// maxHeaderBytes bounds a request's headers.
	maxHeaderBytes = 64 << 10
	// maxUsageBody bounds how much of a non-streamed response is kept to
	// read its usage (it is forwarded whole either way).
	maxUsageBody = 8 << 20
	// usageDrainTimeout bounds how long the rest of a non-streamed answer
	// is read, for its usage, after its client went away (the answer is
	// already written upstream: reading it costs nothing more).
	usageDrainTimeout = 10 * time.Second
)

// Usage is what one response reported: a request and its tokens (the
// shape the broker records and shows).
type Usage = wire.Usage

// Config is how one sandbox's model socket reaches its upstream.
type Config struct {
	// Upstream is the API's base URL (scheme and host, optionally a path
	// prefix), e.g. https://api.anthropic.com.
	Upstream *url.URL
	// Key is the host's API key, sent as x-api-key.
	Key string
	// Client sends the upstream requests (nil: a client of its own). New
	// uses a copy whose CheckRedirect follows no redirect, whatever this
	// one's says: a redirect would carry the key to another host.
	Client *http.Client
	// Record receives each response's usage, once, when the response has
	// ended (also when it ended early, or never came after the upstream
	// got the request). Nil records nothing.
	Record func(Usage)
	// Admit, when set, is asked before each request is forwarded; an
	// error is answered 429 with its message (e.g. a token budget spent).
	Admit func() error
	// Reserve, when set, is asked for each POST /v1/messages once its body
	// is read, with the output it may cost (its max_tokens, as a response
	// cut short is charged): requests in flight together are then not each
	// checked against a total that counts none of them. An error is
	// answered 429 with its message; release is called once the
	// response's usage has been given to Record.
	Reserve func(charge int64) (release func(), err error)
	// AdmitConn, when set, is asked for each connection within MaxConns
	// before it is served: the broker's budget of connections across
	// sandboxes. An error is answered 503 (overloaded_error, with the
	// error's message) and the connection closed; release gives the place
	// back when the connection closes.
	AdmitConn func() (release func(), err error)
	// AdmitBody, when set, is asked for each POST before its body is read,
	// with the bytes the body may hold in memory (its Content-Length, or
	// MaxRequestBytes when it has none): the broker's budget of request
	// bodies in flight across sandboxes. An error is answered 503
	// (overloaded_error, with the error's message) and the body is not
	// read; release gives the bytes back when the request has ended.
	AdmitBody func(n int64) (release func(), err error)
	// ProviderTools passes Messages requests that ask the provider to run
	// tools on its own side (web search and fetch, code execution, remote
	// MCP servers); without it they are refused 400, since those reach
	// the network past the sandbox's egress rights.
	ProviderTools bool
	// Log receives one line per request: method, path, status, bytes.
	Log *slog.Logger
	// ReadTimeout and StreamIdle replace RequestReadTimeout and
	// StreamIdleTimeout when set (tests shorten them); RefusalLogPeriod
	// replaces RefusalLogPeriod.
	ReadTimeout, StreamIdle, RefusalLogPeriod time.Duration
}

// Proxy is one sandbox's model socket handler.
type Proxy struct {
	cfg   Config
	slots chan struct{}

	// handlers counts the requests being served: Serve returns only once
	// they have, so their usage is recorded before the broker closes its
	// store. cut, once Serve's drain bound has passed, ends their
	// upstream requests (each then records its charge).
	handlers handlerCount
	cut      context.Context
	cutAll   context.CancelFunc

	// refusals bounds the lines of requests refused before the
	// upstream: RefusalLogBurst per period, the rest summed up.
	refusals *loglimit.Limiter
}

// New returns the handler of one sandbox's model socket.
func New(cfg Config) (*Proxy, error) {
	if cfg.Upstream == nil || (cfg.Upstream.Scheme != "https" && cfg.Upstream.Scheme != "http") || cfg.Upstream.Host == "" {
		return nil, errors.New("modelproxy: the upstream must be an http or https URL")
	}
	if cfg.Key == "" {
		return nil, errors.New("modelproxy: no API key")
	}
	cut, cutAll := context.WithCancel(context.Background())
	client := http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: StreamIdleTimeout,
		MaxIdleConnsPerHost:   MaxConcurrent,
		IdleConnTimeout:       ConnIdleTimeout,
	}}
	if cfg.Client != nil {
		client = *cfg.Client
	}
	// A redirect would send the key and the body to wherever it points:
	// none is followed, the 3xx is the answer (and refused in serve).
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	cfg.Client = &client
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = RequestReadTimeout
	}
	if cfg.StreamIdle <= 0 {
		cfg.StreamIdle = StreamIdleTimeout
	}
	if cfg.RefusalLogPeriod <= 0 {
		cfg.RefusalLogPeriod = RefusalLogPeriod
	}
	refusals := loglimit.New(RefusalLogBurst, cfg.RefusalLogPeriod, 1, func(counts []int) {
		cfg.Log.Info("model requests refused and not logged one by one", "count", counts[0])
	})
	return &Proxy{cfg: cfg, slots: make(chan struct{}, MaxConcurrent), cut: cut, cutAll: cutAll, refusals: refusals}, nil
}

// Serve answers HTTP on ln until ctx ends, then closes ln and the
// connections.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: p.cfg.ReadTimeout,
		IdleTimeout:       ConnIdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(p.cfg.Log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	err := srv.Serve(&limitListener{Listener: ln, slots: make(chan struct{}, MaxConns), admit: p.cfg.AdmitConn})
	// srv.Close does not wait for the handlers. One still reading a plain
	// answer for its usage (its client gone with the server) may take
	// usageDrainTimeout; past that, their upstream requests are ended,
	// and each records what it was charged.
	drained := p.handlers.zero()
	select {
	case <-drained:
	case <-time.After(usageDrainTimeout):
		p.cutAll()
		<-drained
	}
	p.refusals.Flush() // what was counted is written before Serve returns
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// handlerCount counts handlers running. Unlike a WaitGroup's, its count
// may rise again from zero while someone waits: a connection accepted
// just before the server closed may still start its handler.
type handlerCount struct {
	mu      sync.Mutex
	n       int
	waiters []chan struct{}
}

func (h *handlerCount) add(d int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n += d; h.n == 0 {
		for _, w := range h.waiters {
			close(w)
		}
		h.waiters = nil
	}
}

// zero is closed once no handler runs.
func (h *handlerCount) zero() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := make(chan struct{})
	if h.n == 0 {
		close(c)
	} else {
		h.waiters = append(h.waiters, c)
	}
	return c
}

// allowedPath reports whether method and path are one of the API's model
// calls.
func allowedPath(method, path string) bool {
	switch {
	case method == http.MethodPost && (path == "/v1/messages" || path == "/v1/messages/count_tokens"):
		return true
	case method == http.MethodGet && path == "/v1/models":
		return true
	case method == http.MethodGet && strings.HasPrefix(path, "/v1/models/"):
		id := strings.TrimPrefix(path, "/v1/models/")
		return id != "" && !strings.ContainsAny(id, "/\\") && id != "." && id != ".."
	}
	return false
}

// requestHeaders are the headers passed to the upstream (canonical form);
// every other, any credential included, is dropped.
var requestHeaders = []string{"Content-Type", "Accept", "Anthropic-Version", "Anthropic-Beta", "User-Agent", "X-Claude-Code-Session-Id"}

// responseHeaders are the upstream's headers passed back (canonical
// form), and those starting with Anthropic-Ratelimit-.
var responseHeaders = []string{"Content-Type", "Request-Id", "Retry-After", "Cache-Control", "X-Should-Retry"}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.handlers.add(1)
	defer p.handlers.add(-1)
	start := time.Now()
	var forwarded bool
	status, n := p.serve(w, r, &forwarded)
	if !forwarded && !p.refusals.Admit(0) {
		return
	}
	p.cfg.Log.Info("model request", "method", r.Method, "path", r.URL.Path, "status", status, "bytes", n, "ms", time.Since(start).Milliseconds())
}

// serve answers r; forwarded is set once the request goes to the
// upstream (what is answered before it is a refusal).
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, forwarded *bool) (status int, n int64) {
	// A deadline left by the connection's previous request must not cut
	// this one's answer.
	p.writeDeadline(w)
	// A body left unread (a refusal, a GET) is still read by net/http
	// after the answer (up to 256 KiB), with no deadline of its own: a
	// client that never sends it would hold the connection for ever. So
	// the connection goes with the answer, and the read deadline set here
	// ends that read at once; readBody lifts both once the body is read.
	unread := r.ContentLength != 0
	if unread {
		rc := http.NewResponseController(w)
		w.Header().Set("Connection", "close")
		_ = rc.SetReadDeadline(time.Now().Add(p.cfg.ReadTimeout))
		defer func() {
			if unread {
				_ = rc.SetReadDeadline(time.Now())
			}
		}()
	}
	if !allowedPath(r.Method, r.URL.Path) {
		// Its next request costs it a new connection: no pipelined
		// stream of refusals on one.
		w.Header().Set("Connection", "close")
		return apiError(w, http.StatusNotFound, "not_found_error", "the model socket serves POST /v1/messages, POST /v1/messages/count_tokens and GET /v1/models only")
	}
	select {
	case p.slots <- struct{}{}:
		defer func() { <-p.slots }()
	default:
		return apiError(w, http.StatusTooManyRequests, "rate_limit_error", fmt.Sprintf("more than %d requests at once from this sandbox", MaxConcurrent))
	}
	if p.cfg.Admit != nil {
		if err := p.cfg.Admit(); err != nil {
			return apiError(w, http.StatusTooManyRequests, "rate_limit_error", err.Error())
		}
	}
	if r.ContentLength > MaxRequestBytes {
		return apiError(w, http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("the request is over %d bytes", MaxRequestBytes))
	}
	if p.cfg.AdmitBody != nil && r.Method == http.MethodPost {
		size := r.ContentLength
		if size < 0 {
			size = MaxRequestBytes // no length said: it may be as large as allowed
		}
		release, err := p.cfg.AdmitBody(size)
		if err != nil {
			return apiError(w, http.StatusServiceUnavailable, "overloaded_error", err.Error())
		}
		defer release() // the body is held until the request has ended
	}
	body, status, n, ok := p.readBody(w, r)
	if !ok {
		return status, n
	}
	// What a Messages request may cost in output, parsed once: reserved
	// while it runs, charged when its answer never comes or is cut short.
	var charge int64
	if r.URL.Path == "/v1/messages" {
		charge = outputCharge(body)
		if !p.cfg.ProviderTools {
			switch tool, ok := providerTool(body); {
			case !ok:
				return apiError(w, http.StatusBadRequest, "invalid_request_error", "the request body is not a JSON object")
			case tool != "":
				return apiError(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("this model socket does not pass what the provider would fetch or run on its own side (%s): it would reach the network past the sandbox's egress rights; the host allows it with model.provider_tools in broker.yaml", tool))
			}
		}
	}
	if p.cfg.Reserve != nil && r.URL.Path == "/v1/messages" {
		release, err := p.cfg.Reserve(charge)
		if err != nil {
			return apiError(w, http.StatusTooManyRequests, "rate_limit_error", err.Error())
		}
		defer release() // after Record, below
	}
	unread = unread && r.Method != http.MethodPost

	// The client going away ends the upstream request (a stream stops
	// being generated), except a plain answer's body: it is read on for
	// its usage (copyResponse).
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	follow := context.AfterFunc(r.Context(), cancel)
	defer follow()
	defer context.AfterFunc(p.cut, cancel)()
	target := *p.cfg.Upstream
	target.Path = strings.TrimSuffix(target.Path, "/") + r.URL.Path
	target.RawQuery = r.URL.RawQuery
	var reqBody io.Reader
	if body != nil {
		reqBody = bytes.NewReader(body)
	}
	// Whether the upstream got the whole request: from then on it may be
	// generating an answer, and one that never comes back is charged.
	var sent atomic.Bool
	traced := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			sent.Store(true)
		}
	}})
	up, err := http.NewRequestWithContext(traced, r.Method, target.String(), reqBody)
	if err != nil {
		return apiError(w, http.StatusBadRequest, "invalid_request_error", "the request cannot be forwarded")
	}
	for _, h := range requestHeaders {
		if v := r.Header.Values(h); len(v) > 0 {
			up.Header[h] = v
		}
	}
	up.Header.Set("X-Api-Key", p.cfg.Key)
	*forwarded = true
	resp, err := p.cfg.Client.Do(up)
	// A client that stops reading must not hold the handler, its slot and
	// the request for ever: every write to it has StreamIdle to go
	// through (this one covers an answer written whole after the handler).
	p.writeDeadline(w)
	if err != nil {
		if sent.Load() && r.URL.Path == "/v1/messages" && p.cfg.Record != nil {
			// A plain answer is generated whole before its head is sent:
			// hanging up just before it (or an upstream too slow to send
			// it) must not make it free.
			p.cfg.Record(Usage{Requests: 1, OutputTokens: charge, InputTokens: inputCharge(body)})
		}
		if r.Context().Err() != nil {
			return 499, 0 // the client went away
		}
		return apiError(w, http.StatusBadGateway, "api_error", "the model upstream could not be reached")
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		// Not followed, and its Location (an address of the upstream's
		// choosing) is not passed on.
		p.cfg.Log.Warn("model upstream answered a redirect", "path", r.URL.Path, "status", resp.StatusCode)
		return apiError(w, http.StatusBadGateway, "api_error", "the model upstream answered with a redirect, which is not followed")
	}
	for k, v := range resp.Header {
		if containsFold(responseHeaders, k) || strings.HasPrefix(k, "Anthropic-Ratelimit-") {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	meter := &usageMeter{}
	streamed := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if !streamed {
		follow()
	}
	n, copyErr := p.copyResponse(ctx, cancel, w, resp.Body, meter, streamed)
	if resp.StatusCode == http.StatusOK && r.URL.Path == "/v1/messages" && p.cfg.Record != nil {
		u := meter.usage()
		u.Requests = 1
		if !meter.final {
			u.OutputTokens = max(u.OutputTokens, charge)
		}
		if u.InputTokens == 0 && u.CacheReadInputTokens == 0 && u.CacheCreationInputTokens == 0 {
			u.InputTokens = inputCharge(body) // cut before the answer said
		}
		p.cfg.Record(u)
	}
	if copyErr != nil {
		p.cfg.Log.Warn("model response cut", "path", r.URL.Path, "err", copyErr)
	}
	return resp.StatusCode, n
}

// readBody reads a POST body under MaxRequestBytes and
// RequestReadTimeout; a GET has none.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) (body []byte, status int, n int64, ok bool) {
	if r.Method != http.MethodPost {
		return nil, 0, 0, true
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(p.cfg.ReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		// The rest of the body is never read: the connection goes with
		// the answer (the read deadline stays, so nothing waits on it).
		w.Header().Set("Connection", "close")
		p.writeDeadline(w) // reading may have taken longer than it
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			status, n = apiError(w, http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("the request is over %d bytes", MaxRequestBytes))
		} else {
			status, n = apiError(w, http.StatusRequestTimeout, "invalid_request_error", "the request body did not arrive in time")
		}
		return nil, status, n, false
	}
	_ = rc.SetReadDeadline(time.Time{})
	w.Header().Del("Connection")
	return body, 0, 0, true
}

// copyResponse passes the upstream's body on as it arrives, flushing
// after every read, feeding the meter, and cancelling the upstream
// request (cancel) when it stays silent for StreamIdleTimeout. A plain
// body whose client went away is read on into the meter (at most
// maxUsageBody, for usageDrainTimeout), so its usage is still counted; a
// stream is not (that would let it be generated to its end).
func (p *Proxy) copyResponse(ctx context.Context, cancel context.CancelFunc, w http.ResponseWriter, body io.Reader, meter *usageMeter, streamed bool) (int64, error) {
	rc := http.NewResponseController(w)
	idle := time.AfterFunc(p.cfg.StreamIdle, cancel)
	defer idle.Stop()
	buf := make([]byte, 32<<10)
	var n int64
	var writeErr error // the client went away: nothing more is written
	for {
		k, err := body.Read(buf)
		if k > 0 {
			idle.Reset(p.cfg.StreamIdle)
			if streamed {
				meter.feedStream(buf[:k])
			} else {
				meter.feedBody(buf[:k])
			}
			if writeErr == nil {
				p.writeDeadline(w)
				_, werr := w.Write(buf[:k])
				if werr == nil {
					werr = rc.Flush()
				}
				if werr != nil {
					if streamed {
						return n, werr
					}
					writeErr = werr
					drain := time.AfterFunc(usageDrainTimeout, cancel)
					defer drain.Stop()
				} else {
					n += int64(k)
				}
			}
			if writeErr != nil && meter.bodyCut {
				return n, writeErr // its usage cannot be read
			}
		}
		if errors.Is(err, io.EOF) {
			if !streamed {
				meter.endBody()
			}
			return n, writeErr
		}
		if err != nil {
			if writeErr != nil {
				return n, writeErr
			}
			if ctx.Err() != nil && !errors.Is(ctx.Err(), context.Canceled) {
				return n, ctx.Err()
			}
			return n, err
		}
	}
}

// limitListener accepts at most cap(slots) connections open at once and
// closes any more as soon as they are accepted (rather than leave them
// queued, so a client learns at once). A connection admit refuses is
// answered 503 with the reason before it is closed.
type limitListener struct {
	net.Listener
	slots chan struct{}
	admit func() (release func(), err error)
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
		default:
			c.Close()
			continue
		}
		release := func() {}
		if l.admit != nil {
			if release, err = l.admit(); err != nil {
				<-l.slots
				refuseConn(c, err.Error())
				continue
			}
		}
		return &limitConn{Conn: c, slots: l.slots, release: release}, nil
	}
}

// refuseConn answers a connection that is not served with 503 in the
// API's error format, without reading its request, and closes it; a
// client that does not take the answer within a second loses it.
func refuseConn(c net.Conn, message string) {
	body := errorBody("overloaded_error", message)
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	c.Close()
}

// limitConn gives its slot and its admission back when closed (once:
// net/http may close a connection more than once).
type limitConn struct {
	net.Conn
	slots   chan struct{}
	release func()
	once    sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		<-c.slots
		c.release()
	})
	return err
}

// CloseWrite lets net/http half-close the connection before it closes it
// after an answer with Connection: close, as it does with the bare one.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// writeDeadline gives the next writes to the client StreamIdle.
func (p *Proxy) writeDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(p.cfg.StreamIdle))
}

// errorBody is an error in the Messages API's format.
func errorBody(kind, message string) string {
	return fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q}}`, kind, message)
}

// apiError answers in the Messages API's error format.
func apiError(w http.ResponseWriter, status int, kind, message string) (int, int64) {
	body := errorBody(kind, message)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	k, _ := io.WriteString(w, body)
	return status, int64(k)
}

func containsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}
