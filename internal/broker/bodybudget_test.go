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

// TestModelBodyFlood: children that declare bodies of the largest size
// on their model sockets and send only their first byte (what a sandbox
// would do to hold the broker's memory) are admitted each up to its share,
// ChildMaxModelBodyBytes, and together up to half of their tree's bytes:
// a child's request past its share is answered 503 naming it, before its
// body is read, and a third child's past the children's half naming that,
// while their orchestrator's model socket answers as before; a request
// that ends gives its bytes back. Without the budget, each of 64 children
// could hold 8 bodies of 32 MiB; with only a share per sandbox, two
// children held the whole tree's and their orchestrator was refused.
func TestModelBodyFlood(t *testing.T) {
	localOnly(t, "dials the sandboxes' sockets from the host")
	e := newModelEnvStopped(t, modeltest.Start(t), 0)
	// The held bodies stay held past the model socket's read bound (60 s)
	// on a loaded machine: past it their bytes would be given back.
	e.model.ReadTimeout = 10 * time.Minute
	e.start()
	e.orchestrator("lead")
	kids := []string{"kid", "sib", "third"}
	for _, kid := range kids {
		e.child(kid, "lead")
	}
	kidSock := socketOf(e, "kid", broker.ModelSocketName)
	perChild := int(broker.ChildMaxModelBodyBytes / modelproxy.MaxRequestBytes)
	var held []net.Conn
	for i, kid := range kids[:2] {
		conns := holdConns(t, socketOf(e, kid, broker.ModelSocketName), perChild)
		for _, c := range conns {
			if _, err := c.Write([]byte(bodyHead)); err != nil {
				t.Fatal(err)
			}
		}
		held = append(held, conns...)
		awaitTreeBodies(t, e, "lead", int64(i+1)*broker.ChildMaxModelBodyBytes)
	}
	code, body := modelHead(t, kidSock)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"type":"overloaded_error"`) || !strings.Contains(body, "sandbox kid holds 64.0 MiB of model request bodies") {
		t.Fatalf("one body past the child's share: %d %s", code, body)
	}
	code, body = modelHead(t, socketOf(e, "third", broker.ModelSocketName))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "the children of orchestrator lead hold 128.0 MiB of model request bodies") {
		t.Fatalf("a third child's body past the children's half: %d %s", code, body)
	}
	resp, err := modelClient(socketOf(e, "lead", broker.ModelSocketName)).Post("http://model/v1/messages", "application/json", strings.NewReader(modeltest.RequestBody("hi", false)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the orchestrator's model socket beside its children's flood: %d", resp.StatusCode)
	}
	// A held request that ends gives its bytes back.
	held[0].Close()
	deadline := time.Now().Add(wait.Guard)
	for code, body = modelHead(t, kidSock); code == http.StatusServiceUnavailable; code, body = modelHead(t, kidSock) {
		if time.Now().After(deadline) {
			t.Fatalf("after a held request ended: %d %s", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitTreeBodies waits until tree holds n bytes of model request bodies.
func awaitTreeBodies(t *testing.T, e *testEnv, tree string, n int64) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%s's tree to hold %d bytes of bodies", tree, n), func() bool { return e.b.TreeModelBodiesForTest(tree) == n })
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
