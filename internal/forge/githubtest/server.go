// Package githubtest is a local stand-in for the subset of GitHub's REST
// API the forge package uses: issues (create, read, comment, labels, close),
// pull requests (read, create) and reviews (create). It keeps its state in
// memory, records every call, and injects failures per call, so tests see
// what the host sent and how it copes with a forge that refuses, fails or
// applies a change and then never answers.
package githubtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"
)

// Call is one request the server received.
type Call struct {
	Method string
	Path   string // the URL path, "/repos/o/n/issues"
	// Body is the JSON body decoded into any (map[string]any, []any, ...);
	// nil for none.
	Body any
	// Authorized is whether the Authorization header carried the token.
	Authorized bool
}

// FaultKind is what an injected fault does.
type FaultKind int

const (
	// Refuse answers Status and Body without applying anything.
	Refuse FaultKind = iota + 1
	// ApplyThenStatus applies the change, then answers Status and Body
	// (a 5xx after the change was made).
	ApplyThenStatus
	// ApplyThenDrop applies the change, then closes the connection
	// without an answer.
	ApplyThenDrop
	// ApplyThenHang applies the change, then sends nothing until the
	// client gives up (or the server closes).
	ApplyThenHang
)

// Fault is a failure for the first call that matches it (Method and Path
// "" match any).
type Fault struct {
	Method string
	Path   string
	Kind   FaultKind
	Status int
	Body   string
}

// Issue is an issue or pull request's issue side as the server holds it.
type Issue struct {
	Number   int
	Title    string
	Body     string
	Labels   []string
	State    string
	Comments []string
	IsPR     bool
}

// PR is a pull request as the server holds it.
type PR struct {
	Number   int
	Title    string
	Body     string
	Head     string
	HeadRepo string // "owner/name"
	// HeadDefault is the head repository's default branch; "" is main.
	HeadDefault string
	Base        string
	Draft       bool
	State       string
	Reviews     []Review
}

// Review is a submitted review.
type Review struct {
	Event string
	Body  string
}

// repoState is one repository's issues and pull requests, which share
// their numbers as on GitHub.
type repoState struct {
	next   int
	issues map[int]*Issue
	pulls  map[int]*PR
}

// Server is the fake GitHub.
type Server struct {
	// URL is the API's base URL, ending in "/".
	URL   string
	token string
	srv   *httptest.Server
	done  chan struct{}

	mu     sync.Mutex
	calls  []Call
	faults []Fault
	repos  map[string]*repoState
	nextID int
}

// Start starts a server on a loopback TCP port that accepts token (as
// "Bearer TOKEN" or "token TOKEN") and stops it when the test ends.
func Start(t testing.TB, token string) *Server {
	t.Helper()
	s := &Server{token: token, done: make(chan struct{}), repos: map[string]*repoState{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL + "/"
	t.Cleanup(s.Close)
	return s
}

// Close releases hanging answers and stops the server.
func (s *Server) Close() {
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		return
	default:
		close(s.done)
	}
	s.mu.Unlock()
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Inject queues a fault for the first call that matches it.
func (s *Server) Inject(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// Calls returns every call received so far, in order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Issue returns a copy of issue number of repo ("owner/name").
func (s *Server) Issue(repo string, number int) (Issue, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.repo(repo).issues[number]
	if !ok {
		return Issue{}, false
	}
	c := *i
	c.Labels = append([]string(nil), i.Labels...)
	c.Comments = append([]string(nil), i.Comments...)
	return c, true
}

// PullRequest returns a copy of pull request number of repo.
func (s *Server) PullRequest(repo string, number int) (PR, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.repo(repo).pulls[number]
	if !ok {
		return PR{}, false
	}
	c := *p
	c.Reviews = append([]Review(nil), p.Reviews...)
	return c, true
}

// AddPullRequest stores p in repo (p.Number 0: the next number) and
// returns its number.
func (s *Server) AddPullRequest(repo string, p PR) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addPR(s.repo(repo), repo, p)
}

// repo is the state of "owner/name", created empty. s.mu is held.
func (s *Server) repo(name string) *repoState {
	r, ok := s.repos[name]
	if !ok {
		r = &repoState{next: 1, issues: map[int]*Issue{}, pulls: map[int]*PR{}}
		s.repos[name] = r
	}
	return r
}

// routes maps a method and path to its handler.
var routes = []struct {
	method string
	path   *regexp.Regexp
	handle func(s *Server, rs *repoState, repo string, num int, body any) (int, any)
}{
	{"POST", regexp.MustCompile(`^/repos/([^/]+/[^/]+)/issues$`), (*Server).createIssue},
	{"POST", regexp.MustCompile(`^/repos/([^/]+/[^/]+)/issues/([0-9]+)/comments$`), (*Server).comment},
	{"POST", regexp.MustCompile(`^/repos/([^/]+/[^/]+)/issues/([0-9]+)/labels$`), (*Server).addLabels},
	{"PATCH", regexp.MustCompile(`^/repos/([^/]+/[^/]+)/issues/([0-9]+)$`), (*Server).editIssue},
	{"GET", regexp.MustCompile(`^/repos/([^/]+/[^/]+)/issues/([0-9]+)$`), (*Server).getIssue},
	{"GET", regexp.MustCompile(`^/repos/([^/]+/[^/]+)/pulls/([0-9]+)$`), (*Server).getPR},
	{"POST", regexp.MustCompile(`^/repos/([^/]+/[^/]+)/pulls$`), (*Server).createPR},
	{"POST", regexp.MustCompile(`^/repos/([^/]+/[^/]+)/pulls/([0-9]+)/reviews$`), (*Server).createReview},
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	call := Call{Method: r.Method, Path: r.URL.Path, Authorized: s.authorized(r)}
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil && len(raw) > 0 {
		err = json.Unmarshal(raw, &call.Body)
	}
	s.mu.Lock()
	s.calls = append(s.calls, call)
	fault, hasFault := s.takeFault(call)
	s.mu.Unlock()
	if err != nil {
		answer(w, http.StatusBadRequest, message("Problems parsing JSON"))
		return
	}
	if hasFault && fault.Kind == Refuse {
		answerRaw(w, fault.Status, fault.Body)
		return
	}
	if !call.Authorized {
		answer(w, http.StatusUnauthorized, message("Bad credentials"))
		return
	}
	code, out := s.apply(call)
	if !hasFault {
		answer(w, code, out)
		return
	}
	switch fault.Kind {
	case ApplyThenStatus:
		answerRaw(w, fault.Status, fault.Body)
	case ApplyThenDrop:
		drop(w)
	case ApplyThenHang:
		select {
		case <-r.Context().Done():
		case <-s.done:
		}
	}
}

// apply runs the call against the state and returns the answer.
func (s *Server) apply(c Call) (int, any) {
	for _, rt := range routes {
		m := rt.path.FindStringSubmatch(c.Path)
		if m == nil {
			continue
		}
		if rt.method != c.Method {
			continue
		}
		num := 0
		if len(m) > 2 {
			num, _ = strconv.Atoi(m[2])
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return rt.handle(s, s.repo(m[1]), m[1], num, c.Body)
	}
	return http.StatusNotFound, message("Not Found")
}

// takeFault removes and returns the first fault matching c. s.mu is held.
func (s *Server) takeFault(c Call) (Fault, bool) {
	for i, f := range s.faults {
		if (f.Method == "" || f.Method == c.Method) && (f.Path == "" || f.Path == c.Path) {
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
			return f, true
		}
	}
	return Fault{}, false
}

func (s *Server) authorized(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	return s.token != "" && (h == "Bearer "+s.token || h == "token "+s.token)
}

func message(m string) map[string]any { return map[string]any{"message": m} }

func answer(w http.ResponseWriter, code int, v any) {
	data, _ := json.Marshal(v)
	answerRaw(w, code, string(data))
}

func answerRaw(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	io.WriteString(w, body)
}

// drop closes the connection with no answer.
func drop(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("githubtest: cannot hijack the connection")
	}
	conn, _, err := hj.Hijack()
	if err == nil {
		conn.Close()
	}
}

func (s *Server) htmlURL(repo, kind string, n int) string {
	return fmt.Sprintf("%s%s/%s/%d", s.URL, repo, kind, n)
}

func itoa(n int) string { return strconv.Itoa(n) }
