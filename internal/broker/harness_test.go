package broker_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/local"
	"agentbox/internal/broker"
	"agentbox/internal/inbox"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// testEnv is a real broker on a temp state dir with the real local
// (bubblewrap) backend and a real git repository.
type testEnv struct {
	t     testing.TB
	state string
	repo  string
	quota store.Quota // broker.Config.InboxQuota, kept across restarts
	b     *broker.Broker
}

func newTestEnv(t testing.TB) *testEnv {
	t.Helper()
	return newTestEnvQuota(t, store.Quota{})
}

// newTestEnvQuota is newTestEnv with an inbox quota (zero bounds: the
// broker's defaults).
func newTestEnvQuota(t testing.TB, q store.Quota) *testEnv {
	t.Helper()
	e := &testEnv{t: t, state: shortTempDir(t), repo: makeRepo(t), quota: q}
	e.start()
	return e
}

// shortTempDir is a temp dir with a short path: socket paths under it must
// fit a Unix socket address (107 bytes), which t.TempDir's long names
// would not.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "jb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "state")
}

// makeRepo creates a git repository with one commit on main.
func makeRepo(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "repo")
	for _, args := range [][]string{
		{"init", "-q", "-b", "main", dir},
		{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "init"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	return dir
}

func (e *testEnv) start() {
	e.t.Helper()
	be, err := local.New(local.Options{Root: filepath.Join(e.state, "sandboxes")})
	if err != nil {
		e.t.Fatalf("local backend (is bubblewrap installed? scripts/install-deps.sh): %v", err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	b, err := broker.Open(broker.Config{StateDir: e.state, Backend: be, Logger: log, InboxQuota: e.quota})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := b.Serve(); err != nil {
		b.Close()
		e.t.Fatal(err)
	}
	e.b = b
	e.t.Cleanup(func() {
		if e.b != nil {
			e.b.Close()
		}
	})
}

// restart closes the broker and opens a new one on the same state dir.
func (e *testEnv) restart() {
	e.t.Helper()
	e.b.Close()
	e.b = nil
	e.start()
}

// admin runs one admin op and decodes its result.
func (e *testEnv) admin(op string, args, result any) error {
	e.t.Helper()
	c, err := inbox.Dial(context.Background(), filepath.Join(e.state, broker.AdminSock))
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	return c.Call(context.Background(), op, args, result)
}

// orchestrator creates an orchestrator sandbox.
func (e *testEnv) orchestrator(name string) {
	e.t.Helper()
	if err := e.admin("new", broker.NewArgs{Name: name, Repo: e.repo, Role: "orchestrator"}, nil); err != nil {
		e.t.Fatalf("new orchestrator %s: %v", name, err)
	}
}

// child creates a child of parent on branch "work/<name>".
func (e *testEnv) child(name, parent string) {
	e.t.Helper()
	if err := e.admin("new", broker.NewArgs{Name: name, Repo: e.repo, Branch: "work/" + name, Role: "child", Parent: parent}, nil); err != nil {
		e.t.Fatalf("new child %s: %v", name, err)
	}
}

// sock returns the host path of a sandbox's broker socket.
func (e *testEnv) sock(name string) string {
	e.t.Helper()
	p := e.b.SocketPath(name)
	if p == "" {
		e.t.Fatalf("sandbox %s has no socket", name)
	}
	return p
}

// client dials a sandbox's socket: the connection speaks as that sandbox.
func (e *testEnv) client(name string) *inbox.Client {
	e.t.Helper()
	c, err := inbox.Dial(context.Background(), e.sock(name))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// rawConn is a plain socket connection for framing tests.
type rawConn struct {
	net.Conn
	r *bufio.Reader
}

func (e *testEnv) raw(name string) *rawConn {
	e.t.Helper()
	conn, err := net.Dial("unix", e.sock(name))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return &rawConn{Conn: conn, r: bufio.NewReader(conn)}
}

// reply reads one reply line (failing the test after 10 s).
func (c *rawConn) reply(t testing.TB) wire.Response {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	line, err := wire.ReadLine(c.r, wire.MaxLineBytes)
	if err != nil {
		t.Fatalf("read reply: %v", err)
	}
	var resp wire.Response
	if err := json.Unmarshal(line, &resp); err != nil {
		t.Fatalf("reply %q: %v", line, err)
	}
	return resp
}

// closed reports whether the broker closed the connection (EOF within 5 s).
func (c *rawConn) closed() bool {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.r.ReadByte()
	return err == io.EOF
}

// sendMessage sends a message manifest and returns the first status.
func sendMessage(t testing.TB, c *inbox.Client, m map[string]any) wire.StatusItem {
	t.Helper()
	m["version"], m["type"] = 1, "message"
	var st wire.StatusItem
	if err := c.Call(context.Background(), "send", map[string]any{"manifest": m}, &st); err != nil {
		t.Fatalf("send %v: %v", m["id"], err)
	}
	return st
}

// unread lists a sandbox's unread items.
func unread(t testing.TB, c *inbox.Client) []wire.MessageItem {
	t.Helper()
	var res struct {
		Items []wire.MessageItem `json:"items"`
	}
	if err := c.Call(context.Background(), "list", nil, &res); err != nil {
		t.Fatal(err)
	}
	return res.Items
}

func backendOf(t testing.TB, e *testEnv) backend.Backend { return e.b.BackendForRestart() }

// setSocketDirForTest rewrites a sandbox's recorded socket dir while the
// broker is stopped.
func setSocketDirForTest(t testing.TB, e *testEnv, name, dir string) {
	t.Helper()
	s, err := store.Open(filepath.Join(e.state, broker.DBFile))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetSocketDirForTest(context.Background(), name, dir); err != nil {
		t.Fatal(err)
	}
}
