package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"agentbox/internal/secfs"
)

// Group commit. broker.db runs at synchronous=NORMAL: in WAL mode a COMMIT
// then writes its frames to the -wal file without fsyncing it (checkpoints
// still sync the WAL before and the database file after). Durability comes
// from here instead: after its COMMIT returns, a writer waits for an fsync
// of the -wal file that started after that COMMIT returned. Concurrent
// writers share one fsync: the first waiter syncs for everyone committed so
// far, and later ones wait for it or lead the next. A failed fsync fails
// every waiter it covered and every one after it (the page cache may have
// dropped the data): the store must be reopened.

// ErrNotDurable: a commit could not be made durable; nothing written since
// the last successful sync may be relied on.
var ErrNotDurable = errors.New("broker.db: write not durable")

var errStoreClosed = errors.New("broker.db is closed")

// syncFile is fdatasync(2): it flushes a file's data and the metadata
// needed to read it back (its size) but not its times, as SQLite does.
// Tests replace it to count or fail syncs.
var syncFile = fdatasync

func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for serr = syscall.Fdatasync(int(fd)); serr == syscall.EINTR; serr = syscall.Fdatasync(int(fd)) {
		}
	}); err != nil {
		return err
	}
	return serr
}

// durability counts commits and the syncs that made them durable. Commit
// indexes are handed out under the store's write lock, so they are in
// commit order.
type durability struct {
	walPath, dbPath string

	mu   sync.Mutex
	cond sync.Cond
	// begun counts the COMMITs started, done those returned; durable is the
	// highest index known to be on disk.
	begun, done, durable uint64
	syncing              bool
	closed               bool
	err                  error // sticky: the first failed sync
	syncs                uint64

	// Owned by the goroutine leading a sync.
	wal   *os.File
	walFI os.FileInfo
}

func newDurability(dbPath string) *durability {
	d := &durability{walPath: dbPath + "-wal", dbPath: dbPath}
	d.cond.L = &d.mu
	return d
}

// commitStarted returns the index of the COMMIT about to run. Called with
// the store's write lock held, before COMMIT, so a reader that sees the
// commit's data also sees its index (see seen).
func (d *durability) commitStarted() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.begun++
	return d.begun
}

// commitDone records that the last started COMMIT returned (or failed:
// syncing it anyway is harmless).
func (d *durability) commitDone() {
	d.mu.Lock()
	d.done = d.begun
	d.mu.Unlock()
	d.cond.Broadcast()
}

// seen is the index a reader must wait for: every commit whose data it can
// have read. Call it after the read.
func (d *durability) seen() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.begun
}

// durableAt reports whether commit index is on disk already.
func (d *durability) durableAt(index uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.durable >= index
}

// Counts are how many COMMITs have returned and syncs have run since the
// store opened: what a benchmark divides by its writes.
func (s *Store) Counts() (commits, syncs uint64) {
	s.dur.mu.Lock()
	defer s.dur.mu.Unlock()
	return s.dur.done, s.dur.syncs
}

// busy reports whether a sync is running.
func (d *durability) busy() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.syncing
}

// waitIdle returns once no sync runs or done is closed (nil), or with
// the sticky failure, or when closed.
func (d *durability) waitIdle(done <-chan struct{}) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		select {
		case <-done:
			return nil
		default:
		}
		switch {
		case d.err != nil:
			return d.err
		case d.closed:
			return errStoreClosed
		case !d.syncing:
			return nil
		}
		d.cond.Wait()
	}
}

// signal runs fn under d.mu and wakes every waiter: fn changes what they
// wait for.
func (d *durability) signal(fn func()) {
	d.mu.Lock()
	fn()
	d.mu.Unlock()
	d.cond.Broadcast()
}

// wait returns once commit index is on disk, leading a sync when none is
// running that covers it.
func (d *durability) wait(index uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		switch {
		case d.err != nil:
			return d.err
		case d.durable >= index:
			return nil
		case d.closed:
			return errStoreClosed
		case !d.syncing && d.done >= index:
			d.lead()
		default:
			d.cond.Wait()
		}
	}
}

// lead runs one sync for every commit returned so far. Called and returns
// with d.mu held; drops it while syncing so commits and waiters go on.
func (d *durability) lead() {
	d.syncing = true
	upto := d.done
	d.mu.Unlock()
	err := d.sync()
	d.mu.Lock()
	d.syncing = false
	d.syncs++
	if err != nil {
		d.err = fmt.Errorf("%w: %w", ErrNotDurable, secfs.WithoutPath(err))
	} else {
		d.durable = upto
	}
	d.cond.Broadcast()
}

// sync fsyncs the -wal file. A WAL file it has not synced before (the
// first, or one deleted and recreated) may not have its directory entry
// on disk yet, so the directory is synced too. With no WAL file every
// commit was checkpointed into the database file when the WAL was
// removed; sync that and the directory.
func (d *durability) sync() error {
	fi, err := os.Lstat(d.walPath)
	if errors.Is(err, os.ErrNotExist) {
		d.dropWAL()
		if err := syncPath(d.dbPath); err != nil {
			return err
		}
		return syncPath(filepath.Dir(d.dbPath))
	}
	if err != nil {
		return err
	}
	fresh := d.wal == nil || !os.SameFile(fi, d.walFI)
	if fresh {
		if err := d.openWAL(); err != nil {
			return err
		}
	}
	if err := syncFile(d.wal); err != nil {
		return err
	}
	if fresh {
		return syncPath(filepath.Dir(d.dbPath))
	}
	return nil
}

// openWAL opens the current -wal file and keeps it open: an fd open when
// writeback fails is the one fsync reports the failure to.
func (d *durability) openWAL() error {
	d.dropWAL()
	f, err := os.OpenFile(d.walPath, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	d.wal, d.walFI = f, fi
	return nil
}

func (d *durability) dropWAL() {
	if d.wal != nil {
		d.wal.Close()
		d.wal, d.walFI = nil, nil
	}
}

// close makes every commit so far durable, then refuses further waits.
func (d *durability) close() error {
	err := d.wait(d.seen())
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for d.syncing {
		d.cond.Wait()
	}
	d.dropWAL()
	d.cond.Broadcast()
	return err
}

// syncPath fsyncs a file or directory by path.
func syncPath(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return syncFile(f)
}
