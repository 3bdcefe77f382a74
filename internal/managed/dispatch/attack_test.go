package dispatch_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/dispatch"
	"agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/spool"
)

// TestAttackStagedSwaps: the consumer can replace requests/R.json between
// the dispatcher's check of requests/ and its move into .processing/, so
// the move may stage anything the consumer can make there. Each such
// entry, placed in .processing/ as that race leaves it, is refused on the
// open handle: nothing is followed, nothing blocks, the endpoint sees
// nothing, and a file outside the spool is untouched.
func TestAttackStagedSwaps(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(outside, []byte(envelope("s", `{"host":"secret"}`)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(outside, consumer, consumer); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		make func(p string) error
	}{
		{"symlink", func(p string) error { return os.Symlink(outside, p) }},
		{"fifo", func(p string) error {
			if err := unix.Mkfifo(p, 0o600); err != nil {
				return err
			}
			return os.Chown(p, consumer, consumer)
		}},
		{"directory", func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return os.Chown(p, consumer, consumer)
		}},
		{"hard link", func(p string) error {
			// A second name for a request file, in the same volume.
			other := filepath.Join(filepath.Dir(filepath.Dir(p)), dispatch.RequestsDir, ".keep")
			if err := os.WriteFile(other, []byte(envelope("s", `{}`)), 0o600); err != nil {
				return err
			}
			if err := os.Chown(other, consumer, consumer); err != nil {
				return err
			}
			return os.Link(other, p)
		}},
		{"another uid's file", func(p string) error {
			return os.WriteFile(p, []byte(envelope("s", `{}`)), 0o600)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, true)
			w.serve()
			if err := tc.make(filepath.Join(w.s.Dir, dispatch.ProcessingDir, "s.json")); err != nil {
				t.Fatal(err)
			}
			_, err := w.dispatch("s", 0)
			terminal(t, err)
			if w.count("s") != 0 {
				t.Fatal("the endpoint saw the request")
			}
			if data, err := os.ReadFile(outside); err != nil || !bytes.Contains(data, []byte(`"host":"secret"`)) {
				t.Fatalf("the file outside changed: %v", err)
			}
			if _, err := os.Stat(filepath.Join(w.s.Dir, dispatch.ResponsesDir, "s.json")); !os.IsNotExist(err) {
				t.Fatal("a response was written")
			}
		})
	}
}

// TestAttackRewriteThroughHeldDescriptor: the consumer keeps a writable
// descriptor on its request file and rewrites it after the dispatcher
// moved it into .processing/ (here: while the endpoint handles it). The
// endpoint gets, and the ledger records, exactly the bytes read before the
// claim; the same id spooled again with the rewritten bytes is refused.
func TestAttackRewriteThroughHeldDescriptor(t *testing.T) {
	w := newWorld(t, false)
	w.put("h.json", envelope("h", `{"n":1}`))
	held, err := os.OpenFile(filepath.Join(w.s.Dir, dispatch.RequestsDir, "h.json"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	changed := envelope("h", `{"n":2}`)
	var seen []byte
	managedtest.ServeEndpoint(t, w.s.Endpoint, func(_ context.Context, frame []byte) ([]byte, error) {
		seen = append([]byte(nil), frame...)
		if _, err := held.WriteAt([]byte(changed), 0); err != nil {
			return nil, err
		}
		return []byte(`{"ok":true}`), nil
	})
	if _, err := w.dispatch("h", 0); err != nil {
		t.Fatal(err)
	}
	first, err := spool.DecodeEnvelope([]byte(envelope("h", `{"n":1}`)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(seen, first.Frame()) {
		t.Fatalf("the endpoint got %q", seen)
	}
	if l := w.ledger("h"); l.Done == nil || !bytes.Equal(l.Done.Request, first.Frame()) {
		t.Fatalf("the ledger holds %+v", l)
	}
	if _, err := os.Lstat(filepath.Join(w.s.Dir, dispatch.ProcessingDir, "h.json")); !os.IsNotExist(err) {
		t.Fatal("the staged copy remains")
	}
	w.put("h.json", changed)
	_, err = w.dispatch("h", 0)
	terminal(t, err)
}
