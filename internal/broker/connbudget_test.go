package broker_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/broker"
	"agentbox/internal/egress"
	"agentbox/internal/inbox"
	"agentbox/internal/modelproxy/modeltest"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// socketOf is the host path of one of sandbox name's model-directory
// sockets (the egress proxy's, a model socket).
func socketOf(e *testEnv, name, file string) string {
	e.t.Helper()
	return besideSocket(e.state, e.b.SocketPath(name), file)
}

// besideSocket is the host path of file in the model directory that goes
// with the orchestration socket sock of a broker of state.
func besideSocket(state, sock, file string) string {
	_, random, _ := strings.Cut(filepath.Base(filepath.Dir(sock)), ".")
	return filepath.Join(state, broker.ModelDir, random, file)
}

// holdConns opens n connections to sock that send nothing, closed when
// the test ends.
func holdConns(t *testing.T, sock string, n int) []net.Conn {
	t.Helper()
	var cs []net.Conn
	for range n {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

// egressAnswer sends one proxied GET for a host no sandbox is granted
// on a new connection to sock and returns the status and body.
func egressAnswer(t *testing.T, sock string) (int, string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait.Guard))
	// A refusal is written and the connection closed without reading the
	// request: the write may fail, the answer is still there to read.
	c.Write([]byte("GET http://not-granted.example/ HTTP/1.1\r\nHost: not-granted.example\r\n\r\n"))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var body strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&body)
	return resp.StatusCode, body.String()
}

// awaitTreeConns waits until n connections of tree are admitted (the
// broker accepts those held in their own time).
func awaitTreeConns(t *testing.T, e *testEnv, tree string, n int) {
	t.Helper()
	deadline := time.Now().Add(wait.Guard)
	for e.b.TreeConnsForTest(tree) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d connections, want %d", tree, e.b.TreeConnsForTest(tree), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTreeConnectionFlood: two children that open silent connections on
// their model and egress sockets (each within its own socket's bound and
// its quarter share) fill what their tree's budget leaves to its children,
// half of tree.max_connections, and no more: a third child's connection
// is refused naming that, while their orchestrator, which keeps the other
// half (it decides, through its model, to destroy them), and another
// orchestrator's tree are served as before; a connection closed frees its
// place. Without the tree bound, 64 children could each hold 64 + 256
// connections, two descriptors apiece, more than the broker may open;
// without the orchestrator's half, the two children filled the tree.
func TestTreeConnectionFlood(t *testing.T) {
	localOnly(t, "dials the sandboxes' sockets from the host")
	e := newModelEnvStopped(t, modeltest.Start(t), 0)
	const treeMax = 16
	e.treeMaxConns = treeMax
	// The silent connections are held for the whole test, which may take
	// longer than the egress head bound (30 s) or the model socket's read
	// bound (60 s) on a loaded machine: past them a connection is closed
	// and its place freed, and the counts below would drift.
	e.egressHeadTimeout = 10 * time.Minute
	e.model.ReadTimeout = 10 * time.Minute
	e.start()
	e.orchestrator("lead")
	e.child("kid", "lead")
	e.child("kid2", "lead")
	e.child("kid3", "lead")
	e.orchestrator("other")
	kid2Egress := socketOf(e, "kid2", backend.EgressSocketName)

	// Both socket kinds count: an eighth on each child's model socket, an
	// eighth on each one's egress proxy; the children hold half at first,
	// then try for the whole tree.
	for _, kid := range []string{"kid", "kid2"} {
		holdConns(t, socketOf(e, kid, broker.ModelSocketName), treeMax/8)
	}
	holdConns(t, socketOf(e, "kid", backend.EgressSocketName), treeMax/8)
	held := holdConns(t, kid2Egress, treeMax/8)
	awaitTreeConns(t, e, "lead", treeMax/2)
	holdConns(t, socketOf(e, "kid", backend.EgressSocketName), treeMax/4)
	holdConns(t, kid2Egress, treeMax/4)
	code, body := egressAnswer(t, socketOf(e, "kid3", backend.EgressSocketName))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "the children of orchestrator lead hold 8 model and egress connections") || !strings.Contains(body, "tree.max_connections") {
		t.Fatalf("a third child past the children's half: %d %q", code, body)
	}
	for _, name := range []string{"lead", "other"} {
		if code, body := egressAnswer(t, socketOf(e, name, backend.EgressSocketName)); code != http.StatusForbidden {
			t.Fatalf("%s's proxy beside the children's flood answered %d %q, want its own 403", name, code, body)
		}
	}
	// The answers' connections are counted until the broker's side has
	// closed them, which may come after their answer was read: wait, or
	// the orchestrator's half below could be one short.
	awaitTreeConns(t, e, "lead", treeMax/2)
	// The orchestrator may hold its whole half.
	holdConns(t, socketOf(e, "lead", broker.ModelSocketName), treeMax/2)
	awaitTreeConns(t, e, "lead", treeMax)

	// The model socket refuses in the API's format, before reading.
	c, err := net.Dial("unix", socketOf(e, "kid", broker.ModelSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("model socket past the bound: %v", err)
	}
	var mb strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&mb)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(mb.String(), `"type":"overloaded_error"`) || !strings.Contains(mb.String(), "tree.max_connections") {
		t.Fatalf("model socket past the bound: %d %s", resp.StatusCode, mb.String())
	}

	// One connection closed: the child is served again.
	held[0].Close()
	awaitTreeConns(t, e, "lead", treeMax-1)
	if code, body := egressAnswer(t, kid2Egress); code != http.StatusForbidden {
		t.Fatalf("after a connection closed: %d %q", code, body)
	}
}

// TestDescriptorFlood: sandboxes that hold as many egress connections as
// each may (256) would, together, take every descriptor a broker process
// may open (here a broker run with RLIMIT_NOFILE 1200): then no host
// command could reach it and no sandbox could send. The broker admits
// only what its limit leaves once it keeps its own reserve: the rest are
// refused naming the limit, and a host command and a send between
// sandboxes go on while the connections are held (within 25 s: each
// silent connection would be closed after 30 s, freeing the descriptors
// anyway).
func TestDescriptorFlood(t *testing.T) {
	localOnly(t, "a process broker of the local backend")
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Fatalf("prlimit (util-linux) runs the broker with a low open-file limit: %v", err)
	}
	bin, state, repo := jailbeeBin(t), shortTempDir(t), makeRepo(t)
	p := startProcBrokerVia(t, bin, state, []string{"prlimit", "--nofile=1200:1200", "--"})
	names := []string{"orch", "kid-1", "kid-2", "kid-3", "kid-4"}
	p.newSandbox(wire.NewArgs{Name: "orch", Repo: repo, Role: "orchestrator"})
	for _, kid := range names[1:] {
		p.newSandbox(wire.NewArgs{Name: kid, Repo: repo, Branch: "work/" + kid, Role: "child", Parent: "orch"})
	}
	var conns []net.Conn
	for _, name := range names {
		conns = append(conns, holdConns(t, besideSocket(state, p.socket(name), backend.EgressSocketName), egress.MaxConns)...)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	admin, err := inbox.Dial(ctx, p.adminPath())
	if err != nil {
		t.Fatalf("admin socket while the connections are held: %v", err)
	}
	defer admin.Close()
	if err := admin.Call(ctx, "new", wire.NewArgs{Name: "other", Repo: repo, Role: "orchestrator"}, nil); err != nil {
		t.Fatalf("jb new while the connections are held: %v\n%s", err, p.stderr)
	}
	orch, err := inbox.Dial(ctx, p.socket("orch"))
	if err != nil {
		t.Fatal(err)
	}
	defer orch.Close()
	var st wire.StatusItem
	err = orch.Call(ctx, "send", map[string]any{"manifest": map[string]any{
		"version": 1, "type": "message", "id": "m-1", "to": "kid-1", "body": "still here"}}, &st)
	if err != nil || st.State != wire.StateDone {
		t.Fatalf("a send while the connections are held: %+v %v", st, err)
	}

	refused := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		answer, _ := io.ReadAll(c)
		if strings.Contains(string(answer), "as many model and egress connections as its open-file limit allows") {
			refused++
		}
	}
	if refused == 0 || refused == len(conns) {
		t.Fatalf("%d of %d connections refused for the open-file limit", refused, len(conns))
	}
	t.Logf("%d of %d connections refused for the open-file limit", refused, len(conns))
	if !strings.Contains(p.stderr.String(), "the open-file limit leaves room for few model and egress connections") {
		t.Fatalf("the broker did not warn of its low open-file limit:\n%s", p.stderr)
	}
}

// TestChildConnectionShare: a child that opens as many silent
// connections as its own sockets take (64 + 256, more than a small
// tree.max_connections) holds no more than a quarter of its tree's budget.
// Without that share, one hostile child filled the whole tree: its
// orchestrator could no longer reach its own model socket (so could not
// even think of destroying the child) nor egress, and its siblings were
// refused. The child's connection past its share is refused naming the
// bound; the orchestrator and a sibling are still served.
func TestChildConnectionShare(t *testing.T) {
	localOnly(t, "dials the sandboxes' sockets from the host")
	e := newModelEnvStopped(t, modeltest.Start(t), 0)
	const treeMax = 16
	e.treeMaxConns = treeMax
	e.egressHeadTimeout = 10 * time.Minute // held silent: see TestTreeConnectionFlood
	e.start()
	e.orchestrator("lead")
	e.child("kid", "lead")
	e.child("sib", "lead")

	holdConns(t, socketOf(e, "kid", backend.EgressSocketName), treeMax)
	// The connections past the share are refused: only the share stays.
	awaitTreeConns(t, e, "lead", treeMax/4)
	code, body := egressAnswer(t, socketOf(e, "kid", backend.EgressSocketName))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "a child, a quarter of tree.max_connections") {
		t.Fatalf("the child past its share: %d %q", code, body)
	}
	for _, name := range []string{"lead", "sib"} {
		if code, body := egressAnswer(t, socketOf(e, name, backend.EgressSocketName)); code != http.StatusForbidden {
			t.Fatalf("%s's egress beside the child's flood: %d %q, want its own 403", name, code, body)
		}
	}
	// The orchestrator's model socket answers it.
	resp, err := modelClient(socketOf(e, "lead", broker.ModelSocketName)).Get("http://model/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the orchestrator's model socket beside the child's flood: %d", resp.StatusCode)
	}
}

// modelClient sends HTTP on the model socket at sock, from the host.
func modelClient(sock string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
}
