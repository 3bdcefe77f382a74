package modelproxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/modelproxy"
	"agentbox/internal/modelproxy/modeltest"
	"agentbox/internal/testutil/admittest"
	"agentbox/internal/testutil/wait"
)

const hostKey = "sk-host-0123456789-THE-HOSTS-OWN-KEY"

// world is one sandbox's model socket in front of a scripted upstream.
type world struct {
	up     *modeltest.Server
	sock   string
	client *http.Client

	mu    sync.Mutex
	usage modelproxy.Usage
}

func newWorld(t *testing.T, edit func(*modelproxy.Config), turns ...modeltest.Turn) *world {
	t.Helper()
	w := &world{up: modeltest.Start(t, turns...)}
	u, err := url.Parse(w.up.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := modelproxy.Config{Upstream: u, Key: hostKey, Record: func(x modelproxy.Usage) {
		w.mu.Lock()
		w.usage.Add(x)
		w.mu.Unlock()
	}}
	if edit != nil {
		edit(&cfg)
	}
	w.sock, w.client = serveOnSocket(t, cfg)
	return w
}

// serveOnSocket builds a proxy of cfg, serves it on a fresh Unix socket
// until tb ends, and returns the socket and a client that dials it.
func serveOnSocket(tb testing.TB, cfg modelproxy.Config) (string, *http.Client) {
	tb.Helper()
	sock, client, _ := serveUntilStopped(tb, cfg)
	return sock, client
}

// serveUntilStopped is serveOnSocket that also returns stop, which ends
// Serve and returns once every request's handler has (called again, or
// when tb ends, it does nothing more).
func serveUntilStopped(tb testing.TB, cfg modelproxy.Config) (string, *http.Client, func()) {
	tb.Helper()
	p, err := modelproxy.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	sock := filepath.Join(tb.TempDir(), "anthropic.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Serve: %v", err)
		}
	})
	tb.Cleanup(stop)
	return sock, &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		MaxConnsPerHost: 64,
	}}, stop
}

func (w *world) recorded() modelproxy.Usage {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.usage
}

// post sends body as the agent would, with a credential of its own.
func (w *world) post(t *testing.T, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://localhost"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", "sk-placeholder-in-the-sandbox")
	req.Header.Set("Authorization", "Bearer sandbox-token")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Anthropic-Beta", "tools-2024")
	req.Header.Set("Cookie", "a=b")
	resp, err := w.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// apiErrorType decodes the API's error format.
func apiErrorType(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Type != "error" || e.Error.Message == "" {
		t.Fatalf("not the API's error format: %q", body)
	}
	return e.Error.Type
}

// TestMessageKeyAndUsage: a plain request reaches the upstream with the
// host's key and no credential or header of the sandbox's own; the
// answer comes back whole, and its usage is recorded once.
func TestMessageKeyAndUsage(t *testing.T) {
	w := newWorld(t, nil, modeltest.Turn{Text: "hello", Input: 11, Output: 7, CacheRead: 5, CacheCreation: 3})
	resp := w.post(t, "/v1/messages?beta=true", modeltest.RequestBody("hi", false))
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, `"text":"hello"`) || resp.Header.Get("Request-Id") != "req_scripted_0" {
		t.Fatalf("answer %d %q %v", resp.StatusCode, body, resp.Header)
	}
	seen := w.up.Seen()
	if len(seen) != 1 {
		t.Fatalf("upstream saw %d requests", len(seen))
	}
	h := seen[0].Header
	if h.Get("X-Api-Key") != hostKey || h.Get("Authorization") != "" || h.Get("Cookie") != "" ||
		h.Get("Anthropic-Version") != "2023-06-01" || h.Get("Anthropic-Beta") != "tools-2024" || seen[0].Query != "beta=true" {
		t.Fatalf("upstream headers %v query %q", h, seen[0].Query)
	}
	if got, want := w.recorded(), (modelproxy.Usage{Requests: 1, InputTokens: 11, OutputTokens: 7, CacheReadInputTokens: 5, CacheCreationInputTokens: 3}); got != want {
		t.Fatalf("usage %+v, want %+v", got, want)
	}
}

// TestStreamPassesThroughAsItArrives: the first event reaches the agent
// while the upstream still holds the rest, and the stream's usage (from
// message_start and message_delta) is recorded when it ends.
func TestStreamPassesThroughAsItArrives(t *testing.T) {
	hold := make(chan struct{})
	w := newWorld(t, nil, modeltest.Turn{Text: strings.Repeat("x", 3000), Chunk: 100, Input: 20, Output: 900, CacheRead: 4, Hold: hold})
	resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", true))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d %v", resp.StatusCode, resp.Header)
	}
	r := bufio.NewReader(resp.Body)
	first, err := r.ReadString('\n')
	if err != nil || first != "event: message_start\n" {
		t.Fatalf("first line %q %v", first, err)
	}
	if got := w.recorded(); got.Requests != 0 {
		t.Fatalf("usage recorded before the stream ended: %+v", got)
	}
	close(hold)
	rest, err := io.ReadAll(r)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	types := modeltest.EventTypes(first + string(rest))
	if len(types) != 35 || types[len(types)-1] != "message_stop" {
		t.Fatalf("events %q", types)
	}
	if got, want := w.recorded(), (modelproxy.Usage{Requests: 1, InputTokens: 20, OutputTokens: 900, CacheReadInputTokens: 4}); got != want {
		t.Fatalf("usage %+v, want %+v", got, want)
	}
}

// waitRecorded waits (generously) until w has recorded n requests.
func (w *world) waitRecorded(t *testing.T, n int64) modelproxy.Usage {
	t.Helper()
	for i := 0; i < 1000; i++ {
		if u := w.recorded(); u.Requests >= n {
			return u
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("usage of %d requests never recorded: %+v", n, w.recorded())
	return modelproxy.Usage{}
}

// TestStreamCutBeforeUsageChargesMaxTokens: a client that reads a
// stream's whole text and hangs up before message_delta (which carries
// the output tokens) is charged the request's max_tokens as output, or
// UnknownMaxTokens when the request names none.
func TestStreamCutBeforeUsageChargesMaxTokens(t *testing.T) {
	noMax := `{"model":"scripted-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		body string
		want int64
	}{
		{modeltest.RequestBody("hi", true), 1024},
		{noMax, modelproxy.UnknownMaxTokens},
	} {
		hold := make(chan struct{})
		defer close(hold)
		w := newWorld(t, nil, modeltest.Turn{Text: "the whole answer", Input: 7, Output: 50, HoldEnd: hold})
		resp := w.post(t, "/v1/messages", tc.body)
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("the stream ended before its text: %v", err)
			}
			if strings.HasPrefix(line, "event: content_block_stop") {
				break
			}
		}
		resp.Body.Close()
		if got, want := w.waitRecorded(t, 1), (modelproxy.Usage{Requests: 1, InputTokens: 7, OutputTokens: tc.want}); got != want {
			t.Errorf("usage %+v, want %+v", got, want)
		}
	}
}

// TestPlainAnswerCutCountsItsUsage: a client that reads the start of a
// plain (non-streamed) answer and hangs up is still charged the usage
// the answer reports at its end; an answer too long for its usage to be
// read (over maxUsageBody) is charged the request's max_tokens.
func TestPlainAnswerCutCountsItsUsage(t *testing.T) {
	w := newWorld(t, nil, modeltest.Turn{Text: strings.Repeat("v", 2<<20), Input: 5, Output: 777})
	resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", false))
	if _, err := io.ReadFull(resp.Body, make([]byte, 64<<10)); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the answer's start: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if got, want := w.waitRecorded(t, 1), (modelproxy.Usage{Requests: 1, InputTokens: 5, OutputTokens: 777}); got != want {
		t.Errorf("hung up: usage %+v, want %+v", got, want)
	}

	w = newWorld(t, nil, modeltest.Turn{Text: strings.Repeat("v", 9<<20), Input: 5, Output: 777})
	resp = w.post(t, "/v1/messages", modeltest.RequestBody("hi", false))
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"output_tokens":777`) {
		t.Fatalf("a long answer: %d, %d bytes", resp.StatusCode, len(body))
	}
	// Its usage was past what is kept to read it: its input is the body's.
	if got, want := w.waitRecorded(t, 1), (modelproxy.Usage{Requests: 1, OutputTokens: 1024, InputTokens: inputCharge(modeltest.RequestBody("hi", false))}); got != want {
		t.Errorf("a long answer: usage %+v, want %+v", got, want)
	}
}

// TestStalledReaderEndsItsRequest: clients that send streamed requests
// and never read the answers hold every slot only until a write to them
// has waited StreamIdle; then their requests end (charged max_tokens, as
// cut short) and a new request is served.
func TestStalledReaderEndsItsRequest(t *testing.T) {
	long := modeltest.Turn{Text: strings.Repeat("y", 4<<20), Chunk: 64 << 10, Input: 3, Output: 50}
	short := modeltest.Turn{Text: "short", Input: 3, Output: 50} // the answer to a second turn
	w := newWorld(t, func(c *modelproxy.Config) { c.StreamIdle = 300 * time.Millisecond }, long, short)
	second := `{"model":"scripted-model","max_tokens":1024,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"a"},{"role":"user","content":"b"}]}`
	body := modeltest.RequestBody("hi", true)
	for i := 0; i < modelproxy.MaxConcurrent; i++ {
		conn, err := net.Dial("unix", w.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close() // open, never read, until the test ends
		fmt.Fprintf(conn, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	for i := 0; len(w.up.Seen()) < modelproxy.MaxConcurrent; i++ {
		if i == 1000 {
			t.Fatalf("the upstream saw %d of the stalled requests", len(w.up.Seen()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	last := 0
	for i := 0; i < 1000 && last != 200; i++ {
		resp := w.post(t, "/v1/messages", second)
		readAll(t, resp)
		if last = resp.StatusCode; last != 200 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if last != 200 {
		t.Fatalf("stalled readers still hold the slots: %d", last)
	}
	stalled := int64(modelproxy.MaxConcurrent)
	want := modelproxy.Usage{Requests: stalled + 1, InputTokens: 3 * (stalled + 1), OutputTokens: 1024*stalled + 50}
	if got := w.waitRecorded(t, stalled+1); got != want {
		t.Fatalf("usage %+v, want %+v", got, want)
	}
}

// TestOnlyTheModelAPI: anything but the model calls is refused in the
// API's error format and never reaches the upstream; count_tokens and
// the model list pass and count no usage.
func TestOnlyTheModelAPI(t *testing.T) {
	w := newWorld(t, nil)
	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/messages"},
		{"POST", "/v1/messages/batches"},
		{"POST", "/v1/files"},
		{"GET", "/v1/models/a/b"},
		{"GET", "/v1/models/.."},
		{"GET", "/"},
		{"POST", "/v1/complete"},
		{"DELETE", "/v1/models/x"},
		{"GET", "/v1/organizations/me"},
	} {
		req, _ := http.NewRequest(tc.method, "http://localhost"+tc.path, strings.NewReader("{}"))
		resp, err := w.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != 404 || apiErrorType(t, body) != "not_found_error" {
			t.Errorf("%s %s: %d %q", tc.method, tc.path, resp.StatusCode, body)
		}
	}
	if n := len(w.up.Seen()); n != 0 {
		t.Fatalf("the upstream saw %d refused requests", n)
	}
	if resp := w.post(t, "/v1/messages/count_tokens", modeltest.RequestBody("hi", false)); resp.StatusCode != 200 || !strings.Contains(readAll(t, resp), "input_tokens") {
		t.Fatalf("count_tokens: %d", resp.StatusCode)
	}
	for _, p := range []string{"/v1/models", "/v1/models/scripted-model"} {
		resp, err := w.client.Get("http://localhost" + p)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if p == "/v1/models" && resp.StatusCode != 200 {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
	}
	if got := w.recorded(); got.Requests != 0 {
		t.Fatalf("usage counted for calls that are not messages: %+v", got)
	}
}

// TestRequestSize: a body of exactly MaxRequestBytes is forwarded; one
// byte more is refused (413, the API's request_too_large) and never
// forwarded.
func TestRequestSize(t *testing.T) {
	w := newWorld(t, nil)
	pad := func(n int) string {
		// A JSON request padded to exactly n bytes.
		base := modeltest.RequestBody("", false)
		fill := n - len(base)
		return strings.Replace(base, `"content":""`, `"content":"`+strings.Repeat("a", fill)+`"`, 1)
	}
	at := pad(modelproxy.MaxRequestBytes)
	if len(at) != modelproxy.MaxRequestBytes {
		t.Fatalf("padding: %d bytes", len(at))
	}
	if resp := w.post(t, "/v1/messages", at); resp.StatusCode != 200 {
		t.Fatalf("at the limit: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	resp := w.post(t, "/v1/messages", pad(modelproxy.MaxRequestBytes+1))
	if body := readAll(t, resp); resp.StatusCode != 413 || apiErrorType(t, body) != "request_too_large" {
		t.Fatalf("past the limit: %d %q", resp.StatusCode, body)
	}
	if n := len(w.up.Seen()); n != 1 {
		t.Fatalf("the upstream saw %d requests, want only the one at the limit", n)
	}
}

// TestConcurrentLimit: MaxConcurrent streams in flight at once are
// served; one more is answered 429 at once; when one ends, a new one
// passes.
func TestConcurrentLimit(t *testing.T) {
	hold := make(chan struct{})
	turns := make([]modeltest.Turn, 1)
	turns[0] = modeltest.Turn{Text: "held", Input: 1, Output: 1, Hold: hold}
	w := newWorld(t, nil, turns...)
	var open []*http.Response
	for i := 0; i < modelproxy.MaxConcurrent; i++ {
		resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", true))
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
		open = append(open, resp)
	}
	resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", true))
	if body := readAll(t, resp); resp.StatusCode != 429 || apiErrorType(t, body) != "rate_limit_error" {
		t.Fatalf("one past the limit: %d %q", resp.StatusCode, body)
	}
	close(hold)
	for _, r := range open {
		readAll(t, r)
	}
	// The slots are given back once the handlers return.
	var last int
	for i := 0; i < 100; i++ {
		resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", false))
		readAll(t, resp)
		if last = resp.StatusCode; last == 200 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if last != 200 {
		t.Fatalf("after the streams ended: %d", last)
	}
	if got := w.recorded(); got.Requests != int64(modelproxy.MaxConcurrent)+1 {
		t.Fatalf("usage requests %d", got.Requests)
	}
}

// TestSlowClientHoldsOnlyItsOwnSlot: a client that sends half a body and
// stalls is cut off after the read timeout, while other requests are
// answered meanwhile.
func TestSlowClientHoldsOnlyItsOwnSlot(t *testing.T) {
	// The read timeout bounds the request meanwhile too (its head and its
	// body): long enough for a loaded machine to send it whole.
	w := newWorld(t, func(c *modelproxy.Config) { c.ReadTimeout = 2 * time.Second })
	conn, err := net.Dial("unix", w.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	resp := w.post(t, "/v1/messages", modeltest.RequestBody("meanwhile", false))
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("another request while one stalls: %d", resp.StatusCode)
	}
	// The stalled client gets the API's timeout answer and its connection
	// is closed (the deadline only guards the test).
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	answer, err := io.ReadAll(conn)
	if err != nil || !strings.HasPrefix(string(answer), "HTTP/1.1 408 ") || !strings.Contains(string(answer), "invalid_request_error") {
		t.Fatalf("the stalled client: %q %v", answer, err)
	}
	if n := len(w.up.Seen()); n != 1 {
		t.Fatalf("the upstream saw %d requests", n)
	}
}

// rawAnswer sends req on a fresh connection to sock and reads until the
// proxy closes it; the deadline only guards the test.
func rawAnswer(t *testing.T, sock, req string) string {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	answer, err := io.ReadAll(conn)
	if err != nil {
		t.Errorf("%.40q: the connection was not closed with the answer: %q %v", req, answer, err)
	}
	return string(answer)
}

// TestUnreadBodyDoesNotHoldTheConnection: a request whose body the proxy
// never reads (a refused path, a refusal by Admit, a GET) and the client
// never sends is answered at once and its connection closed, rather than
// held waiting for the body; a request whose body was read keeps its
// connection.
func TestUnreadBodyDoesNotHoldTheConnection(t *testing.T) {
	w := newWorld(t, nil)
	for _, tc := range []struct{ req, status string }{
		{"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", "404"},
		{"POST /nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "404"},
		{"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", "200"},
		{"GET /v1/models HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "200"},
	} {
		if answer := rawAnswer(t, w.sock, tc.req); !strings.HasPrefix(answer, "HTTP/1.1 "+tc.status+" ") {
			t.Errorf("%.40q: %q", tc.req, answer)
		}
	}
	refused := newWorld(t, func(c *modelproxy.Config) { c.Admit = func() error { return errBudget } })
	if answer := rawAnswer(t, refused.sock, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"); !strings.HasPrefix(answer, "HTTP/1.1 429 ") {
		t.Errorf("refused by Admit: %q", answer)
	}
	resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", false))
	if readAll(t, resp); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("a request read whole: %d, connection closed %v", resp.StatusCode, resp.Close)
	}
}

// TestConnectionLimit: MaxConns connections open at once are all served;
// one more is closed unanswered; once one goes, a new one is served.
func TestConnectionLimit(t *testing.T) {
	w := newWorld(t, nil)
	const get = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
	// serveOne sends a request on a new connection and reads its answer,
	// leaving the connection open; it reports false if the proxy closed
	// the connection instead.
	serveOne := func() (net.Conn, bool) {
		conn, err := net.Dial("unix", w.sock)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(conn, get)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			conn.Close()
			return nil, false
		}
		readAll(t, resp)
		return conn, resp.StatusCode == 200
	}
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := 0; i < modelproxy.MaxConns; i++ {
		conn, ok := serveOne()
		if !ok {
			t.Fatalf("connection %d of %d not served", i+1, modelproxy.MaxConns)
		}
		open = append(open, conn)
	}
	if conn, ok := serveOne(); ok {
		conn.Close()
		t.Fatal("one connection past the limit was served")
	}
	open[0].Close()
	served := false
	for i := 0; i < 200 && !served; i++ {
		var conn net.Conn
		if conn, served = serveOne(); served {
			open[0] = conn
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !served {
		t.Fatal("a connection closed did not give its place back")
	}
}

// TestUpstreamFailures: an unreachable upstream is a 502 in the API's
// format that names neither the key nor the upstream; an upstream that
// goes silent mid-stream is cut, and what it reported is still counted.
func TestUpstreamFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	u, _ := url.Parse("http://" + dead)
	_, c := serveOnSocket(t, modelproxy.Config{Upstream: u, Key: hostKey})
	resp, err := c.Post("http://localhost/v1/messages", "application/json", strings.NewReader(modeltest.RequestBody("hi", false)))
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 502 || apiErrorType(t, body) != "api_error" || strings.Contains(body, dead) || strings.Contains(body, hostKey) {
		t.Fatalf("unreachable upstream: %d %q", resp.StatusCode, body)
	}

	hold := make(chan struct{})
	defer close(hold)
	w := newWorld(t, func(c *modelproxy.Config) { c.StreamIdle = 300 * time.Millisecond }, modeltest.Turn{Text: "never", Input: 9, Output: 1, Hold: hold})
	resp = w.post(t, "/v1/messages", modeltest.RequestBody("hi", true))
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if types := modeltest.EventTypes(string(got)); len(types) != 1 || types[0] != "message_start" {
		t.Fatalf("a silent upstream: %q", got)
	}
	// It never reported its output: the request's max_tokens is charged.
	if u := w.recorded(); u.Requests != 1 || u.InputTokens != 9 || u.OutputTokens != 1024 {
		t.Fatalf("usage of a cut stream: %+v", u)
	}
}

// TestCutBeforeAnswerCharged: a plain answer is generated whole before
// the upstream sends its head, so a request sent to the upstream that
// ends with no answer at all (its client hung up while the answer was
// being written, or the upstream's head took too long) is charged its
// max_tokens, as a response cut short is. On the old code neither was
// charged anything: a sandbox asked for a long plain answer and hung up
// just before it came, and its tree's budget never saw the tokens the
// upstream billed. A request the upstream never got (unreachable) is not
// charged.
func TestCutBeforeAnswerCharged(t *testing.T) {
	t.Run("client hung up", func(t *testing.T) {
		hold := make(chan struct{})
		defer close(hold)
		w := newWorld(t, nil, modeltest.Turn{Text: "late", Input: 7, Output: 500, Hold: hold})
		c, err := net.Dial("unix", w.sock)
		if err != nil {
			t.Fatal(err)
		}
		body := modeltest.RequestBody("hi", false)
		fmt.Fprintf(c, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		wait.For(t, "the upstream to get the request", func() bool { return len(w.up.Seen()) == 1 })
		c.Close()
		wait.For(t, "the request to be charged", func() bool { return w.recorded().Requests == 1 })
		// Its input too: the upstream read the prompt (a 32 MB one with
		// max_tokens 1, hung up on, cost the input budget nothing).
		if u := w.recorded(); u.OutputTokens != 1024 || u.InputTokens != inputCharge(body) {
			t.Fatalf("usage of a plain answer its client hung up on: %+v", u)
		}
	})
	t.Run("answer head too late", func(t *testing.T) {
		hold := make(chan struct{})
		defer close(hold)
		w := newWorld(t, func(c *modelproxy.Config) {
			c.Client = &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 200 * time.Millisecond}}
		}, modeltest.Turn{Text: "late", Input: 7, Output: 500, Hold: hold})
		resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", false))
		if body := readAll(t, resp); resp.StatusCode != 502 || strings.Contains(body, hostKey) {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
		wait.For(t, "the request to be charged", func() bool { return w.recorded().Requests == 1 })
		if u := w.recorded(); u.OutputTokens != 1024 || u.InputTokens != inputCharge(modeltest.RequestBody("hi", false)) {
			t.Fatalf("usage of a plain answer whose head came too late: %+v", u)
		}
	})
	t.Run("upstream unreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse("http://" + ln.Addr().String())
		ln.Close()
		var recorded []modelproxy.Usage
		var mu sync.Mutex
		_, c := serveOnSocket(t, modelproxy.Config{Upstream: u, Key: hostKey, Record: func(x modelproxy.Usage) {
			mu.Lock()
			recorded = append(recorded, x)
			mu.Unlock()
		}})
		resp, err := c.Post("http://localhost/v1/messages", "application/json", strings.NewReader(modeltest.RequestBody("hi", false)))
		if err != nil {
			t.Fatal(err)
		}
		if readAll(t, resp); resp.StatusCode != 502 {
			t.Fatalf("%d", resp.StatusCode)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(recorded) != 0 {
			t.Fatalf("a request the upstream never got was charged %+v", recorded)
		}
	})
}

// inputCharge is the input a request of body is charged when its answer
// never said: a token per modelproxy.BytesPerInputToken bytes, rounded up.
func inputCharge(body string) int64 {
	return (int64(len(body)) + modelproxy.BytesPerInputToken - 1) / modelproxy.BytesPerInputToken
}

// TestUpstreamRedirectNotFollowed: a 3xx from the upstream is never
// followed (the key and the body would go wherever it points), with the
// proxy's own client or one the caller gave; the sandbox gets a 502 in
// the API's format naming neither the target nor the upstream.
func TestUpstreamRedirectNotFollowed(t *testing.T) {
	var mu sync.Mutex
	var reached []string
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reached = append(reached, r.Header.Get("X-Api-Key"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"stolen":true}`)
	}))
	defer target.Close()
	// Another host name for the same loopback, as a redirect elsewhere.
	elsewhere := strings.Replace(target.URL, "127.0.0.1", "localhost", 1)
	status := http.StatusTemporaryRedirect
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, elsewhere+"/steal"+r.URL.Path, status)
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	for _, client := range []*http.Client{nil, {}} {
		_, c := serveOnSocket(t, modelproxy.Config{Upstream: u, Key: hostKey, Client: client})
		for _, status = range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
			for _, get := range []bool{false, true} {
				var resp *http.Response
				var err error
				if get {
					resp, err = c.Get("http://localhost/v1/models")
				} else {
					resp, err = c.Post("http://localhost/v1/messages", "application/json", strings.NewReader(modeltest.RequestBody("hi", false)))
				}
				if err != nil {
					t.Fatal(err)
				}
				body := readAll(t, resp)
				if resp.StatusCode != 502 || apiErrorType(t, body) != "api_error" || resp.Header.Get("Location") != "" ||
					strings.Contains(body, "steal") || strings.Contains(body, up.URL[len("http://"):]) || strings.Contains(body, hostKey) {
					t.Errorf("client %v, a %d (GET %v): %d %v %q", client != nil, status, get, resp.StatusCode, resp.Header, body)
				}
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reached) != 0 {
		t.Fatalf("the redirect target was reached %d times (keys %q)", len(reached), reached)
	}
}

// TestAdmit: a refusal by Admit (a spent budget) is a 429 with its
// message, and nothing is forwarded.
func TestAdmit(t *testing.T) {
	w := newWorld(t, func(c *modelproxy.Config) {
		c.Admit = func() error { return errBudget }
	})
	resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", false))
	body := readAll(t, resp)
	if resp.StatusCode != 429 || apiErrorType(t, body) != "rate_limit_error" || !strings.Contains(body, "budget") {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	if len(w.up.Seen()) != 0 {
		t.Fatal("forwarded")
	}
}

// TestReserve: each POST /v1/messages is reserved its max_tokens once its
// body is read, and the reservation is released only after its usage was
// recorded; a refused reservation is a 429 with its message and nothing
// is forwarded; other paths reserve nothing.
func TestReserve(t *testing.T) {
	var mu sync.Mutex
	var events []string
	refuse := false
	w := newWorld(t, func(c *modelproxy.Config) {
		c.Reserve = func(charge int64) (func(), error) {
			mu.Lock()
			defer mu.Unlock()
			if refuse {
				return nil, errBudget
			}
			events = append(events, fmt.Sprint("reserve ", charge))
			return func() {
				mu.Lock()
				events = append(events, fmt.Sprint("release ", charge))
				mu.Unlock()
			}, nil
		}
		record := c.Record
		c.Record = func(u modelproxy.Usage) {
			record(u)
			mu.Lock()
			events = append(events, fmt.Sprint("record ", u.OutputTokens))
			mu.Unlock()
		}
	}, modeltest.Turn{Text: "hi", Output: 9})
	readAll(t, w.post(t, "/v1/messages", modeltest.RequestBody("hi", true)))
	readAll(t, w.post(t, "/v1/messages/count_tokens", modeltest.RequestBody("hi", false)))
	mu.Lock()
	got := strings.Join(events, ", ")
	refuse = true
	mu.Unlock()
	if got != "reserve 1024, record 9, release 1024" {
		t.Fatalf("events: %s", got)
	}
	resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", false))
	if body := readAll(t, resp); resp.StatusCode != 429 || apiErrorType(t, body) != "rate_limit_error" || !strings.Contains(body, "budget") {
		t.Fatalf("refused: %d %q", resp.StatusCode, body)
	}
	if n := len(w.up.Seen()); n != 2 {
		t.Fatalf("the upstream saw %d requests, want 2", n)
	}
}

var errBudget = budgetError("the orchestrator tree's output token budget for this hour is spent")

type budgetError string

func (e budgetError) Error() string { return string(e) }

func TestNewRefuses(t *testing.T) {
	for _, raw := range []string{"ftp://x", "http://", "unix:///x"} {
		u, _ := url.Parse(raw)
		if _, err := modelproxy.New(modelproxy.Config{Upstream: u, Key: "k"}); err == nil {
			t.Errorf("upstream %q accepted", raw)
		}
	}
	u, _ := url.Parse("https://api.example")
	if _, err := modelproxy.New(modelproxy.Config{Upstream: u}); err == nil {
		t.Error("no key accepted")
	}
}

// BenchmarkModelSocket streams a 64 KiB answer (in 1 KiB text deltas)
// through the model socket, and the same request straight to the
// upstream, in one run: read ns/op as a ratio, and first-event-ns for the
// time to the first event.
func BenchmarkModelSocket(b *testing.B) {
	turn := modeltest.Turn{Text: strings.Repeat("y", 64<<10), Chunk: 1 << 10, Input: 10, Output: 100}
	up := modeltest.Start(b, turn)
	direct := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	u, _ := url.Parse(up.URL)
	_, viaSocket := serveOnSocket(b, modelproxy.Config{Upstream: u, Key: hostKey})
	body := modeltest.RequestBody("bench", true)
	run := func(b *testing.B, c *http.Client, base string) {
		var first time.Duration
		for i := 0; i < b.N; i++ {
			start := time.Now()
			resp, err := c.Post(base+"/v1/messages", "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			r := bufio.NewReader(resp.Body)
			if _, err := r.ReadString('\n'); err != nil {
				b.Fatal(err)
			}
			first += time.Since(start)
			if _, err := io.Copy(io.Discard, r); err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
		b.ReportMetric(float64(first.Nanoseconds())/float64(b.N), "first-event-ns")
	}
	b.Run("direct", func(b *testing.B) { run(b, direct, up.URL) })
	b.Run("socket", func(b *testing.B) { run(b, viaSocket, "http://localhost") })
}

// BenchmarkModelSocket16 streams the same 64 KiB answer to 16 sandboxes
// at once, each through its own model socket, and the same 16 requests
// straight to the upstream: ns/op is one round of 16; slowest-first-event-ns
// is the worst time to a first event in a round (no sandbox stalls
// another when it stays near the direct figure).
func BenchmarkModelSocket16(b *testing.B) {
	const sandboxes = 16
	turn := modeltest.Turn{Text: strings.Repeat("y", 64<<10), Chunk: 1 << 10, Input: 10, Output: 100}
	up := modeltest.Start(b, turn)
	u, _ := url.Parse(up.URL)
	var socketClients, directClients []*http.Client
	for i := 0; i < sandboxes; i++ {
		_, c := serveOnSocket(b, modelproxy.Config{Upstream: u, Key: hostKey})
		socketClients = append(socketClients, c)
		directClients = append(directClients, &http.Client{Transport: &http.Transport{}})
	}
	body := modeltest.RequestBody("bench", true)
	run := func(b *testing.B, clients []*http.Client, base string) {
		var worst time.Duration
		for i := 0; i < b.N; i++ {
			var wg sync.WaitGroup
			firsts := make([]time.Duration, len(clients))
			for k, c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					resp, err := c.Post(base+"/v1/messages", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					defer resp.Body.Close()
					r := bufio.NewReader(resp.Body)
					r.ReadString('\n')
					firsts[k] = time.Since(start)
					io.Copy(io.Discard, r)
				}()
			}
			wg.Wait()
			for _, f := range firsts {
				worst = max(worst, f)
			}
		}
		b.ReportMetric(float64(worst.Nanoseconds()), "slowest-first-event-ns")
	}
	b.Run("direct", func(b *testing.B) { run(b, directClients, up.URL) })
	b.Run("socket", func(b *testing.B) { run(b, socketClients, "http://localhost") })
}

// TestAdmitConn: a connection AdmitConn refuses is answered 503
// overloaded_error with the reason, without its request being read, and
// gives its socket slot back; an admitted one gives its admission back
// when it closes.
func TestAdmitConn(t *testing.T) {
	var gate admittest.Gate
	gate.Refuse(errors.New("the tree holds too many connections (tree.max_connections)"))
	w := newWorld(t, func(c *modelproxy.Config) { c.AdmitConn = gate.AdmitConn })
	// Refused MaxConns+1 times: no slot is kept by a refusal.
	for range modelproxy.MaxConns + 1 {
		conn, err := net.Dial("unix", w.sock)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		answer, _ := io.ReadAll(conn)
		conn.Close()
		if !strings.HasPrefix(string(answer), "HTTP/1.1 503 ") || !strings.Contains(string(answer), `"type":"overloaded_error"`) || !strings.Contains(string(answer), "tree.max_connections") {
			t.Fatalf("refused by AdmitConn: %q", answer)
		}
	}
	gate.Refuse(nil)
	resp := w.post(t, "/v1/messages", modeltest.RequestBody("hi", false))
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("admitted: %d %s", resp.StatusCode, body)
	}
	w.client.CloseIdleConnections()
	gate.WaitReleased(t)
}

// TestProviderToolsRefused: a sandbox with no egress right asks the
// provider to fetch a page for it (a web_fetch tool, a remote MCP server
// in the request, an image by URL): the request is refused 400 in the API's error
// format and never reaches the upstream, nor costs anything. A request
// with the client's own tools passes, and a host that allows provider
// tools (model.provider_tools) gets them forwarded.
func TestProviderToolsRefused(t *testing.T) {
	fetch := `{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"get it"}],` +
		`"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]}`
	mcp := `{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"get it"}],` +
		`"mcp_servers":[{"type":"url","url":"https://attacker.example/mcp","name":"x"}]}`
	own := `{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"hi"}],` +
		`"tools":[{"name":"Bash","description":"run","input_schema":{"type":"object"}}]}`

	w := newWorld(t, nil, modeltest.Turn{Text: "ok", Output: 2})
	image := `{"model":"m","max_tokens":64,"messages":[{"role":"user","content":[{"type":"image",` +
		`"source":{"type":"url","url":"https://attacker.example/pixel.png?d=secret"}}]}]}`
	for _, body := range []string{fetch, mcp, image, `{"tools":[]} trailing`} {
		resp := w.post(t, "/v1/messages", body)
		got := readAll(t, resp)
		if resp.StatusCode != 400 || apiErrorType(t, got) != "invalid_request_error" {
			t.Fatalf("%s: %d %q", body, resp.StatusCode, got)
		}
		if body != `{"tools":[]} trailing` && !strings.Contains(got, "model.provider_tools") {
			t.Fatalf("the refusal does not say how the host allows it: %q", got)
		}
	}
	if n := len(w.up.Seen()); n != 0 || w.recorded() != (modelproxy.Usage{}) {
		t.Fatalf("refused requests reached the upstream (%d) or were charged (%+v)", n, w.recorded())
	}
	if resp := w.post(t, "/v1/messages", own); resp.StatusCode != 200 {
		t.Fatalf("the client's own tools: %d %q", resp.StatusCode, readAll(t, resp))
	}

	allowed := newWorld(t, func(c *modelproxy.Config) { c.ProviderTools = true }, modeltest.Turn{Text: "ok", Output: 2})
	if resp := allowed.post(t, "/v1/messages", fetch); resp.StatusCode != 200 {
		t.Fatalf("with provider tools allowed: %d %q", resp.StatusCode, readAll(t, resp))
	}
	if n := len(allowed.up.Seen()); n != 1 {
		t.Fatalf("upstream saw %d requests", n)
	}
}

// TestAdmitBody: a POST asks AdmitBody for its Content-Length (the most
// a body of unsaid length may be when it has none) before its body is
// read; a refusal is answered 503 overloaded_error with the reason and
// nothing reaches the upstream; an admitted request gives its bytes back
// once it has ended. A body declared past MaxRequestBytes is answered 413
// at once, neither admitted nor read.
func TestAdmitBody(t *testing.T) {
	var mu sync.Mutex
	var asked []int64
	var refuse error
	held := 0
	w := newWorld(t, func(c *modelproxy.Config) {
		c.AdmitBody = func(n int64) (func(), error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, n)
			if refuse != nil {
				return nil, refuse
			}
			held++
			return func() { mu.Lock(); held--; mu.Unlock() }, nil
		}
	})
	body := modeltest.RequestBody("hi", false)
	resp := w.post(t, "/v1/messages", body)
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("admitted: %d %s", resp.StatusCode, b)
	}
	// A body of unsaid length (chunked) may be as large as allowed.
	req, err := http.NewRequest(http.MethodPost, "http://localhost/v1/messages", io.MultiReader(strings.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err = w.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("chunked: %d %s", resp.StatusCode, b)
	}
	mu.Lock()
	refuse = errors.New("orchestrator lead and its children hold 256 MiB of model request bodies")
	mu.Unlock()
	resp = w.post(t, "/v1/messages", body)
	if b := readAll(t, resp); resp.StatusCode != 503 || apiErrorType(t, b) != "overloaded_error" || !strings.Contains(b, "256 MiB of model request bodies") {
		t.Fatalf("refused: %d %s", resp.StatusCode, b)
	}
	if n := len(w.up.Seen()); n != 2 {
		t.Fatalf("the upstream saw %d requests, want the 2 admitted", n)
	}
	// Declared past the limit: answered at once, its body never sent.
	conn, err := net.Dial("unix", w.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", modelproxy.MaxRequestBytes+1)
	if answer, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil || answer.StatusCode != 413 {
		t.Fatalf("declared past the limit: %v %v", answer, err)
	}
	// The bytes are given back as each handler returns.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		h := held
		mu.Unlock()
		if h == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d admissions still held", h)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []int64{int64(len(body)), modelproxy.MaxRequestBytes, int64(len(body))}; !slices.Equal(asked, want) {
		t.Fatalf("AdmitBody asked %v, want %v", asked, want)
	}
}

// TestRefusalsLogBounded: a sandbox that floods its model socket with
// requests it refuses before the upstream (here unknown paths, each
// answered with Connection: close) gets RefusalLogBurst lines a period in
// the broker's log, not one each; what reaches the upstream is logged
// every time.
func TestRefusalsLogBounded(t *testing.T) {
	var logged wait.Buffer
	up := modeltest.Start(t, modeltest.Turn{Text: "ok", Input: 1, Output: 1})
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	sock, client, stop := serveUntilStopped(t, modelproxy.Config{Upstream: u, Key: hostKey, RefusalLogPeriod: time.Hour,
		Log: slog.New(slog.NewTextHandler(&logged, nil))})
	const flood = 3 * modelproxy.RefusalLogBurst
	for range flood {
		if a := rawAnswer(t, sock, "GET /v1/files HTTP/1.1\r\nHost: model\r\n\r\n"); !strings.HasPrefix(a, "HTTP/1.1 404 ") || !strings.Contains(a, "\r\nConnection: close\r\n") {
			t.Fatalf("an unknown path: %q", a)
		}
	}
	resp, err := client.Post("http://model/v1/messages", "application/json", strings.NewReader(`{"model":"m","max_tokens":5,"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	client.CloseIdleConnections()
	stop() // every handler has logged
	refused := strings.Count(logged.String(), "path=/v1/files status=404")
	if refused != modelproxy.RefusalLogBurst {
		t.Errorf("%d of %d refusals logged one by one, want %d", refused, flood, modelproxy.RefusalLogBurst)
	}
	if !strings.Contains(logged.String(), "path=/v1/messages status=200") {
		t.Errorf("the forwarded request was not logged:\n%s", logged.String())
	}
	// The rest are summed up, at the latest when the socket closes.
	if want := fmt.Sprintf("msg=\"model requests refused and not logged one by one\" count=%d", flood-modelproxy.RefusalLogBurst); !strings.Contains(logged.String(), want) {
		t.Errorf("no summary %q:\n%s", want, logged.String())
	}
}
