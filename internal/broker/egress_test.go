package broker_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// egressGrant is the default grant that may grant egress to 127.0.0.1.
const egressGrant = `{"version":1,"max_running_children":4,"operations":["destroy","import","message","restart","rights","spawn","stop"],"grantable":{"mounts":[],"loose":false,"egress":["127.0.0.1"]},"default_runner":null,"default_runner_source":null}`

// curlOut runs curl in sandbox name and returns its output and exit.
func curlOut(e *testEnv, name string, args ...string) (string, int) {
	e.t.Helper()
	res, err := e.execIn(name, "", append([]string{"curl", "-sS", "--max-time", "20", "-w", "\n%{http_code}"}, args...)...)
	if err != nil {
		e.t.Fatalf("exec curl in %s: %v", name, err)
	}
	return strings.TrimSpace(res.stdout + res.stderr), res.exit
}

// TestEgressThroughTheBroker: a sandbox's only way out is its broker's
// egress proxy, reached through the proxy variables every command gets. A
// child spawned with egress to the host's 127.0.0.1 (an address literal
// granted as such) reaches a server there; its orchestrator, without that
// right, is answered 403 with the reason, as for any host not granted; a
// connection that skips the proxy has no route; the broker logs each
// connection.
func TestEgressThroughTheBroker(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello from the host")
	}))
	defer srv.Close()
	url := srv.URL + "/"

	e := newTestEnv(t)
	e.withAgent()
	if err := e.admin("new", wire.NewArgs{Name: "lead", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(egressGrant)}, nil); err != nil {
		t.Fatal(err)
	}
	if env := e.mustExec("lead", "sh", "-c", "echo $HTTPS_PROXY $http_proxy $NO_PROXY"); env != "http://127.0.0.1:3128 http://127.0.0.1:3128 localhost,127.0.0.1,::1" {
		t.Fatalf("proxy environment: %q", env)
	}

	// The orchestrator holds no egress right. (--noproxy "": the variables
	// keep 127.0.0.1 direct, meaning the sandbox's own loopback.)
	out, _ := curlOut(e, "lead", "--noproxy", "", url)
	if !strings.HasSuffix(out, "\n403") || !strings.Contains(out, "egress to 127.0.0.1 is not granted to this sandbox") {
		t.Fatalf("ungranted address through the proxy:\n%s", out)
	}
	out, _ = curlOut(e, "lead", "https://example.com/")
	if !strings.Contains(out, "403") {
		t.Fatalf("ungranted name through the proxy:\n%s", out)
	}
	// Without the proxy: the sandbox's loopback is its own, and there is
	// no route to the host's addresses.
	if out, code := curlOut(e, "lead", "--noproxy", "*", url); code == 0 {
		t.Fatalf("a direct connection to the host's loopback port reached it:\n%s", out)
	}
	if ip := hostAddr(t); ip != "" {
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		if out, code := curlOut(e, "lead", "--noproxy", "*", "http://"+net.JoinHostPort(ip, port)+"/"); code == 0 {
			t.Fatalf("a direct connection to the host's %s reached it:\n%s", ip, out)
		}
	}

	lead := e.client("lead")
	wantStatus(t, spawn(t, lead, "spawn-e", map[string]any{"branch": "net/e", "prompt": "p", "on_done": "keep",
		"rights": map[string]any{"mounts": []string{}, "loose": false, "egress": []string{"127.0.0.1"}}}),
		"started", "creation of child `net-e` started")
	messageFrom(t, lead, "net-e", "done")
	out, code := curlOut(e, "net-e", "--noproxy", "", url)
	if code != 0 || out != "hello from the host\n200" {
		t.Fatalf("the granted child through the proxy (exit %d):\n%s", code, out)
	}
	wait.For(t, "the broker's egress records", func() bool {
		logs := e.logs.String()
		return strings.Contains(logs, "msg=egress sandbox=net-e host=127.0.0.1 port="+portOf(srv)+" right=127.0.0.1") &&
			strings.Contains(logs, "verdict=allowed") &&
			strings.Contains(logs, "msg=egress sandbox=lead host=127.0.0.1") && strings.Contains(logs, "verdict=refused")
	})
	for _, name := range []string{"net-e", "lead"} {
		if err := e.admin("destroy", wire.DestroyArgs{Name: name, Force: true}, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func portOf(srv *httptest.Server) string {
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	return port
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
