package egress_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"agentbox/internal/egress"
)

// TestCurl drives the proxy with a real client, as a sandbox's tools will
// (over the loopback listener that stands for the in-sandbox one): https
// through CONNECT, plain http forwarded, and a refusal curl reports.
func TestCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed")
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hi "+r.URL.Path) })
	tlsSrv := httptest.NewTLSServer(handler)
	defer tlsSrv.Close()
	plainSrv := httptest.NewServer(handler)
	defer plainSrv.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := serveOn(t, ln, egress.Config{Policy: rights("127.0.0.1")}, ln.Addr().String())
	run := func(args ...string) (string, error) {
		cmd := exec.Command(curl, append([]string{"-sS", "--max-time", "20", "-x", "http://" + ln.Addr().String()}, args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()} // no proxy settings of the host
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	if out, err := run("-k", tlsSrv.URL+"/tls"); err != nil || out != "hi /tls" {
		t.Fatalf("https through CONNECT: %q, %v", out, err)
	}
	if r := tp.record(t); r.Verdict != egress.Allowed || r.Down == 0 {
		t.Fatalf("record %+v", r)
	}
	if out, err := run(plainSrv.URL + "/plain"); err != nil || out != "hi /plain" {
		t.Fatalf("plain http: %q, %v", out, err)
	}
	if r := tp.record(t); r.Verdict != egress.Allowed {
		t.Fatalf("record %+v", r)
	}
	out, err := run("-k", "https://pypi.org/")
	if err == nil || !strings.Contains(out, "403") {
		t.Fatalf("an ungranted host through curl: %q, %v", out, err)
	}
}
