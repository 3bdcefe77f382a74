package githubtest

import (
	"encoding/base64"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os/exec"
	"sync"
	"testing"
)

// GitServer serves the bare repositories under a directory over git's
// smart HTTP protocol (git http-backend), fetch and push, to clients that
// authenticate as the host does (basic auth, user x-access-token, the
// token as password): OWNER/NAME.git is Root/OWNER/NAME.git. A request
// without credentials is answered 401, one with wrong credentials 403
// with a text that quotes them.
type GitServer struct {
	// URL is the server's base URL, without a trailing "/".
	URL string
	// Root holds the repositories.
	Root string

	token string
	mu    sync.Mutex
	calls []GitCall
}

// GitCall is one request the git server received.
type GitCall struct {
	Method     string
	Path       string
	Authorized bool
}

// StartGit starts a git server on a loopback TCP port for the bare
// repositories under root, accepting token, and stops it when the test
// ends.
func StartGit(t testing.TB, token, root string) *GitServer {
	t.Helper()
	gitPath, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	g := &GitServer{Root: root, token: token}
	backend := &cgi.Handler{
		Path: gitPath,
		Args: []string{"http-backend"},
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=x-access-token"},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ok := g.authorized(r)
		g.mu.Lock()
		g.calls = append(g.calls, GitCall{Method: r.Method, Path: r.URL.Path, Authorized: ok})
		g.mu.Unlock()
		if got := r.Header.Get("Authorization"); !ok && got != "" {
			// Like GitHub, a 403 whose text git shows; unlike it, the
			// text quotes the credentials, for tests to check they
			// travel no further.
			http.Error(w, "Permission denied to "+got, http.StatusForbidden)
			return
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="githubtest"`)
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	g.URL = srv.URL
	return g
}

// Calls returns every request received so far, in order.
func (g *GitServer) Calls() []GitCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]GitCall(nil), g.calls...)
}

func (g *GitServer) authorized(r *http.Request) bool {
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+g.token))
	return g.token != "" && r.Header.Get("Authorization") == want
}
