package dispatch_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/dispatch"
)

// fullFS mounts a small tmpfs at dir and fills it; the returned function
// frees the space again.
func fullFS(t *testing.T, dir string) (free func()) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	return func() {
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDispatchLedgerDiskFull: the consumer can fill the disk the
// runtime's ledger is on (the spool volume is on the host). A claim that
// cannot be appended is a terminal failure that contacts nobody and
// names no host path; once there is room again the request is dispatched,
// once.
func TestDispatchLedgerDiskFull(t *testing.T) {
	w := newWorld(t, false)
	w.serve()
	base := filepath.Dir(filepath.Dir(w.s.Ledger))
	free := fullFS(t, filepath.Dir(w.s.Ledger))
	w.put("f.json", envelope("f", `{}`))
	_, err := w.dispatch("f", 0)
	terminal(t, err)
	if strings.Contains(err.Error(), base) {
		t.Errorf("the error names a host path: %v", err)
	}
	if w.count("f") != 0 {
		t.Fatal("the endpoint was contacted without a durable claim")
	}
	free()
	if out, err := w.dispatch("f", 0); err != nil || out.Cached || w.count("f") != 1 {
		t.Fatalf("with room again: %+v %v, endpoint saw %d", out, err, w.count("f"))
	}
}

// TestDispatchSpoolFullAtTheAnswer: the consumer fills its spool volume
// while the endpoint handles its request (it sees the file leave
// requests/), so the consumer's response file cannot be written. The
// endpoint has acted: its answer must still be recorded, so that once
// there is room the next dispatch writes the consumer's file from the
// ledger, without the endpoint, rather than the request being blocked for
// good (or, under the replay policy, relayed again).
func TestDispatchSpoolFullAtTheAnswer(t *testing.T) {
	for _, replay := range []bool{false, true} {
		t.Run(map[bool]string{false: "unsigned", true: "signed"}[replay], func(t *testing.T) {
			w := newWorld(t, replay)
			dir := filepath.Join(filepath.Dir(w.s.Dir), "small")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m,mode=0755"); err != nil {
				t.Skipf("cannot mount a tmpfs: %v", err)
			}
			t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
			if err := dispatch.Init(dir, w.s.Layout); err != nil {
				t.Fatal(err)
			}
			w.s.Dir = dir
			filler := filepath.Join(dir, dispatch.RequestsDir, ".fill")
			w.reply = func(string) string {
				// The consumer's move: fill the volume now.
				f, err := os.Create(filler)
				if err != nil {
					t.Error(err)
					return `{}`
				}
				defer f.Close()
				for {
					if _, err := f.Write(make([]byte, 4096)); err != nil {
						break
					}
				}
				return `{"acted":true}`
			}
			w.serve()
			w.put("a.json", envelope("a", `{}`))
			_, err := w.dispatch("a", 0)
			terminal(t, err)
			if w.count("a") != 1 {
				t.Fatalf("the endpoint saw the request %d times", w.count("a"))
			}
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			out, err := w.dispatch("a", 0)
			if err != nil || !out.Cached || !strings.Contains(string(out.Response.Payload), "acted") {
				t.Fatalf("with room again: %+v %v", out, err)
			}
			if w.count("a") != 1 {
				t.Fatalf("the endpoint saw the request %d times", w.count("a"))
			}
			if data, err := os.ReadFile(filepath.Join(dir, dispatch.ResponsesDir, "a.json")); err != nil || !strings.Contains(string(data), "acted") {
				t.Fatalf("the consumer's file: %q %v", data, err)
			}
		})
	}
}
