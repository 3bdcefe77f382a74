package broker_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/modelproxy"
	"agentbox/internal/modelproxy/modeltest"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// usageOf is the usage the broker recorded for sandbox name.
func usageOf(e *testEnv, name string) wire.Usage {
	e.t.Helper()
	var res wire.UsageResult
	if err := e.admin("usage", wire.UsageArgs{Name: name}, &res); err != nil {
		e.t.Fatalf("usage %s: %v", name, err)
	}
	for _, r := range res.Rows {
		if r.Name == name && !r.Destroyed {
			return r.Usage
		}
	}
	return wire.Usage{}
}

// wantUsage compares what the broker recorded with what the scripted
// upstream reported.
func wantUsage(t *testing.T, got wire.Usage, up modeltest.Total) {
	t.Helper()
	if want := usageFrom(up); got != want {
		t.Fatalf("recorded usage %+v, the upstream reported %+v", got, want)
	}
}

func usageFrom(up modeltest.Total) wire.Usage {
	return wire.Usage{Requests: up.Requests, InputTokens: up.Input, OutputTokens: up.Output,
		CacheReadInputTokens: up.CacheRead, CacheCreationInputTokens: up.CacheCreation}
}

// waitUsageSettles waits for up to have answered requests messages (a
// session's last turn may come after the event the test waited for) and
// then for name's recorded usage to equal what up reported, both read in
// one poll: the proxy records a request after its answer ends.
func waitUsageSettles(t *testing.T, e *testEnv, name string, up *modeltest.Server, requests int64) {
	t.Helper()
	wait.For(t, fmt.Sprintf("the upstream to answer %d requests", requests), func() bool { return up.Reported().Requests >= requests })
	var got, want wire.Usage
	for deadline := time.Now().Add(wait.Guard); ; time.Sleep(10 * time.Millisecond) {
		got, want = usageOf(e, name), usageFrom(up.Reported())
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("recorded usage %+v, the upstream reported %+v", got, want)
		}
	}
}

// newModelEnv is a broker whose model sockets forward to up with hostKey.
func newModelEnv(t *testing.T, up *modeltest.Server, perHour int64) *testEnv {
	t.Helper()
	e := newModelEnvStopped(t, up, perHour)
	e.start()
	return e
}

// newModelEnvStopped is newModelEnv without starting its broker.
func newModelEnvStopped(t *testing.T, up *modeltest.Server, perHour int64) *testEnv {
	t.Helper()
	e := newTestEnvStopped(t)
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	e.model = &broker.ModelConfig{Upstream: u, Key: hostKey, MaxOutputTokensPerHour: perHour}
	return e
}

// curlModel sends one request on the sandbox's model socket (the host's
// curl, which local sandboxes see in /usr) and returns what it printed:
// the response body, then the status code on a line of its own.
func curlModel(e *testEnv, name, method, path, body string) string {
	e.t.Helper()
	args := []string{"curl", "-sS", "--unix-socket", "/run/jailbee/model/anthropic.sock", "-X", method,
		"-H", "x-api-key: sk-ant-from-inside", "-H", "authorization: Bearer inside", "-H", "content-type: application/json",
		"-w", "\n%{http_code}", "http://localhost" + path}
	if body != "" {
		args = append(args, "--data-binary", body)
	}
	return e.mustExec(name, args...)
}

// TestModelSocket: an orchestrator's model socket forwards the Messages
// API to the upstream with the host's key in place of whatever the
// sandbox sent, streams the answer, refuses other paths in the API's
// error format, survives a broker restart, and goes with the sandbox.
func TestModelSocket(t *testing.T) {
	localOnly(t, "the request is sent with the host's curl, which Incus images lack (TestClaudeChildToDone covers Incus)")
	up := modeltest.Start(t, modeltest.Turn{Text: "hello from the model", Input: 11, Output: 7, CacheRead: 3, CacheCreation: 2, Chunk: 4})
	e := newModelEnv(t, up, 0)
	e.orchestrator("lead")

	out := curlModel(e, "lead", "POST", "/v1/messages?beta=true", modeltest.RequestBody("hi", true))
	if !strings.HasSuffix(out, "\n200") || !strings.Contains(out, "event: message_stop") || !strings.Contains(out, `"text":"hell"`) {
		t.Fatalf("streamed answer:\n%s", out)
	}
	seen := up.Seen()
	if len(seen) != 1 || seen[0].Header.Get("X-Api-Key") != hostKey || seen[0].Header.Get("Authorization") != "" || seen[0].Query != "beta=true" {
		t.Fatalf("the upstream saw %+v", seen)
	}
	out = curlModel(e, "lead", "GET", "/v1/organizations/me", "")
	if !strings.HasSuffix(out, "\n404") || !strings.Contains(out, `"type":"not_found_error"`) || strings.Contains(out, up.URL) {
		t.Fatalf("a path outside the API:\n%s", out)
	}
	// A tool the provider would run (a fetch of any address, past the
	// sandbox's egress rights) is refused by default.
	out = curlModel(e, "lead", "POST", "/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]}`)
	if !strings.HasSuffix(out, "\n400") || !strings.Contains(out, `"type":"invalid_request_error"`) || !strings.Contains(out, "web_fetch_20250910") {
		t.Fatalf("a provider-side tool:\n%s", out)
	}
	if n := len(up.Seen()); n != 1 {
		t.Fatalf("a refused request reached the upstream (%d requests)", n)
	}

	// On the host: owner-only, under <state>/model, named after the
	// random part of the orchestration socket directory's name.
	_, random, _ := strings.Cut(filepath.Base(filepath.Dir(e.b.SocketPath("lead"))), ".")
	modelDir := filepath.Join(e.state, broker.ModelDir, random)
	fi, err := os.Lstat(filepath.Join(modelDir, broker.ModelSocketName))
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("model socket on the host: %v %v", fi, err)
	}

	// A restarted broker serves the running sandbox again, at the same
	// place (a running local sandbox keeps the directory it started with).
	e.restart()
	if out := curlModel(e, "lead", "POST", "/v1/messages", modeltest.RequestBody("again", false)); !strings.HasSuffix(out, "\n200") || !strings.Contains(out, "hello from the model") {
		t.Fatalf("after a restart:\n%s", out)
	}

	// Both answers were counted, durably: the figures survived the restart.
	wantUsage(t, usageOf(e, "lead"), up.Reported())
	if got := e.info("lead").Tokens; got != up.Reported().Input+up.Reported().Output {
		t.Fatalf("ls shows %d tokens", got)
	}

	if err := e.admin("destroy", wire.DestroyArgs{Name: "lead", Force: true}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(modelDir); !os.IsNotExist(err) {
		t.Fatalf("the model socket's directory outlived its sandbox: %v", err)
	}
}

// TestModelBudget: past model.max_output_tokens_per_hour an orchestrator
// tree's requests (the orchestrator's and its children's alike) are
// answered 429 in the API's format, without reaching the upstream, and
// the orchestrator is told once.
func TestModelBudget(t *testing.T) {
	localOnly(t, "the request is sent with the host's curl, which Incus images lack")
	up := modeltest.Start(t, modeltest.Turn{Text: "spent", Input: 5, Output: 60})
	e := newModelEnv(t, up, 100)
	e.orchestrator("lead")
	e.child("kid", "lead")
	lead := e.client("lead")

	// 60 then 120 output tokens: under the budget before each request.
	for _, name := range []string{"kid", "lead"} {
		if out := curlModel(e, name, "POST", "/v1/messages", modeltest.RequestBody("hi", false)); !strings.HasSuffix(out, "\n200") {
			t.Fatalf("%s under the budget:\n%s", name, out)
		}
	}
	for range 2 {
		for _, name := range []string{"kid", "lead"} {
			out := curlModel(e, name, "POST", "/v1/messages", modeltest.RequestBody("more", false))
			if !strings.HasSuffix(out, "\n429") || !strings.Contains(out, `"type":"rate_limit_error"`) || !strings.Contains(out, "max_output_tokens_per_hour: 100") {
				t.Fatalf("%s past the budget:\n%s", name, out)
			}
		}
	}
	if n := up.Reported().Requests; n != 2 {
		t.Fatalf("the upstream answered %d requests, want the 2 under the budget", n)
	}
	note := messageFrom(t, lead, "lead", "note")
	if !strings.Contains(note.Body, "model requests of lead and its children are refused") {
		t.Fatalf("note: %q", note.Body)
	}
	noMessageFrom(t, lead, "lead", "note", 2*time.Second)
}

// TestModelInputBudget: past model.max_input_tokens_per_hour (uncached
// input, cache reads and cache writes together) a tree's requests are
// refused like past the output budget, naming the input budget: a request
// of max_tokens 1 with a large prompt costs the key's owner its whole
// input and the output budget next to nothing.
func TestModelInputBudget(t *testing.T) {
	localOnly(t, "the request is sent with the host's curl, which Incus images lack")
	up := modeltest.Start(t, modeltest.Turn{Text: "x", Input: 40, CacheRead: 15, CacheCreation: 5, Output: 1})
	e := newModelEnvStopped(t, up, 1000)
	e.model.MaxInputTokensPerHour = 120
	e.start()
	e.orchestrator("lead")
	e.child("kid", "lead")
	// 60 then 120 input tokens: under the budget before each request.
	for _, name := range []string{"kid", "lead"} {
		if out := curlModel(e, name, "POST", "/v1/messages", modeltest.RequestBody("hi", false)); !strings.HasSuffix(out, "\n200") {
			t.Fatalf("%s under the input budget:\n%s", name, out)
		}
	}
	out := curlModel(e, "kid", "POST", "/v1/messages", modeltest.RequestBody("more", false))
	if !strings.HasSuffix(out, "\n429") || !strings.Contains(out, `"type":"rate_limit_error"`) || !strings.Contains(out, "the input token budget of orchestrator lead (model.max_input_tokens_per_hour: 120) is spent for now: 120 input tokens in the last hour") {
		t.Fatalf("past the input budget:\n%s", out)
	}
	if n := up.Reported().Requests; n != 2 {
		t.Fatalf("the upstream answered %d requests, want the 2 under the budget", n)
	}
	if note := messageFrom(t, e.client("lead"), "lead", "note"); !strings.Contains(note.Body, "120 input tokens in the last hour reached model.max_input_tokens_per_hour (120)") {
		t.Fatalf("note: %q", note.Body)
	}
}

// TestBudgetNotesByKind: the hourly note that a tree's budget is spent
// is given once per budget: an orchestrator told its output budget is
// spent is told of its input budget too, each once.
func TestBudgetNotesByKind(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("lead")
	lead := e.client("lead")
	e.b.NoteBudgetSpentForTest("lead", "output", "the output one")
	e.b.NoteBudgetSpentForTest("lead", "input", "the input one")
	e.b.NoteBudgetSpentForTest("lead", "input", "the input one again")
	for _, want := range []string{"the output one", "the input one;"} {
		if note := messageFrom(t, lead, "lead", "note"); !strings.Contains(note.Body, want) {
			t.Fatalf("note %q, want one saying %q", note.Body, want)
		}
	}
	noMessageFrom(t, lead, "lead", "note", time.Second)
}

// TestModelBudgetConcurrent: requests in flight together are not each
// checked against the same total, which counts none of them yet. With
// model.max_output_tokens_per_hour 3000, nothing used and 8 streamed
// requests at once of max_tokens 1024 each (a child's whole
// modelproxy.MaxConcurrent), only the 3 whose reservations fit under the
// budget reach the upstream (0, 1024 and 2048 reserved before each); the
// rest are answered 429 at once. On the old code all 8 were forwarded, so
// a tree could pass its budget by its concurrency times max_tokens, every
// hour. Once they end, their usage replaces their reservation.
func TestModelBudgetConcurrent(t *testing.T) {
	localOnly(t, "dials the sandbox's model socket from the host")
	hold := make(chan struct{})
	up := modeltest.Start(t, modeltest.Turn{Text: "held", Input: 5, Output: 60, Hold: hold})
	e := newModelEnv(t, up, 3000)
	e.orchestrator("lead")
	e.child("kid", "lead")
	client := modelClient(socketOf(e, "kid", broker.ModelSocketName))
	client.Timeout = 0

	type result struct {
		code int
		body string
	}
	results := make(chan result, modelproxy.MaxConcurrent)
	var held sync.WaitGroup
	for range modelproxy.MaxConcurrent {
		held.Go(func() {
			resp, err := client.Post("http://model/v1/messages", "application/json", strings.NewReader(modeltest.RequestBody("hi", true)))
			if err != nil {
				results <- result{body: err.Error()}
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				results <- result{resp.StatusCode, string(b)}
				return
			}
			results <- result{code: resp.StatusCode}
			io.Copy(io.Discard, resp.Body) // held until the hold ends
		})
	}
	defer held.Wait()
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	counts := map[int]int{}
	for range modelproxy.MaxConcurrent {
		select {
		case r := <-results:
			counts[r.code]++
			if r.code != http.StatusOK && (r.code != http.StatusTooManyRequests || !strings.Contains(r.body, "reserved by requests in flight")) {
				t.Errorf("a refusal: %d %q", r.code, r.body)
			}
		case <-time.After(wait.Guard):
			t.Fatalf("answers so far %v", counts)
		}
	}
	if counts[http.StatusOK] != 3 || len(up.Seen()) != 3 {
		t.Fatalf("at once, under a budget of 3000 with 1024 reserved each: answers %v, the upstream saw %d requests, want 3", counts, len(up.Seen()))
	}
	close(hold)
	released = true
	held.Wait()
	waitUsageSettles(t, e, "kid", up, 3)
	// The reservations are gone: 180 used, room for 2 more of 1024.
	if out := curlModel(e, "kid", "POST", "/v1/messages", modeltest.RequestBody("again", false)); !strings.HasSuffix(out, "\n200") {
		t.Fatalf("after the requests ended:\n%s", out)
	}
}

// TestModelBudgetHugeMaxTokens: a request in flight reserves its
// max_tokens, but never more than any model may write in one answer
// (modelproxy.UnknownMaxTokens): a child that names max_tokens 2⁴⁰ (the
// upstream would refuse it) and holds the request open reserved 2⁴⁰, and
// every other request of its tree was answered 429 for as long as it
// held it (and, hung up after the upstream got it, was charged 2⁴⁰ for
// the hour). Under a budget of 1,000,000 its orchestrator's request goes
// through beside it.
func TestModelBudgetHugeMaxTokens(t *testing.T) {
	localOnly(t, "dials the sandbox's model socket from the host")
	hold := make(chan struct{})
	up := modeltest.Start(t, modeltest.Turn{Text: "held", Input: 5, Output: 60, Hold: hold},
		modeltest.Turn{Text: "free", Input: 5, Output: 60})
	e := newModelEnv(t, up, 1_000_000)
	e.orchestrator("lead")
	e.child("kid", "lead")
	client := modelClient(socketOf(e, "kid", broker.ModelSocketName))
	client.Timeout = 0
	huge := `{"model":"scripted-model","max_tokens":1099511627776,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	done := make(chan error, 1)
	go func() {
		resp, err := client.Post("http://model/v1/messages", "application/json", strings.NewReader(huge))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	released := false
	defer func() {
		if !released {
			close(hold)
		}
		<-done
	}()
	wait.For(t, "the upstream to get the child's request", func() bool { return len(up.Seen()) == 1 })
	// One assistant turn in: the script answers it with its second turn,
	// which it does not hold.
	second := `{"model":"scripted-model","max_tokens":1024,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"held"},{"role":"user","content":"beside it"}]}`
	if out := curlModel(e, "lead", "POST", "/v1/messages", second); !strings.HasSuffix(out, "\n200") {
		t.Fatalf("the orchestrator's request beside the child's max_tokens of 2^40:\n%s", out)
	}
	close(hold)
	released = true
}

// TestModelUsageRecordedAcrossShutdown: a plain answer still arriving
// when the broker shuts down (its client gone with the model socket's
// server, the broker reads it on for its usage) is recorded before
// broker.db is closed: once its usage comes, or, past the drain bound,
// charged its max_tokens. The model servers' handlers outlived their
// Serve: the store closed first and the record failed, so a sandbox
// that kept requests in flight had them free at each restart.
func TestModelUsageRecordedAcrossShutdown(t *testing.T) {
	localOnly(t, "dials the sandbox's model socket from the host")
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"slow"}],`)
		http.NewResponseController(w).Flush()
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, `"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":60}}`)
	}))
	defer up.Close()
	defer close(release)
	u, _ := url.Parse(up.URL)
	e := newTestEnvStopped(t)
	e.model = &broker.ModelConfig{Upstream: u, Key: hostKey}
	e.start()
	e.orchestrator("lead")
	e.child("kid", "lead")
	client := modelClient(socketOf(e, "kid", broker.ModelSocketName))
	client.Timeout = 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := client.Post("http://model/v1/messages", "application/json", strings.NewReader(modeltest.RequestBody("hi", false)))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	select {
	case <-arrived:
	case <-time.After(wait.Guard):
		t.Fatal("the answer never started")
	}
	e.restart()
	<-done
	if got := usageOf(e, "kid"); got.Requests != 1 || got.OutputTokens != 1024 {
		t.Fatalf("the answer cut by the shutdown: recorded %+v, want 1 request charged its max_tokens (1024)", got)
	}
}
