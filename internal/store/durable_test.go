package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hookSync replaces syncFile for the test.
func hookSync(t *testing.T, fn func(*os.File) error) {
	t.Helper()
	syncFile = fn
	t.Cleanup(func() { syncFile = fdatasync })
}

// sendAll sends n messages o -> c concurrently and returns their errors.
func sendAll(s *Store, n int) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = s.DeliverMessage(context.Background(), Delivery{From: "o", To: "c",
				ManifestID: "m-" + strconv.Itoa(i), Kind: "note", Body: "b"})
		})
	}
	wg.Wait()
	return errs
}

// waitCommits blocks until the store has returned from n COMMITs.
func waitCommits(s *Store, n uint64) {
	for {
		s.dur.mu.Lock()
		done := s.dur.done
		s.dur.mu.Unlock()
		if done >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func TestConcurrentCommitsShareOneSync(t *testing.T) {
	s, _ := openTestStore(t)
	const senders = 8
	s.dur.mu.Lock()
	base, syncs := s.dur.done, s.dur.syncs
	s.dur.mu.Unlock()
	// Hold the first sync until every sender has committed: the seven that
	// commit while it runs must then share the next one.
	release := make(chan struct{})
	var once sync.Once
	hookSync(t, func(f *os.File) error {
		once.Do(func() { <-release })
		return f.Sync()
	})
	go func() {
		waitCommits(s, base+senders)
		close(release)
	}()
	for i, err := range sendAll(s, senders) {
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	s.dur.mu.Lock()
	used := s.dur.syncs - syncs
	s.dur.mu.Unlock()
	if used != 2 {
		t.Fatalf("%d concurrent sends used %d syncs, want 2 (one each for the first and the rest)", senders, used)
	}
	items, err := s.ListItems(context.Background(), "c", false)
	if err != nil || len(items) != senders {
		t.Fatalf("c's inbox: %d items, %v; want %d", len(items), err, senders)
	}
}

func TestFailedSyncFailsWriters(t *testing.T) {
	s, path := openTestStore(t)
	hookSync(t, func(*os.File) error {
		return &os.PathError{Op: "sync", Path: path + "-wal", Err: syscall.EIO}
	})
	for i, err := range sendAll(s, 4) {
		if !errors.Is(err, ErrNotDurable) {
			t.Fatalf("send %d: %v, want %v", i, err, ErrNotDurable)
		}
		if strings.Contains(err.Error(), filepath.Dir(path)) {
			t.Fatalf("send %d: error %q shows a host path", i, err)
		}
	}
	// The failure sticks: the page cache may have dropped what the sync
	// lost, so no later write or read may claim it.
	hookSync(t, fdatasync)
	if err := s.SetState(context.Background(), "c", "stopped"); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("write after a failed sync: %v, want %v", err, ErrNotDurable)
	}
	if _, err := s.ListItems(context.Background(), "c", true); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("read after a failed sync: %v, want %v", err, ErrNotDurable)
	}
}

func TestReadWaitsForWhatItSaw(t *testing.T) {
	s, _ := openTestStore(t)
	// A sync that fails after c's message committed: a read that saw the
	// message must not return it as if it were on disk.
	fail := make(chan struct{})
	hookSync(t, func(f *os.File) error {
		<-fail
		return syscall.EIO
	})
	base := s.dur.seen()
	sent := make(chan error)
	go func() {
		_, err := s.DeliverMessage(context.Background(), Delivery{From: "o", To: "c", ManifestID: "m", Kind: "note", Body: "b"})
		sent <- err
	}()
	waitCommits(s, base+1)
	read := make(chan error)
	go func() {
		_, err := s.ListItems(context.Background(), "c", false)
		read <- err
	}()
	close(fail)
	if err := <-sent; !errors.Is(err, ErrNotDurable) {
		t.Fatalf("send: %v", err)
	}
	if err := <-read; !errors.Is(err, ErrNotDurable) {
		t.Fatalf("read of a message whose sync failed: %v, want %v", err, ErrNotDurable)
	}
}

// TestSyncFollowsTheWALFile: a new or recreated WAL file has its
// directory synced too; with none, the database file and directory are.
func TestSyncFollowsTheWALFile(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "broker.db")
	var synced []string
	hookSync(t, func(f *os.File) error {
		synced = append(synced, filepath.Base(f.Name()))
		return f.Sync()
	})
	d := newDurability(db)
	defer d.close()
	for _, p := range []string{db, db + "-wal"} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	step := func(want string) {
		t.Helper()
		synced = nil
		d.commitStarted()
		d.commitDone()
		if err := d.wait(d.seen()); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(synced, " "); got != want {
			t.Fatalf("synced %q, want %q", got, want)
		}
	}
	dirName := filepath.Base(dir)
	step("broker.db-wal " + dirName) // new
	step("broker.db-wal")            // same file
	os.Remove(db + "-wal")
	step("broker.db " + dirName) // gone
	if err := os.WriteFile(db+"-wal", []byte("y"), 0o600); err != nil {
		t.Fatal(err)
	}
	step("broker.db-wal " + dirName) // recreated
}

func TestClosedStoreRefusesWaits(t *testing.T) {
	s, _ := openTestStore(t)
	if _, err := s.DeliverMessage(context.Background(), Delivery{From: "o", To: "c", ManifestID: "m", Kind: "note", Body: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	s.dur.commitStarted()
	s.dur.commitDone()
	if err := s.dur.wait(s.dur.seen()); !errors.Is(err, errStoreClosed) {
		t.Fatalf("wait after close: %v, want %v", err, errStoreClosed)
	}
}
