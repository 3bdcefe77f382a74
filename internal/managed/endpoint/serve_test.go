package endpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentbox/internal/managed/spool"
)

// waitSocket waits until a socket other than before (nil: any) exists at
// path.
func waitSocket(t *testing.T, path string, before os.FileInfo) {
	t.Helper()
	for range 1000 {
		if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket && (before == nil || !os.SameFile(fi, before)) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no socket at %s", path)
}

// logBuf is a logf that keeps the lines.
type logBuf struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuf) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// startServe runs Serve at a fresh path; stop cancels it and returns its
// error.
func startServe(t *testing.T, path string, h Handler) (log *logBuf, stop func() error) {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "ep.sock")
	}
	before, _ := os.Lstat(path)
	log = &logBuf{}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, path, h, log.logf) }()
	var once sync.Once
	var serveErr error
	stop = func() error {
		once.Do(func() { cancel(); serveErr = <-errc })
		return serveErr
	}
	t.Cleanup(func() { stop() })
	waitSocket(t, path, before)
	return log, stop
}

func frameFor(id string) string {
	return `{"version":"1","run_id":"run-1","lease_id":"lease-1","consumer":"agent","request_id":"` + id + `","payload":{"q":[1,2]}}`
}

func TestServeRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ep.sock")
	var got []byte
	log, stop := startServe(t, path, func(ctx context.Context, frame []byte) ([]byte, error) {
		got = append([]byte(nil), frame...)
		return []byte("{ \"answer\" : [ 42, \"<&>\" ] }\n"), nil
	})
	resp, err := Relay(context.Background(), path, []byte(frameFor("req-7")))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":"1","run_id":"run-1","lease_id":"lease-1","consumer":"agent","request_id":"req-7","payload":{"answer":[42,"<&>"]}}` + "\n"
	if string(resp) != want {
		t.Fatalf("response %q\nwant     %q", resp, want)
	}
	if string(got) != frameFor("req-7") {
		t.Fatalf("the handler got %q", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if l := log.String(); !strings.Contains(l, `request "req-7": answered`) || strings.Contains(l, "answer\"") || strings.Contains(l, "[1,2]") {
		t.Fatalf("log %q", l)
	}
}

func TestServeMalformedFrames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ep.sock")
	var calls atomic.Int32
	log, _ := startServe(t, path, func(ctx context.Context, frame []byte) ([]byte, error) {
		calls.Add(1)
		return []byte("true"), nil
	})
	const ids = `"run_id":"r","lease_id":"l","consumer":"c","request_id":"q"`
	for _, frame := range []string{
		`{"version":"1",` + ids + `,"payload":1,"extra":"secret-field-value"}`,
		`{"version":"1","run_id":"r","lease_id":"l","consumer":"c","payload":1}`,
		`{"version":"1",` + ids + `}`,
		`{"version":"1",` + ids + `,"payload":1,"payload":2}`,
		`{"version":"1",` + ids + `,"request_id":"q","payload":1}`,
		`{"version":"2",` + ids + `,"payload":1}`,
		`{"version":1,` + ids + `,"payload":1}`,
		`{"version":"1","run_id":"","lease_id":"l","consumer":"c","request_id":"q","payload":1}`,
		`{"version":"1","run_id":null,"lease_id":"l","consumer":"c","request_id":"q","payload":1}`,
		`{"version":"1",` + ids + `,"payload":1}x`,
		`{"version":"1",` + ids + `,"payload":1}{}`,
		`{"version":"1",` + ids + `,"payload":}`,
		`{"version":"1",` + ids + `,"payload":1,}`,
		"{\"version\":\"1\"," + ids + ",\"payload\":\"\xff\"}",
		`[1,2]`,
		`not json`,
		`{}`,
	} {
		if _, err := Relay(context.Background(), path, []byte(frame)); err == nil {
			t.Errorf("%s: answered", frame)
		} else {
			var te *TransportError
			if !errors.As(err, &te) {
				t.Errorf("%s: err %v", frame, err)
			}
		}
	}
	// An oversized frame, written raw (Relay refuses to send it).
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		conn.Write([]byte(strings.Repeat("x", spool.MaxRequestBytes+10)))
		conn.(*net.UnixConn).CloseWrite()
	}()
	if b, _ := io.ReadAll(conn); len(b) != 0 {
		t.Errorf("oversized frame answered: %q", b)
	}
	conn.Close()
	if n := calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
	if l := log.String(); strings.Contains(l, "secret-field-value") || !strings.Contains(l, "refused a connection") {
		t.Fatalf("log %q", l)
	}
	// The frame exactly at the limit is read (and answered).
	pad := spool.MaxRequestBytes - len(`{"version":"1",`+ids+`,"payload":""}`)
	frame := `{"version":"1",` + ids + `,"payload":"` + strings.Repeat("x", pad) + `"}`
	if len(frame) != spool.MaxRequestBytes {
		t.Fatal(len(frame))
	}
	if _, err := Relay(context.Background(), path, []byte(frame)); err != nil {
		t.Fatal(err)
	}
}

func TestServeHandlerErrorNoResponse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ep.sock")
	log, _ := startServe(t, path, func(ctx context.Context, frame []byte) ([]byte, error) {
		id, _ := FrameIDs(frame)
		switch id.RequestID {
		case "fail":
			return nil, errors.New("handler failed")
		case "invalid":
			return []byte(`{"a":`), nil
		case "empty":
			return nil, nil
		}
		return []byte(`"` + strings.Repeat("x", spool.MaxResponseBytes) + `"`), nil
	})
	for _, id := range []string{"fail", "invalid", "empty", "oversized"} {
		_, err := Relay(context.Background(), path, []byte(frameFor(id)))
		if te := transport(t, err, "read"); te.Err != errNoResponse {
			t.Fatalf("%s: %v", id, err)
		}
	}
	l := log.String()
	for _, want := range []string{`"fail": no response: handler failed`, `"invalid": no response`, `"empty": no response`, `"oversized": no response: the response is over the limit`} {
		if !strings.Contains(l, want) {
			t.Fatalf("log %q lacks %q", l, want)
		}
	}
}

func TestServeKeepsRegularFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ep.sock")
	if err := os.WriteFile(path, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := Serve(context.Background(), path, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("err %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "keep me" {
		t.Fatalf("the file changed: %q %v", b, err)
	}
	// A directory, a symlink to a socket: kept too.
	dir := filepath.Join(t.TempDir(), "d")
	os.Mkdir(dir, 0o700)
	if err := Serve(context.Background(), dir, nil, nil); err == nil {
		t.Fatal("served over a directory")
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		t.Fatal("the directory is gone")
	}
	stale := staleSocket(t, filepath.Join(t.TempDir(), "stale.sock"))
	link := filepath.Join(t.TempDir(), "link.sock")
	os.Symlink(stale, link)
	if err := Serve(context.Background(), link, nil, nil); err == nil {
		t.Fatal("served over a symlink")
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode().Type() != fs.ModeSymlink {
		t.Fatal("the symlink is gone")
	}
}

func TestServeReplacesStaleSocket(t *testing.T) {
	path := staleSocket(t, filepath.Join(t.TempDir(), "ep.sock"))
	startServe(t, path, func(ctx context.Context, frame []byte) ([]byte, error) { return []byte("1"), nil })
	if _, err := Relay(context.Background(), path, []byte(frameFor("q"))); err != nil {
		t.Fatal(err)
	}
}

func TestServeRefusesLiveSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ep.sock")
	startServe(t, path, func(ctx context.Context, frame []byte) ([]byte, error) { return []byte("1"), nil })
	err := Serve(context.Background(), path, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "already listens") {
		t.Fatalf("err %v", err)
	}
	if _, err := Relay(context.Background(), path, []byte(frameFor("q"))); err != nil {
		t.Fatalf("the first endpoint lost its socket: %v", err)
	}
}

func TestServeSocketMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ep.sock")
	startServe(t, path, nil)
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", fi.Mode(), err)
	}
	// The temporary directory the socket was bound in goes right after
	// the link: the socket can show at path a moment before.
	var entries []os.DirEntry
	for i := 0; i < 500; i++ {
		if entries, _ = os.ReadDir(dir); len(entries) == 1 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("directory holds %v", entries)
}

func TestServeConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ep.sock")
	var inflight, most atomic.Int32
	gate := make(chan struct{})
	var once sync.Once
	startServe(t, path, func(ctx context.Context, frame []byte) ([]byte, error) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n >= MaxConcurrent {
			once.Do(func() { close(gate) })
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		ids, _ := FrameIDs(frame)
		return json.Marshal(map[string]string{"echo": ids.RequestID})
	})
	const n = 20
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("req-%d", i)
			resp, err := Relay(context.Background(), path, []byte(frameFor(id)))
			if err == nil && !strings.Contains(string(resp), `"request_id":"`+id+`","payload":{"echo":"`+id+`"}}`) {
				err = fmt.Errorf("response %q", resp)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if m := most.Load(); m != MaxConcurrent {
		t.Fatalf("%d handlers ran at once, want %d", m, MaxConcurrent)
	}
}

func TestServeCancelRemovesSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ep.sock")
	_, stop := startServe(t, path, nil)
	// A connection that never sends its frame does not hold the stop.
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the socket remains: %v", err)
	}
	// A socket another server linked at path since is not removed.
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, path, nil, nil) }()
	waitSocket(t, path, nil)
	os.Remove(path)
	other, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("another server's socket was removed: %v", err)
	}
}

func TestEndpointFrameIDs(t *testing.T) {
	ids, err := FrameIDs([]byte(` { "payload" : null , "request_id":"q\u0031","consumer":"c","lease_id":"l","run_id":"r","version":"1"} `))
	if err != nil || ids != (IDs{RunID: "r", LeaseID: "l", Consumer: "c", RequestID: "q1"}) {
		t.Fatalf("%+v %v", ids, err)
	}
	_, err = FrameIDs([]byte(`{"version":"1","run_id":"r","lease_id":"l","consumer":"c","request_id":"q","payload":1,"leak-me":1}`))
	if err == nil || strings.Contains(err.Error(), "leak-me") {
		t.Fatalf("err %v", err)
	}
}

// A response the caller is no longer there to take is logged as not
// delivered, not as answered.
func TestServeLogsUndeliveredResponse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ep.sock")
	gone := make(chan struct{})
	log, _ := startServe(t, path, func(ctx context.Context, frame []byte) ([]byte, error) {
		<-gone
		return []byte(`{"late":true}`), nil
	})
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(frameFor("req-gone") + "\n")); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	close(gone)
	for range 500 {
		if strings.Contains(log.String(), `request "req-gone": `+"the response was not delivered") {
			if l := log.String(); strings.Contains(l, `"req-gone": answered`) {
				t.Fatalf("log %q", l)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("log %q: no undelivered response", log.String())
}
