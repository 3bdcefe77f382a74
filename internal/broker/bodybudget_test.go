package broker_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/modelproxy"
	"agentbox/internal/modelproxy/modeltest"
	"agentbox/internal/testutil/wait"
)

// bodyHead is the head of a Messages request declaring a body of the
// largest size, which the test then never sends.
var bodyHead = fmt.Sprintf("POST /v1/messages HTTP/1.1\r\nHost: model\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", modelproxy.MaxRequestBytes)

// TestModelBodyFlood: a child that declares bodies of the largest size on
// its model socket and sends only their first byte (what a sandbox would
// do to hold the broker's memory) is admitted up to its share,
// SandboxMaxModelBodyBytes; its next request is answered 503 naming the
// share before its body is read, while its orchestrator's model socket
// answers as before; a request that ends gives its bytes back. Without
// the budget, each of 64 children could hold 8 bodies of 32 MiB.
func TestModelBodyFlood(t *testing.T) {
	localOnly(t, "dials the sandboxes' sockets from the host")
	e := newModelEnv(t, modeltest.Start(t), 0)
	e.orchestrator("lead")
	e.child("kid", "lead")
	kidSock := socketOf(e, "kid", broker.ModelSocketName)
	held := holdConns(t, kidSock, int(broker.SandboxMaxModelBodyBytes/modelproxy.MaxRequestBytes))
	for _, c := range held {
		if _, err := c.Write([]byte(bodyHead)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(wait.Guard)
	for e.b.TreeModelBodiesForTest("lead") != broker.SandboxMaxModelBodyBytes {
		if time.Now().After(deadline) {
			t.Fatalf("lead's tree holds %d bytes of bodies, want %d", e.b.TreeModelBodiesForTest("lead"), broker.SandboxMaxModelBodyBytes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	code, body := modelHead(t, kidSock)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"type":"overloaded_error"`) || !strings.Contains(body, "sandbox kid holds 128.0 MiB of model request bodies") {
		t.Fatalf("one body past the share: %d %s", code, body)
	}
	resp, err := modelClient(socketOf(e, "lead", broker.ModelSocketName)).Post("http://model/v1/messages", "application/json", strings.NewReader(modeltest.RequestBody("hi", false)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the orchestrator's model socket beside the child's flood: %d", resp.StatusCode)
	}
	// A held request that ends gives its bytes back.
	held[0].Close()
	for code, body = modelHead(t, kidSock); code == http.StatusServiceUnavailable; code, body = modelHead(t, kidSock) {
		if time.Now().After(deadline) {
			t.Fatalf("after a held request ended: %d %s", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// modelHead sends bodyHead on a new connection to sock and half-closes
// it, so an admitted request ends at once for want of its body; it
// returns the status and body of the answer.
func modelHead(t *testing.T, sock string) (int, string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait.Guard))
	if _, err := c.Write([]byte(bodyHead)); err != nil {
		t.Fatal(err)
	}
	c.(*net.UnixConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&b)
	return resp.StatusCode, b.String()
}
