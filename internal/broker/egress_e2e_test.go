package broker_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/testutil/serve"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// testCA makes a CA and a server certificate for IP 127.0.0.1 signed by
// it; it returns the CA's PEM and the server's certificate.
func testCA(t *testing.T) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "jailbee test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err = x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
}

// dumbRepo is a bare repository with one commit, ready to be served over
// dumb HTTP; it returns the directory that holds repo.git.
func dumbRepo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	src, bare := filepath.Join(root, "src"), filepath.Join(root, "www", "repo.git")
	for _, argv := range [][]string{
		{"git", "init", "-q", "-b", "main", src},
		{"git", "-C", src, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "served over https"},
		{"git", "clone", "-q", "--bare", src, bare},
		{"git", "-C", bare, "update-server-info"},
	} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", argv, err, out)
		}
	}
	return filepath.Join(root, "www")
}

// TestEgressHTTPSAndGitClone: HTTPS and git clone go through the proxy as
// a CONNECT tunnel, TLS end to end with a CA the sandbox was given; both
// are refused with the proxy's 403 while the sandbox holds no right to the
// address, and work once the host adds it. (Incus's image has git but no
// curl: there only git is asked.)
func TestEgressHTTPSAndGitClone(t *testing.T) {
	caPEM, cert := testCA(t)
	srv := httptest.NewUnstartedServer(http.FileServer(http.Dir(dumbRepo(t))))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()

	e := newTestEnv(t)
	if err := e.admin("new", wire.NewArgs{Name: "lead", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(egressGrant)}, nil); err != nil {
		t.Fatal(err)
	}
	if res, err := e.execIn("lead", string(caPEM), "sh", "-c", `cat >"$HOME/ca.pem"`); err != nil || res.exit != 0 {
		t.Fatalf("giving the sandbox the CA: %v %q", err, res.stderr)
	}
	// NO_PROXY names 127.0.0.1 (the sandbox's own): the proxy is asked.
	curl := func() execResult {
		res, err := e.execIn("lead", "", "bash", "-c", `curl -sSv --max-time 20 --noproxy '' --cacert "$HOME/ca.pem" "$1"`, "curl", srv.URL+"/repo.git/HEAD")
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	clone := func() execResult {
		res, err := e.execIn("lead", "", "bash", "-c", `d=$(mktemp -d) && env -u NO_PROXY -u no_proxy GIT_SSL_CAINFO="$HOME/ca.pem" git clone -q "$1" "$d/r" && git -C "$d/r" log --format=%s`, "clone", srv.URL+"/repo.git")
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	if res := curl(); !onIncus() && (res.exit == 0 || !strings.Contains(res.stderr, "< HTTP/1.1 403")) {
		t.Fatalf("ungranted curl: exit %d\n%s", res.exit, res.stderr)
	}
	if res := clone(); res.exit == 0 || !strings.Contains(res.stderr, "CONNECT tunnel failed, response 403") {
		t.Fatalf("ungranted clone: exit %d\n%s", res.exit, res.stderr)
	}

	var rights wire.RightsResult
	if err := e.admin("rights", wire.RightsArgs{Name: "lead", Add: wire.RightsItems{Egress: []string{"127.0.0.1"}}}, &rights); err != nil {
		t.Fatal(err)
	}
	if res := curl(); !onIncus() && (res.exit != 0 || strings.TrimSpace(res.stdout) != "ref: refs/heads/main") {
		t.Fatalf("granted curl: exit %d %q\n%s", res.exit, res.stdout, res.stderr)
	}
	if res := clone(); res.exit != 0 || strings.TrimSpace(res.stdout) != "served over https" {
		t.Fatalf("granted clone: exit %d %q\n%s", res.exit, res.stdout, res.stderr)
	}
	if err := e.admin("destroy", wire.DestroyArgs{Name: "lead", Force: true}, nil); err != nil {
		t.Fatal(err)
	}
}

// tunnelServer accepts TCP connections on the host's 127.0.0.1, greets
// each and holds it open; ended gets a value when a connection ends.
func tunnelServer(t *testing.T) (port string, accepted, ended chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted, ended = make(chan struct{}, 8), make(chan struct{}, 8)
	serve.Serve(t, l, func(c net.Conn) {
		accepted <- struct{}{}
		c.Write([]byte("held open\n"))
		io.Copy(io.Discard, c)
		ended <- struct{}{}
	})
	_, port, _ = net.SplitHostPort(l.Addr().String())
	return port, accepted, ended
}

// receive waits for a value on ch, failing t (naming what) after the
// hang guard.
func receive(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wait.Guard):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// connectScript asks the sandbox's proxy (bash alone: Incus's image has
// no curl) for a tunnel to the host's 127.0.0.1 port $1 and prints all it
// gets until the tunnel ends.
const connectScript = `exec 3<>/dev/tcp/127.0.0.1/${HTTP_PROXY##*:} &&
printf 'CONNECT 127.0.0.1:%s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n\r\n' "$1" "$1" >&3 && cat <&3`

// TestEgressExpiryCutsALiveTunnel: a CONNECT tunnel opened under a timed
// egress right is cut when the right expires (the host's server sees the
// connection end, the client in the sandbox sees its end), and the next
// connection is refused with 403, with no round run meanwhile.
func TestEgressExpiryCutsALiveTunnel(t *testing.T) {
	port, accepted, ended := tunnelServer(t)
	e := newTestEnv(t)
	if err := e.admin("new", wire.NewArgs{Name: "orch", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(egressGrant)}, nil); err != nil {
		t.Fatal(err)
	}
	e.child("kid", "orch")
	// The right lives long enough for the tunnel to open through a slow
	// exec on a loaded machine.
	st := sendRights(t, e.client("orch"), map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"egress": []string{"127.0.0.1"}, "for": "15s"}})
	wantRights(t, st, wire.StateDone, "granted egress 127.0.0.1 for 15s")
	// No round removes the expired right: the proxy ends it by itself, at
	// its expiry (a round may come 30 s late, or wait on other work).
	e.b.HoldRoundsForTest(true)

	// The client opens the tunnel and reads until it ends.
	script := connectScript + "; echo tunnel ended"
	type result struct {
		res execResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := adminExec(t, e.adminPath(), "kid", "", "bash", "-c", script, "tunnel", port)
		done <- result{res, err}
	}()
	receive(t, "the tunnel to reach the host's server", accepted)
	receive(t, "the host's server to see the tunnel cut at expiry", ended)
	select {
	case r := <-done:
		if r.err != nil || !strings.Contains(r.res.stdout, "200") || !strings.Contains(r.res.stdout, "held open\ntunnel ended") {
			t.Fatalf("the client in the sandbox: %v %q %q", r.err, r.res.stdout, r.res.stderr)
		}
	case <-time.After(wait.Guard):
		t.Fatal("timed out waiting for the client in the sandbox to see the tunnel end")
	}

	res, err := e.execIn("kid", "", "bash", "-c", connectScript, "tunnel", port)
	if err != nil || !strings.Contains(res.stdout, " 403 ") || !strings.Contains(res.stdout, "egress to 127.0.0.1 is not granted to this sandbox") {
		t.Fatalf("a new tunnel after expiry: %v %q %q", err, res.stdout, res.stderr)
	}
	for _, name := range []string{"kid", "orch"} {
		if err := e.admin("destroy", wire.DestroyArgs{Name: name, Force: true}, nil); err != nil {
			t.Fatal(err)
		}
	}
}
