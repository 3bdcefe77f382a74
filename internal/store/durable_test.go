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

// waitSharing blocks until n writers wait in the open shared transaction,
// or gives up after a while (the caller's checks then fail).
func waitSharing(s *Store, n int) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		s.wmu.Lock()
		in := 0
		if s.open != nil {
			in = s.open.writers
		}
		s.wmu.Unlock()
		if in >= n {
			return
		}
	}
}

// holdFirstSync makes a first delivery whose sync is held: once it
// returns, a sync runs until release is called, so the deliveries that
// come meanwhile share the open transaction. first gives the first
// delivery's outcome.
func holdFirstSync(t *testing.T, s *Store) (release func(), first <-chan error) {
	t.Helper()
	entered, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hookSync(t, func(f *os.File) error {
		once.Do(func() {
			close(entered)
			<-held
		})
		return f.Sync()
	})
	out := make(chan error, 1)
	go func() {
		_, err := s.DeliverMessage(context.Background(), Delivery{From: "o", To: "c", ManifestID: "first", Kind: "note", Body: "b"})
		out <- err
	}()
	<-entered
	var rel sync.Once
	release = func() { rel.Do(func() { close(held) }) }
	t.Cleanup(release)
	return release, out
}

// TestConcurrentCommitsShareOneSync: deliveries that come while a sync
// runs share one COMMIT and one sync, and each returns only after it.
func TestConcurrentCommitsShareOneSync(t *testing.T) {
	s, _ := openTestStore(t)
	const senders = 8
	s.dur.mu.Lock()
	base, syncs := s.dur.done, s.dur.syncs
	s.dur.mu.Unlock()
	release, first := holdFirstSync(t, s)
	go func() {
		waitSharing(s, senders-1)
		release()
	}()
	for i, err := range sendAll(s, senders-1) {
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if err := <-first; err != nil {
		t.Fatalf("first send: %v", err)
	}
	s.dur.mu.Lock()
	used, commits := s.dur.syncs-syncs, s.dur.done-base
	s.dur.mu.Unlock()
	if used != 2 || commits != 2 {
		t.Fatalf("%d concurrent sends used %d syncs and %d commits, want 2 each (one for the first and one for the rest)", senders, used, commits)
	}
	items, err := s.ListItems(context.Background(), "c", false)
	if err != nil || len(items) != senders {
		t.Fatalf("c's inbox: %d items, %v; want %d", len(items), err, senders)
	}
}

// TestSharedCommitQuotaCountsEveryWriter: the quota check of a delivery
// in the shared transaction counts the deliveries before it there, not
// yet committed; one refused does not undo the others.
func TestSharedCommitQuotaCountsEveryWriter(t *testing.T) {
	s, _ := openTestStore(t)
	const max = 4
	s.SetQuota(Quota{MaxUnreadItems: max, MaxUnreadBytes: 1 << 30, TreeMaxUnreadItems: 1 << 20, TreeMaxUnreadBytes: 1 << 30})
	release, first := holdFirstSync(t, s)
	done := make(chan []error)
	go func() { done <- sendAll(s, 6) }()
	// All six are in, as writers that succeeded or were refused.
	waitSharing(s, 6)
	release()
	accepted, refused := 0, 0
	for i, err := range <-done {
		switch {
		case err == nil:
			accepted++
		case errors.As(err, new(*InboxFullError)):
			refused++
		default:
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if err := <-first; err != nil {
		t.Fatalf("first send: %v", err)
	}
	if accepted != max-1 || refused != 3 {
		t.Fatalf("with %d unread allowed and 1 held: %d accepted, %d refused; want %d and 3", max, accepted, refused, max-1)
	}
	items, err := s.ListItems(context.Background(), "c", false)
	if err != nil || len(items) != max {
		t.Fatalf("c's inbox: %d items, %v; want %d", len(items), err, max)
	}
}

// TestCloseCommitsTheSharedTransaction: writers waiting in the shared
// transaction when the store closes are committed and made durable, not
// left waiting.
func TestCloseCommitsTheSharedTransaction(t *testing.T) {
	s, path := openTestStore(t)
	release, first := holdFirstSync(t, s)
	done := make(chan []error)
	go func() { done <- sendAll(s, 3) }()
	waitSharing(s, 3)
	closed := make(chan error)
	go func() { closed <- s.Close() }()
	release()
	for i, err := range <-done {
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if err := <-first; err != nil {
		t.Fatalf("first send: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	s2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if items, err := s2.ListItems(context.Background(), "c", false); err != nil || len(items) != 4 {
		t.Fatalf("after reopening: c has %d items, %v; want 4", len(items), err)
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
