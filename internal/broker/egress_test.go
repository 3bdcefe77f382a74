package broker_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// egressGrant is the default grant that may grant egress to 127.0.0.1.
const egressGrant = `{"version":1,"max_running_children":4,"operations":["destroy","import","message","restart","rights","spawn","stop"],"grantable":{"mounts":[],"loose":false,"egress":["127.0.0.1"]},"default_runner":null,"default_runner_source":null}`

// fetch gets url in sandbox name through the proxy its variables name
// (curl; on Incus, whose image has no curl, a request written by bash to
// 127.0.0.1:3128) and returns the answer's status code and body.
func fetch(e *testEnv, name, url string) (code, body string) {
	e.t.Helper()
	argv := []string{"curl", "-sS", "--max-time", "20", "--noproxy", "", "-w", "\n%{http_code}", url}
	if onIncus() {
		script := `exec 3<>/dev/tcp/127.0.0.1/${HTTP_PROXY##*:} && printf 'GET %s HTTP/1.1\r\nHost: x\r\n\r\n' "$1" >&3 && cat <&3`
		argv = []string{"bash", "-c", script, "fetch", url}
	}
	res, err := e.execIn(name, "", argv...)
	if err != nil {
		e.t.Fatalf("fetch in %s: %v", name, err)
	}
	out := res.stdout + res.stderr
	if onIncus() {
		head, body, _ := strings.Cut(out, "\r\n\r\n")
		if f := strings.Fields(head); len(f) > 1 {
			code = f[1]
		}
		return code, strings.TrimSpace(body)
	}
	i := strings.LastIndex(out, "\n")
	return out[i+1:], strings.TrimSpace(out[:max(i, 0)])
}

// connects reports whether a TCP connection from sandbox name to
// host:port, without the proxy, is made.
func connects(e *testEnv, name, host, port string) bool {
	e.t.Helper()
	res, err := e.execIn(name, "", "bash", "-c", "exec 3<>/dev/tcp/$1/$2", "connect", host, port)
	if err != nil {
		e.t.Fatalf("connect in %s: %v", name, err)
	}
	return res.exit == 0
}

// helloServer is a server on the host's loopback that answers "hello
// from the host", until the test ends.
func helloServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello from the host")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestEgressThroughTheBroker: a sandbox's only way out is its broker's
// egress proxy, reached through the proxy variables every command gets. A
// child spawned with egress to the host's 127.0.0.1 (an address literal
// granted as such) reaches a server there; its orchestrator, without that
// right, is answered 403 with the reason, as for any host not granted; a
// connection that skips the proxy has no route; the broker logs each
// connection.
func TestEgressThroughTheBroker(t *testing.T) {
	srv := helloServer(t)
	url := srv.URL + "/"

	e := newTestEnv(t)
	e.withAgent()
	if err := e.admin("new", wire.NewArgs{Name: "lead", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(egressGrant)}, nil); err != nil {
		t.Fatal(err)
	}
	if env := e.mustExec("lead", "sh", "-c", "echo $HTTPS_PROXY $http_proxy $NO_PROXY"); env != "http://127.0.0.1:3128 http://127.0.0.1:3128 localhost,127.0.0.1,::1" {
		t.Fatalf("proxy environment: %q", env)
	}

	// The orchestrator holds no egress right. (The proxy is asked, not
	// NO_PROXY's direct 127.0.0.1: that would be the sandbox's own.)
	if code, body := fetch(e, "lead", url); code != "403" || body != "egress to 127.0.0.1 is not granted to this sandbox" {
		t.Fatalf("ungranted address through the proxy: %s %q", code, body)
	}
	if code, body := fetch(e, "lead", "http://example.com/"); code != "403" || body != "egress to example.com is not granted to this sandbox" {
		t.Fatalf("ungranted name through the proxy: %s %q", code, body)
	}
	// Without the proxy: the sandbox's loopback is its own, and there is
	// no route to the host's addresses.
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	if connects(e, "lead", "127.0.0.1", port) {
		t.Fatal("a direct connection to the server's port on loopback was made")
	}
	if ip := hostAddr(t); ip != "" && connects(e, "lead", ip, port) {
		t.Fatalf("a direct connection to the host's %s was made", ip)
	}

	// A restarted broker serves the running sandbox's proxy again; the
	// relay needs nothing.
	e.restart()
	if code, body := fetch(e, "lead", url); code != "403" || body != "egress to 127.0.0.1 is not granted to this sandbox" {
		t.Fatalf("after a broker restart: %s %q", code, body)
	}

	lead := e.client("lead")
	wantStatus(t, spawn(t, lead, "spawn-e", map[string]any{"branch": "net/e", "prompt": "p", "on_done": "keep",
		"rights": map[string]any{"mounts": []string{}, "loose": false, "egress": []string{"127.0.0.1"}}}),
		"started", "creation of child `net-e` started")
	messageFrom(t, lead, "net-e", "done")
	if code, body := fetch(e, "net-e", url); code != "200" || body != "hello from the host" {
		t.Fatalf("the granted child through the proxy: %s %q", code, body)
	}
	wait.For(t, "the broker's egress records", func() bool {
		logs := e.logs.String()
		return strings.Contains(logs, "msg=egress sandbox=net-e host=127.0.0.1 port="+port+" right=127.0.0.1") &&
			strings.Contains(logs, "verdict=allowed") &&
			strings.Contains(logs, "msg=egress sandbox=lead host=127.0.0.1") && strings.Contains(logs, "verdict=refused")
	})
	// Rights changed at run time decide the next connection: the host
	// adds the orchestrator's egress by hand, then takes it away.
	var res wire.RightsResult
	if err := e.admin("rights", wire.RightsArgs{Name: "lead", Add: wire.RightsItems{Egress: []string{"127.0.0.1"}}}, &res); err != nil {
		t.Fatal(err)
	}
	if code, body := fetch(e, "lead", url); code != "200" || body != "hello from the host" {
		t.Fatalf("after the host added the right: %s %q", code, body)
	}
	if err := e.admin("rights", wire.RightsArgs{Name: "lead", Remove: wire.RightsItems{Egress: []string{"127.0.0.1"}}}, &res); err != nil {
		t.Fatal(err)
	}
	if code, body := fetch(e, "lead", url); code != "403" || body != "egress to 127.0.0.1 is not granted to this sandbox" {
		t.Fatalf("after the host removed the right: %s %q", code, body)
	}
	for _, name := range []string{"net-e", "lead"} {
		if err := e.admin("destroy", wire.DestroyArgs{Name: name, Force: true}, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// hostAddr is one of the host's own non-loopback IPv4 addresses, or "".
func hostAddr(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	return ""
}

// TestEgressRevokeWhileServed: a broker that starts serves each running
// sandbox in turn, the orchestrator before its child here. The
// orchestrator revokes the child's egress while the child's proxy is
// being made (after it read the rights, before the broker lists it as
// served, so the revoke's refresh does not find it). The proxy must still
// refuse the revoked host once the child is served.
func TestEgressRevokeWhileServed(t *testing.T) {
	srv := helloServer(t)
	url := srv.URL + "/"
	e := newTestEnv(t)
	if err := e.admin("new", wire.NewArgs{Name: "a-lead", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(egressGrant)}, nil); err != nil {
		t.Fatal(err)
	}
	e.child("z-kid", "a-lead")
	st := sendRights(t, e.client("a-lead"), map[string]any{"id": "r1", "child": "z-kid", "grant": map[string]any{"egress": []string{"127.0.0.1"}, "for": "1h"}})
	wantRights(t, st, wire.StateDone, "granted egress 127.0.0.1 for 1h")
	if code, body := fetch(e, "z-kid", url); code != "200" || body != "hello from the host" {
		t.Fatalf("the granted child through the proxy: %s %q", code, body)
	}
	var once sync.Once
	e.onAttach = func(name string, socket backend.SocketKind) {
		if name != "z-kid" || socket != backend.ModelSocket {
			return
		}
		once.Do(func() {
			st := sendRights(t, e.client("a-lead"), map[string]any{"id": "r2", "child": "z-kid", "revoke": map[string]any{"egress": []string{"127.0.0.1"}}})
			wantRights(t, st, wire.StateDone, "revoked egress 127.0.0.1")
		})
	}
	e.restart()
	e.onAttach = nil
	if code, body := fetch(e, "z-kid", url); code != "403" || body != "egress to 127.0.0.1 is not granted to this sandbox" {
		t.Fatalf("after the revoke while the child was served: %s %q", code, body)
	}
}
