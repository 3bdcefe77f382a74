package forge_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentbox/internal/forge"
	"agentbox/internal/forge/githubtest"
)

const token = "ghp_testTOKEN0123456789abcdefghijklmnopq"

var repo = forge.Repo{Owner: "acme", Name: "widget"}

// newForge starts a fake GitHub and a client of it.
func newForge(t *testing.T) (*forge.GitHub, *githubtest.Server) {
	t.Helper()
	srv := githubtest.Start(t, token)
	return client(t, srv, 0), srv
}

func client(t *testing.T, srv *githubtest.Server, timeout time.Duration) *forge.GitHub {
	t.Helper()
	f, err := forge.New(forge.Config{APIURL: srv.URL, Token: token, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// lastCall is the server's last recorded call, which must carry the token.
func lastCall(t *testing.T, srv *githubtest.Server) githubtest.Call {
	t.Helper()
	calls := srv.Calls()
	if len(calls) == 0 {
		t.Fatal("no call reached the server")
	}
	c := calls[len(calls)-1]
	if !c.Authorized {
		t.Fatalf("%s %s without the token", c.Method, c.Path)
	}
	return c
}

// wantCall checks the request's method, path and JSON body.
func wantCall(t *testing.T, srv *githubtest.Server, method, path string, body any) {
	t.Helper()
	c := lastCall(t, srv)
	if c.Method != method || c.Path != path || !reflect.DeepEqual(c.Body, body) {
		t.Fatalf("call %s %s %#v\nwant %s %s %#v", c.Method, c.Path, c.Body, method, path, body)
	}
}

func TestIssueCalls(t *testing.T) {
	f, srv := newForge(t)
	ctx := t.Context()

	is, err := f.CreateIssue(ctx, repo, "Crash on start", "It crashes.", []string{"bug", "p1"})
	if err != nil {
		t.Fatal(err)
	}
	wantCall(t, srv, "POST", "/repos/acme/widget/issues",
		map[string]any{"title": "Crash on start", "body": "It crashes.", "labels": []any{"bug", "p1"}})
	if is.Number != 1 || is.URL != srv.URL+"acme/widget/issues/1" {
		t.Fatalf("CreateIssue = %+v", is)
	}

	url, err := f.Comment(ctx, repo, is.Number, "Found it.")
	if err != nil {
		t.Fatal(err)
	}
	wantCall(t, srv, "POST", "/repos/acme/widget/issues/1/comments", map[string]any{"body": "Found it."})
	if !strings.HasPrefix(url, srv.URL+"acme/widget/issues/1#issuecomment-") {
		t.Fatalf("comment URL %q", url)
	}

	if err := f.AddLabels(ctx, repo, is.Number, []string{"triaged"}); err != nil {
		t.Fatal(err)
	}
	wantCall(t, srv, "POST", "/repos/acme/widget/issues/1/labels", []any{"triaged"})

	url, err = f.CloseIssue(ctx, repo, is.Number)
	if err != nil {
		t.Fatal(err)
	}
	wantCall(t, srv, "PATCH", "/repos/acme/widget/issues/1", map[string]any{"state": "closed"})
	if url != is.URL {
		t.Fatalf("CloseIssue URL %q, want %q", url, is.URL)
	}

	got, _ := srv.Issue("acme/widget", 1)
	want := githubtest.Issue{Number: 1, Title: "Crash on start", Body: "It crashes.", Labels: []string{"bug", "p1", "triaged"},
		State: "closed", Comments: []string{"Found it."}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("issue on the server %+v, want %+v", got, want)
	}

	// No labels: the field is left out, as GitHub documents it optional.
	if _, err := f.CreateIssue(ctx, repo, "Second", "", nil); err != nil {
		t.Fatal(err)
	}
	wantCall(t, srv, "POST", "/repos/acme/widget/issues", map[string]any{"title": "Second", "body": ""})
}

func TestPullRequestCalls(t *testing.T) {
	f, srv := newForge(t)
	ctx := t.Context()

	pr, err := f.CreatePullRequest(ctx, repo, "jb/fix-crash", "main", "Fix the crash", "Fixes #1.", true)
	if err != nil {
		t.Fatal(err)
	}
	wantCall(t, srv, "POST", "/repos/acme/widget/pulls", map[string]any{
		"title": "Fix the crash", "head": "jb/fix-crash", "base": "main", "body": "Fixes #1.", "draft": true})
	want := forge.PR{Number: 1, URL: srv.URL + "acme/widget/pull/1", State: "open",
		HeadRef: "jb/fix-crash", HeadRepo: "acme/widget", BaseRef: "main", HeadDefault: "main"}
	if pr != want {
		t.Fatalf("CreatePullRequest = %+v, want %+v", pr, want)
	}

	// The same head and base again: GitHub's 422, with its reason.
	_, err = f.CreatePullRequest(ctx, repo, "jb/fix-crash", "main", "Again", "", false)
	var fe *forge.Error
	if !errors.As(err, &fe) || !fe.Certain || fe.Status != 422 ||
		fe.Msg != "Validation Failed: A pull request already exists for jb/fix-crash." {
		t.Fatalf("second pull request: %#v", err)
	}

	n := srv.AddPullRequest("acme/widget", githubtest.PR{Title: "From a fork", Head: "topic", HeadRepo: "eve/widget", HeadDefault: "trunk", Base: "main", State: "closed"})
	pr, err = f.PullRequest(ctx, repo, n)
	if err != nil {
		t.Fatal(err)
	}
	wantCall(t, srv, "GET", "/repos/acme/widget/pulls/2", nil)
	want = forge.PR{Number: 2, URL: srv.URL + "acme/widget/pull/2", State: "closed", HeadRef: "topic", HeadRepo: "eve/widget", BaseRef: "main", HeadDefault: "trunk"}
	if pr != want {
		t.Fatalf("PullRequest = %+v, want %+v", pr, want)
	}

	url, err := f.CreateReview(ctx, repo, 1, forge.ReviewRequestChanges, "Add a test.")
	if err != nil {
		t.Fatal(err)
	}
	wantCall(t, srv, "POST", "/repos/acme/widget/pulls/1/reviews", map[string]any{"event": "REQUEST_CHANGES", "body": "Add a test."})
	if !strings.HasPrefix(url, srv.URL+"acme/widget/pull/1#pullrequestreview-") {
		t.Fatalf("review URL %q", url)
	}
	if _, err := f.CreateReview(ctx, repo, 1, forge.ReviewApprove, ""); err != nil {
		t.Fatal(err)
	}
	wantCall(t, srv, "POST", "/repos/acme/widget/pulls/1/reviews", map[string]any{"event": "APPROVE"})
	got, _ := srv.PullRequest("acme/widget", 1)
	if want := []githubtest.Review{{Event: "REQUEST_CHANGES", Body: "Add a test."}, {Event: "APPROVE"}}; !reflect.DeepEqual(got.Reviews, want) {
		t.Fatalf("reviews on the server %+v, want %+v", got.Reviews, want)
	}
}

// TestErrorNeverEchoesToken: GitHub's answer (here a 401 whose message
// and body quote the token) reaches the error only as a bounded,
// sanitized message, without the token.
func TestErrorNeverEchoesToken(t *testing.T) {
	f, srv := newForge(t)
	body := `{"message":"Bad credentials: Bearer ` + token + `\u001b[31m","documentation_url":"https://docs.github.com/rest","raw":"` + token + `"}`
	srv.Inject(githubtest.Fault{Kind: githubtest.Refuse, Status: http.StatusUnauthorized, Body: body})
	_, err := f.CreateIssue(t.Context(), repo, "t", "b", nil)
	var fe *forge.Error
	if !errors.As(err, &fe) || fe.Status != 401 || !fe.Certain {
		t.Fatalf("err = %#v, want a certain 401 *forge.Error", err)
	}
	if strings.Contains(err.Error(), token) || strings.Contains(err.Error(), "docs.github.com") || strings.Contains(err.Error(), "\x1b") {
		t.Fatalf("the error carries the token or the raw answer: %q", err)
	}
	if want := "forge: create issue: HTTP 401: Bad credentials: Bearer [token] [31m"; err.Error() != want {
		t.Fatalf("err = %q, want %q", err, want)
	}

	// A validation error without a sentence names the field and code.
	srv.Inject(githubtest.Fault{Kind: githubtest.Refuse, Status: 422,
		Body: `{"message":"Validation Failed","errors":[{"resource":"Issue","field":"title","code":"missing_field"}]}`})
	_, err = f.CreateIssue(t.Context(), repo, "t", "b", nil)
	if !errors.As(err, &fe) || fe.Msg != "Validation Failed: title missing_field" {
		t.Fatalf("err = %#v", err)
	}

	// A long message is cut.
	srv.Inject(githubtest.Fault{Kind: githubtest.Refuse, Status: 422, Body: `{"message":"` + strings.Repeat("x", 10000) + `"}`})
	_, err = f.CreateIssue(t.Context(), repo, "t", "b", nil)
	if !errors.As(err, &fe) || len(fe.Msg) > forge.MaxMessageBytes+3 {
		t.Fatalf("a 10000-byte message gave %d bytes", len(fe.Msg))
	}
}

// TestOutcomeClassification: a refusal before any change is certain;
// a 5xx, a lost connection or a timeout after the request went out is
// uncertain, and the fake shows the change was indeed applied.
func TestOutcomeClassification(t *testing.T) {
	for _, c := range []struct {
		name    string
		fault   githubtest.Fault
		status  int
		certain bool
		applied bool
	}{
		{"404", githubtest.Fault{Kind: githubtest.Refuse, Status: 404, Body: `{"message":"Not Found"}`}, 404, true, false},
		{"422", githubtest.Fault{Kind: githubtest.Refuse, Status: 422, Body: `{"message":"Validation Failed"}`}, 422, true, false},
		{"403 rate limit", githubtest.Fault{Kind: githubtest.Refuse, Status: 403, Body: `{"message":"API rate limit exceeded"}`}, 403, true, false},
		{"redirect", githubtest.Fault{Kind: githubtest.Refuse, Status: 307, Body: `{}`}, 307, true, false},
		{"500 before", githubtest.Fault{Kind: githubtest.Refuse, Status: 500, Body: `{}`}, 500, false, false},
		{"502 after", githubtest.Fault{Kind: githubtest.ApplyThenStatus, Status: 502, Body: `<html>bad gateway</html>`}, 502, false, true},
		{"201 unreadable", githubtest.Fault{Kind: githubtest.ApplyThenStatus, Status: 201, Body: `{"number":`}, 201, false, true},
		{"201 without a number", githubtest.Fault{Kind: githubtest.ApplyThenStatus, Status: 201, Body: `{}`}, 0, false, true},
		{"201 too large", githubtest.Fault{Kind: githubtest.ApplyThenStatus, Status: 201,
			Body: `{"number":1,"body":"` + strings.Repeat("x", forge.MaxResponseBytes) + `"}`}, 201, false, true},
		{"dropped", githubtest.Fault{Kind: githubtest.ApplyThenDrop}, 0, false, true},
		{"hang", githubtest.Fault{Kind: githubtest.ApplyThenHang}, 0, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := githubtest.Start(t, token)
			f := client(t, srv, time.Second)
			srv.Inject(c.fault)
			_, err := f.CreateIssue(t.Context(), repo, "t", "b", nil)
			var fe *forge.Error
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want *forge.Error", err)
			}
			if fe.Status != c.status || fe.Certain != c.certain || forge.Uncertain(err) == c.certain {
				t.Fatalf("err = %+v, want status %d certain %v", fe, c.status, c.certain)
			}
			if _, applied := srv.Issue("acme/widget", 1); applied != c.applied {
				t.Fatalf("applied on the server: %v, want %v", applied, c.applied)
			}
			if strings.Contains(err.Error(), token) || strings.Contains(err.Error(), "bad gateway") {
				t.Fatalf("err = %q", err)
			}
		})
	}
}

func TestNoConnectionIsCertain(t *testing.T) {
	srv := githubtest.Start(t, token)
	f := client(t, srv, time.Second)
	srv.Close()
	_, err := f.CreateIssue(t.Context(), repo, "t", "b", nil)
	var fe *forge.Error
	if !errors.As(err, &fe) || !fe.Certain || fe.Msg != "cannot connect" {
		t.Fatalf("err = %#v, want a certain \"cannot connect\"", err)
	}

	// A context cancelled before the call: nothing sent.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = f.CreateIssue(ctx, repo, "t", "b", nil)
	if !errors.As(err, &fe) || !fe.Certain {
		t.Fatalf("err = %#v, want certain", err)
	}
}

// TestRefusedBeforeSending: arguments GitHub would refuse never leave the
// host, and the refusal is certain.
func TestRefusedBeforeSending(t *testing.T) {
	f, srv := newForge(t)
	ctx := t.Context()
	long := strings.Repeat("é", forge.MaxBodyRunes+1)
	for name, call := range map[string]func() error{
		"bad repo": func() error {
			_, err := f.CreateIssue(ctx, forge.Repo{Owner: "-x", Name: "y"}, "t", "", nil)
			return err
		},
		"empty title":      func() error { _, err := f.CreateIssue(ctx, repo, " ", "", nil); return err },
		"long title":       func() error { _, err := f.CreateIssue(ctx, repo, strings.Repeat("t", 257), "", nil); return err },
		"long body":        func() error { _, err := f.CreateIssue(ctx, repo, "t", long, nil); return err },
		"invalid UTF-8":    func() error { _, err := f.CreateIssue(ctx, repo, "t\xff", "", nil); return err },
		"control in label": func() error { _, err := f.CreateIssue(ctx, repo, "t", "", []string{"a\nb"}); return err },
		"long label":       func() error { return f.AddLabels(ctx, repo, 1, []string{strings.Repeat("l", 51)}) },
		"no labels":        func() error { return f.AddLabels(ctx, repo, 1, nil) },
		"number 0":         func() error { _, err := f.Comment(ctx, repo, 0, "x"); return err },
		"empty comment":    func() error { _, err := f.Comment(ctx, repo, 1, ""); return err },
		"negative close":   func() error { _, err := f.CloseIssue(ctx, repo, -1); return err },
		"fork head":        func() error { _, err := f.CreatePullRequest(ctx, repo, "eve:main", "main", "t", "", false); return err },
		"option head":      func() error { _, err := f.CreatePullRequest(ctx, repo, "-x", "main", "t", "", false); return err },
		"ref base": func() error {
			_, err := f.CreatePullRequest(ctx, repo, "a", "refs/heads/main", "t", "", false)
			return err
		},
		"unknown event":     func() error { _, err := f.CreateReview(ctx, repo, 1, "DISMISS", "x"); return err },
		"comment no body":   func() error { _, err := f.CreateReview(ctx, repo, 1, forge.ReviewComment, ""); return err },
		"read PR number -1": func() error { _, err := f.PullRequest(ctx, repo, -1); return err },
	} {
		err := call()
		var fe *forge.Error
		if !errors.As(err, &fe) || !fe.Certain || fe.Status != 0 {
			t.Errorf("%s: err = %#v, want a certain *forge.Error", name, err)
		}
	}
	if calls := srv.Calls(); len(calls) != 0 {
		t.Fatalf("refused calls reached the server: %+v", calls)
	}
}

func TestUncertain(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&forge.Error{Certain: true}, false},
		{&forge.Error{}, true},
		{errors.New("something else"), true},
	} {
		if got := forge.Uncertain(c.err); got != c.want {
			t.Errorf("Uncertain(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	for name, c := range map[string]forge.Config{
		"no token":         {APIURL: "https://api.github.com/"},
		"token with space": {APIURL: "https://api.github.com/", Token: "a b"},
		"token newline":    {APIURL: "https://api.github.com/", Token: "a\r\nX-Evil: 1"},
		"ftp":              {APIURL: "ftp://api.github.com/", Token: token},
		"credentials":      {APIURL: "https://u:p@api.github.com/", Token: token},
	} {
		_, err := forge.New(c)
		if err == nil || strings.Contains(err.Error(), c.Token) && c.Token != "" {
			t.Errorf("%s: New = %v", name, err)
		}
	}
	if _, err := forge.New(forge.Config{APIURL: "https://api.github.com/"}); !errors.Is(err, forge.ErrNoToken) {
		t.Fatalf("no token: %v, want ErrNoToken", err)
	}
}

// TestIsPullRequest: the issue read tells a pull request (GitHub's
// pull_request object) from an issue; its failure is certain, even a 5xx:
// a read applies nothing.
func TestIsPullRequest(t *testing.T) {
	f, srv := newForge(t)
	ctx := t.Context()
	is, err := f.CreateIssue(ctx, repo, "an issue", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	pr := srv.AddPullRequest("acme/widget", githubtest.PR{Title: "a pull request", Head: "topic", Base: "main"})
	for n, want := range map[int]bool{is.Number: false, pr: true} {
		got, err := f.IsPullRequest(ctx, repo, n)
		if err != nil || got != want {
			t.Fatalf("IsPullRequest(%d) = %v, %v; want %v", n, got, err, want)
		}
		wantCall(t, srv, "GET", "/repos/acme/widget/issues/"+strconv.Itoa(n), nil)
	}
	srv.Inject(githubtest.Fault{Kind: githubtest.Refuse, Status: 502, Body: `{"message": "Bad Gateway"}`})
	var fe *forge.Error
	if _, err := f.IsPullRequest(ctx, repo, pr); !errors.As(err, &fe) || !fe.Certain || fe.Status != 502 {
		t.Fatalf("IsPullRequest on a 502: %v", err)
	}
}

// TestAnswerURLIsPlain: the html_url of an answer is journaled, sent to
// the orchestrator in its status and printed by `jailbee outbox show` on
// the host's terminal. A forge answering one with terminal controls
// (ESC, a C1 CSI, a bidi override), another scheme, credentials, or
// longer than MaxURLBytes has it dropped: the action was applied (a 2xx
// with its number), only its URL is not kept. One of MaxURLBytes is kept.
func TestAnswerURLIsPlain(t *testing.T) {
	base := "https://github.com/acme/widget/issues/"
	atLimit := base + "1?" + strings.Repeat("a", forge.MaxURLBytes-len(base)-2)
	for name, c := range map[string]struct {
		url  string
		keep bool
	}{
		"plain":        {base + "1", true},
		"at the limit": {atLimit, true},
		"past it":      {atLimit + "a", false},
		"ESC":          {base + "1\x1b]0;pwned\x07", false},
		"C1 CSI":       {base + "1\u009b2J", false},
		"bidi":         {base + "1\u202e", false},
		"space":        {base + "1 x", false},
		"scheme":       {"javascript:alert(1)", false},
		"credentials":  {"https://u:p@github.com/acme/widget/issues/1", false},
		"no host":      {"https:///acme", false},
	} {
		t.Run(name, func(t *testing.T) {
			srv := githubtest.Start(t, token)
			f := client(t, srv, 0)
			body, _ := json.Marshal(map[string]any{"number": 1, "html_url": c.url})
			srv.Inject(githubtest.Fault{Kind: githubtest.Refuse, Status: 201, Body: string(body)})
			is, err := f.CreateIssue(t.Context(), repo, "t", "b", nil)
			if err != nil || is.Number != 1 {
				t.Fatalf("CreateIssue = %+v, %v", is, err)
			}
			want := ""
			if c.keep {
				want = c.url
			}
			if is.URL != want {
				t.Fatalf("URL %q (%d bytes), want %q", is.URL, len(is.URL), want)
			}
			srv.Inject(githubtest.Fault{Kind: githubtest.Refuse, Status: 201, Body: string(body)})
			if url, err := f.Comment(t.Context(), repo, 1, "c"); err != nil || url != want {
				t.Fatalf("Comment = %q, %v; want %q", url, err, want)
			}
		})
	}
}

// TestPullRequestAnswerRefsArePlain: a rework pushes to the head branch
// the forge's answer names, and publish quotes it (and the head
// repository) in the action's detail, which `jailbee outbox show` prints
// on the host's terminal. An answer whose branch names hold terminal
// controls (ESC, a C1 CSI, a bidi override) or pass MaxRefBytes, or whose
// head repository is not owner/name, is an answer that could not be read:
// none of its bytes reach the PR or the error. A name of MaxRefBytes is
// read.
func TestPullRequestAnswerRefsArePlain(t *testing.T) {
	long := strings.Repeat("b", forge.MaxRefBytes)
	for name, c := range map[string]struct {
		pr   githubtest.PR
		read bool
	}{
		"plain":             {githubtest.PR{Head: "topic", Base: "main"}, true},
		"head at the limit": {githubtest.PR{Head: long, Base: "main", HeadDefault: long[1:]}, true},
		"head past it":      {githubtest.PR{Head: long + "b", Base: "main"}, false},
		"head ESC":          {githubtest.PR{Head: "topic\x1b]0;pwned\x07", Base: "main"}, false},
		"head C1":           {githubtest.PR{Head: "topic\u009b2J", Base: "main"}, false},
		"head bidi":         {githubtest.PR{Head: "topic\u202e", Base: "main"}, false},
		"default ESC":       {githubtest.PR{Head: "topic", Base: "main", HeadDefault: "main\x1b[2J"}, false},
		"base C1":           {githubtest.PR{Head: "topic", Base: "main\u009d0;x\u009c"}, false},
		"head repo ESC":     {githubtest.PR{Head: "topic", Base: "main", HeadRepo: "acme/widget\x1b[2J"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			f, srv := newForge(t)
			n := srv.AddPullRequest("acme/widget", c.pr)
			pr, err := f.PullRequest(t.Context(), repo, n)
			if c.read {
				if err != nil || pr.HeadRef != c.pr.Head {
					t.Fatalf("PullRequest = %+v, %v", pr, err)
				}
				return
			}
			if err == nil || pr != (forge.PR{}) {
				t.Fatalf("PullRequest = %+v, %v; want an unreadable answer", pr, err)
			}
			if strings.ContainsAny(err.Error(), "\x1b\u009b\u009d\u202e") || strings.Contains(err.Error(), long) {
				t.Fatalf("the error carries the forge's bytes: %q", err)
			}
		})
	}
}

// TestRedirectNotFollowed: an API answering a redirect to another server
// (301, 302, 303, 307, 308, with a Location) is a certain refusal; the
// other server is asked nothing, so the bearer token never reaches it, and
// the error does not hold the token.
func TestRedirectNotFollowed(t *testing.T) {
	var otherCalls atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherCalls.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"number": 1, "html_url": "https://github.com/acme/widget/issues/1"}`)
	}))
	defer other.Close()
	for _, code := range []int{301, 302, 303, 307, 308} {
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", other.URL+r.URL.RequestURI())
			w.WriteHeader(code)
			io.WriteString(w, `{"message": "Moved to `+other.URL+`"}`)
		}))
		f, err := forge.New(forge.Config{APIURL: front.URL + "/", Token: token})
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.CreateIssue(t.Context(), repo, "t", "b", nil)
		front.Close()
		var fe *forge.Error
		if !errors.As(err, &fe) || !fe.Certain || fe.Status != code {
			t.Fatalf("%d: err = %#v, want a certain %d", code, err, code)
		}
		if strings.Contains(err.Error(), token) {
			t.Fatalf("%d: err = %q", code, err)
		}
		if n := otherCalls.Load(); n != 0 {
			t.Fatalf("%d: the redirect was followed (%d calls)", code, n)
		}
	}
}
