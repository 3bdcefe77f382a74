// Package modeltest is a scripted Messages API server for tests: the
// model service cannot exist here, so this stands in for it. It answers
// each POST /v1/messages from a script of turns, chosen by how many
// assistant messages the request already holds (stateless, so a retried
// request gets the same answer), streamed as server-sent events when the
// request asks for a stream and as one JSON message otherwise. It records
// what it was sent, and the usage it reported, for the tests to compare.
package modeltest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Turn is one assistant answer.
type Turn struct {
	// Text is the answer's text (may be empty when Tool is set).
	Text string
	// Tool, when set, is a tool call after the text: the turn stops with
	// stop_reason "tool_use".
	Tool *ToolUse
	// Input, Output, CacheRead and CacheCreation are the usage reported.
	Input, Output, CacheRead, CacheCreation int64
	// Hold, when set, is waited on after message_start is sent (a
	// stream: a test sees the first event arrive before the rest exists),
	// or before anything of a plain answer is (an answer the upstream is
	// still generating: a plain one sends nothing until it is whole). The
	// turn's usage is reported before the hold, as the upstream bills it.
	Hold <-chan struct{}
	// HoldEnd, when set, is waited on before message_delta, the event
	// that carries the final output tokens (streams only): a test sees
	// the whole text arrive before the usage does.
	HoldEnd <-chan struct{}
	// Chunk splits the text into deltas of this many bytes (0: one).
	Chunk int
}

// ToolUse is a tool call of a turn.
type ToolUse struct {
	Name  string
	Input map[string]any
}

// Seen is one request as the server received it.
type Seen struct {
	Method, Path, Query string
	Header              http.Header
	Body                []byte
}

// Server is a running scripted upstream on a loopback port.
type Server struct {
	URL   string
	Turns []Turn

	mu       sync.Mutex
	seen     []Seen
	reported Total
	srv      *http.Server
}

// Total is the usage the server reported over all its message answers.
type Total struct {
	Requests, Input, Output, CacheRead, CacheCreation int64
}

// Reported returns the usage reported so far.
func (s *Server) Reported() Total {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reported
}

// Start serves turns on 127.0.0.1 until the test ends.
func Start(t testing.TB, turns ...Turn) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{URL: "http://" + ln.Addr().String(), Turns: turns}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	t.Cleanup(func() { s.srv.Close() })
	return s
}

// Seen returns the requests received so far.
func (s *Server) Seen() []Seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Seen(nil), s.seen...)
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.seen = append(s.seen, Seen{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: body})
	s.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"data":[{"type":"model","id":"scripted-model","display_name":"Scripted"}],"has_more":false}`)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/messages/count_tokens":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"input_tokens":%d}`, len(body)/4)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/messages":
		s.messages(r.Context(), w, body)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"type":"error","error":{"type":"not_found_error","message":"scripted: no such path"}}`)
	}
}

func (s *Server) messages(ctx context.Context, w http.ResponseWriter, body []byte) {
	var req struct {
		Stream   bool `json:"stream"`
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"scripted: not JSON"}}`)
		return
	}
	n := 0
	for _, m := range req.Messages {
		if m.Role == "assistant" {
			n++
		}
	}
	turn := Turn{Text: "(the script has no more turns)", Input: 1, Output: 1}
	if n < len(s.Turns) {
		turn = s.Turns[n]
	}
	s.mu.Lock()
	s.reported.Requests++
	s.reported.Input += turn.Input
	s.reported.Output += turn.Output
	s.reported.CacheRead += turn.CacheRead
	s.reported.CacheCreation += turn.CacheCreation
	s.mu.Unlock()
	w.Header().Set("Request-Id", fmt.Sprintf("req_scripted_%d", n))
	if req.Stream {
		stream(ctx, w, turn, n)
		return
	}
	if !wait(ctx, turn.Hold) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(message(turn, n))
}

func stopReason(t Turn) string {
	if t.Tool != nil {
		return "tool_use"
	}
	return "end_turn"
}

func usage(t Turn, output int64) map[string]any {
	return map[string]any{"input_tokens": t.Input, "output_tokens": output,
		"cache_read_input_tokens": t.CacheRead, "cache_creation_input_tokens": t.CacheCreation}
}

func message(t Turn, n int) map[string]any {
	content := []any{}
	if t.Text != "" {
		content = append(content, map[string]any{"type": "text", "text": t.Text})
	}
	if t.Tool != nil {
		content = append(content, map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d", n), "name": t.Tool.Name, "input": t.Tool.Input})
	}
	return map[string]any{"id": fmt.Sprintf("msg_%d", n), "type": "message", "role": "assistant", "model": "scripted-model",
		"content": content, "stop_reason": stopReason(t), "stop_sequence": nil, "usage": usage(t, t.Output)}
}

// stream writes turn as the API's server-sent events, flushing each.
// A hold ends early when the request does (the client went away).
func stream(ctx context.Context, w http.ResponseWriter, t Turn, n int) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	send := func(event string, data map[string]any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
		rc.Flush()
	}
	start := message(Turn{Input: t.Input, CacheRead: t.CacheRead, CacheCreation: t.CacheCreation}, n)
	start["content"], start["stop_reason"] = []any{}, nil
	start["usage"] = usage(t, 1)
	send("message_start", map[string]any{"type": "message_start", "message": start})
	if !wait(ctx, t.Hold) {
		return
	}
	index := 0
	if t.Text != "" {
		send("content_block_start", map[string]any{"type": "content_block_start", "index": index, "content_block": map[string]any{"type": "text", "text": ""}})
		for _, part := range chunks(t.Text, t.Chunk) {
			send("content_block_delta", map[string]any{"type": "content_block_delta", "index": index, "delta": map[string]any{"type": "text_delta", "text": part}})
		}
		send("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	if t.Tool != nil {
		in, _ := json.Marshal(t.Tool.Input)
		send("content_block_start", map[string]any{"type": "content_block_start", "index": index,
			"content_block": map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d", n), "name": t.Tool.Name, "input": map[string]any{}}})
		send("content_block_delta", map[string]any{"type": "content_block_delta", "index": index, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(in)}})
		send("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
	}
	if !wait(ctx, t.HoldEnd) {
		return
	}
	send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stopReason(t), "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": t.Output}})
	send("message_stop", map[string]any{"type": "message_stop"})
}

// wait waits on hold (nil: no wait) and reports whether the request is
// still there.
func wait(ctx context.Context, hold <-chan struct{}) bool {
	if hold == nil {
		return true
	}
	select {
	case <-hold:
		return true
	case <-ctx.Done():
		return false
	}
}

func chunks(s string, size int) []string {
	if size <= 0 || len(s) <= size {
		return []string{s}
	}
	var out []string
	for len(s) > size {
		out = append(out, s[:size])
		s = s[size:]
	}
	return append(out, s)
}

// RequestBody is a minimal Messages API request: one user message,
// streamed or not.
func RequestBody(text string, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": "scripted-model", "max_tokens": 1024, "stream": stream,
		"messages": []any{map[string]any{"role": "user", "content": text}}})
	return string(b)
}

// EventTypes lists the event types of a stream's text, in order.
func EventTypes(stream string) []string {
	var out []string
	for _, line := range strings.Split(stream, "\n") {
		if t, ok := strings.CutPrefix(line, "event: "); ok {
			out = append(out, t)
		}
	}
	return out
}
