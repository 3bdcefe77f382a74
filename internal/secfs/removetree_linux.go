package secfs

// Removal of a hostile directory tree through directory handles.
//
// Everything below the tree root may change while the walk runs, so every
// step works on a handle: a directory is opened with openat(2) and
// O_NOFOLLOW|O_DIRECTORY relative to its parent's handle, read with
// getdents(2) from that handle, and emptied with unlinkat(2) on it. A name
// that turns out to be a symlink or another non-directory is unlinked,
// never opened through; a name that turns out to be a directory is opened.
// Permissions (and a btrfs subvolume's read-only flag) are restored only on
// a directory's own handle, after its mount was checked.
//
// Bounded descriptors without recursion: the walk keeps an explicit stack
// of one small record (name, device, inode) per directory from the tree
// root down to the one being emptied, and only the deepest
// removeMaxOpenDirs of them hold an open handle; opening a deeper directory
// closes the shallowest open one. Climbing back to a directory whose handle
// was closed reopens it as ".." of its child and accepts it only when its
// device and inode match the record; a mismatch means the tree was moved
// under the walk and is refused as ErrUnsafe.
//
// Each open directory is read in batches of removeBatchBytes. Deleting
// entries while reading may make a filesystem skip some, and the tree may
// be refilled, so a directory counts as empty only after a pass from its
// start met no entry; a reopened directory is read again from its start,
// which costs little because every entry before its old position is gone.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// removeMaxFds bounds the descriptors RemoveTree holds at once: the
	// trusted parent, at most removeMaxOpenDirs directories on the current
	// path, and one transient O_PATH handle used to restore permissions.
	removeMaxFds      = 64
	removeMaxOpenDirs = removeMaxFds - 2
	// removeBatchBytes is the getdents buffer of one open directory.
	removeBatchBytes = 8 << 10
	// removeMaxRetries bounds how often one directory is scanned again, or
	// found refilled after it was emptied, before the walk gives up: such a
	// tree is still being written to.
	removeMaxRetries = 16
	// removeMaxTypeFlips bounds the retries on an entry that keeps switching
	// between a directory and a non-directory.
	removeMaxTypeFlips = 8
	// removeMaxNameInError truncates hostile names quoted in errors.
	removeMaxNameInError = 48
)

// dirOpenFlags opens a directory to read and empty it. O_DIRECTORY makes
// the kernel refuse anything else before opening it, so a FIFO or device
// is never opened.
const dirOpenFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK

// RemoveTree removes path and everything below it without ever following a
// symlink: a symlink met anywhere, path included, is unlinked itself, and
// neither its target nor anything outside the tree is opened, changed or
// removed. The parent of path must be trusted; it is still opened one
// component at a time without following a symlink. path itself and
// everything below it may be hostile and may change during the walk.
//
// A missing path is not an error. Directories the caller owns without
// owner write and search permission are given them (on their own handle).
// A read-only btrfs subvolume is made writable. The walk refuses, with an
// error wrapping ErrUnsafe, to enter another mount or to climb to a
// directory other than the one it left. It holds at most removeMaxFds
// descriptors however deep or wide the tree. It returns nil only when path
// is gone.
func RemoveTree(path string) error { return removeTree(path, removeOpts{}) }

// removeOpts holds test knobs.
type removeOpts struct {
	onOpen    func(held int) // called after every open with the descriptors held
	procChmod bool           // restore permissions through /proc/self/fd, as without fchmodat2
}

// dirLevel is one directory on the path from the tree root to the
// directory being emptied.
type dirLevel struct {
	name     string // entry name in the directory above
	dev, ino uint64 // identity checked when the directory is reopened
	fd       int    // -1 while closed to stay within removeMaxFds
	buf      []byte // last getdents batch; buf[pos:end] is not handled yet
	pos, end int
	saw      bool // the current pass met an entry
	retries  int
}

type remover struct {
	parent int    // trusted parent of the tree root
	dev    uint64 // device and mount of the tree root: the walk stays on them
	mnt    uint64 // 0 when the kernel does not report mount IDs (dev checked instead)
	rooted bool   // dev and mnt are set
	levels []dirLevel
	lo     int // levels[lo:] hold open handles, the levels above none
	held   int // descriptors held now, the parent included
	free   [][]byte
	opts   removeOpts
}

// removeTreePath refuses a path RemoveTree must never walk.
func removeTreePath(path string) error {
	if !IsAbsClean(path) || path == "/" {
		return fmt.Errorf("remove tree: %w: not an absolute, clean path below /", ErrUnsafe)
	}
	return nil
}

func removeTree(path string, opts removeOpts) error {
	if err := removeTreePath(path); err != nil {
		return err
	}
	pf, _, err := OpenDirNoFollow(filepath.Dir(path), nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove tree: open parent: %w", err)
	}
	defer pf.Close()
	r := &remover{parent: int(pf.Fd()), held: 1, opts: opts}
	defer r.closeAll()
	return r.run(filepath.Base(path))
}

func (r *remover) run(name string) error {
	fd, st, err := r.enter(r.parent, name, true)
	if err != nil || fd < 0 {
		return err
	}
	r.dev, r.mnt, r.rooted = st.Dev, mountID(fd), true
	r.push(name, fd, &st)
	for len(r.levels) > 0 {
		if err := r.step(); err != nil {
			return err
		}
	}
	return nil
}

// step handles the next entry of the deepest directory, or that
// directory itself when a pass over it is complete.
func (r *remover) step() error {
	lv := &r.levels[len(r.levels)-1]
	name, isDir, ok, err := r.next(lv)
	if err != nil {
		return r.fail("read directory", lv.name, err)
	}
	if ok {
		lv.saw = true
		fd, st, err := r.enter(lv.fd, name, isDir)
		if err != nil || fd < 0 {
			return err
		}
		r.push(name, fd, &st)
		return nil
	}
	if lv.saw {
		return r.rescan(lv)
	}
	return r.finish()
}

// enter unlinks the entry name of dirfd and returns -1 when it is not a
// directory, or opens it to be emptied. isDir is the listing's hint; the
// entry may change type at any moment, and each "wrong type" answer
// switches to the other way.
func (r *remover) enter(dirfd int, name string, isDir bool) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	for range removeMaxTypeFlips {
		if !isDir {
			err := ignoringEINTR(func() error { return unix.Unlinkat(dirfd, name, 0) })
			switch {
			case err == nil, errors.Is(err, unix.ENOENT):
				return -1, st, nil
			case !errors.Is(err, unix.EISDIR):
				return -1, st, r.fail("remove", name, err)
			}
		}
		r.makeRoom()
		fd, st, err := r.openDir(dirfd, name, nil)
		switch {
		case err == nil:
			return fd, st, nil
		case errors.Is(err, unix.ENOENT):
			return -1, st, nil
		case !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR):
			return -1, st, r.fail("open directory", name, err)
		}
		isDir = false // a symlink or another non-directory: unlink the entry itself
	}
	return -1, st, r.fail("remove", name, errors.New("entry keeps changing type"))
}

// finish removes the deepest directory, which a complete pass found empty.
func (r *remover) finish() error {
	i := len(r.levels) - 1
	lv := &r.levels[i]
	if i == 0 {
		err := ignoringEINTR(func() error { return unix.Unlinkat(r.parent, lv.name, unix.AT_REMOVEDIR) })
		switch {
		case err == nil, errors.Is(err, unix.ENOENT):
			r.pop()
			return nil
		case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST):
			return r.rescan(lv) // refilled after its last pass
		}
		return r.fail("remove directory", lv.name, err)
	}
	up := &r.levels[i-1]
	if up.fd < 0 {
		if err := r.reopenAbove(i); err != nil {
			return err
		}
	}
	err := ignoringEINTR(func() error { return unix.Unlinkat(up.fd, lv.name, unix.AT_REMOVEDIR) })
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOTDIR):
		// Refilled, or the name now holds something else: the pass over
		// the directory above met this entry, so it scans again.
		up.retries++
		if up.retries > removeMaxRetries {
			return r.fail("remove directory", lv.name, errors.New("directory keeps changing"))
		}
	default:
		return r.fail("remove directory", lv.name, err)
	}
	r.pop()
	return nil
}

// rescan starts another pass over lv from its start.
func (r *remover) rescan(lv *dirLevel) error {
	lv.retries++
	if lv.retries > removeMaxRetries {
		return r.fail("empty directory", lv.name, errors.New("directory keeps changing"))
	}
	lv.saw = false
	lv.pos, lv.end = 0, 0
	if _, err := unix.Seek(lv.fd, 0, io.SeekStart); err != nil {
		return r.fail("rewind directory", lv.name, err)
	}
	return nil
}

// reopenAbove reopens levels[i-1], closed to bound descriptors, as ".." of
// levels[i], accepting only the directory recorded there.
func (r *remover) reopenAbove(i int) error {
	lv, up := &r.levels[i], &r.levels[i-1]
	fd, _, err := r.openDir(lv.fd, "..", up)
	if err != nil {
		return r.fail("reopen the directory above", lv.name, err)
	}
	up.fd = fd
	up.pos, up.end = 0, 0
	r.lo = i - 1
	return nil
}

// openDir opens name below dirfd as a directory to read and empty, checks
// it (want, when set, is the directory it must be), and gives it owner
// read, write and search permission when the caller owns it and lacks them.
func (r *remover) openDir(dirfd int, name string, want *dirLevel) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := r.openat(dirfd, name, dirOpenFlags)
	if errors.Is(err, unix.EACCES) {
		// No read permission (mode 0000, 0300): a directory cannot be
		// opened to read or fchmod'ed without it, so restore it through an
		// O_PATH handle of the directory itself and open again.
		if err := r.unlock(dirfd, name, want); err != nil {
			return -1, st, err
		}
		fd, err = r.openat(dirfd, name, dirOpenFlags)
	}
	if err != nil {
		return -1, st, err
	}
	if err := r.admit(fd, &st, want); err != nil {
		r.close(fd)
		return -1, st, err
	}
	if r.rooted && st.Dev != r.dev && st.Ino == btrfsSubvolRootIno {
		// A btrfs subvolume, which any user may make (and snapshot
		// read-only) where it can write: make it writable on its own
		// handle, or nothing below could be unlinked, by root either.
		// Errors surface as the unlinks that then fail.
		makeSubvolWritable(fd)
	}
	if st.Mode&0o700 != 0o700 && int(st.Uid) == os.Geteuid() {
		// Emptying it needs owner write and search permission; root does
		// without, but the change is harmless on a directory about to go.
		err := ignoringEINTR(func() error { return unix.Fchmod(fd, st.Mode&0o7777|0o700) })
		if err != nil {
			r.close(fd)
			return -1, st, err
		}
	}
	return fd, st, nil
}

// unlock gives the directory name below dirfd owner read, write and search
// permission through an O_PATH handle of it.
func (r *remover) unlock(dirfd int, name string, want *dirLevel) error {
	fd, err := r.openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
	if err != nil {
		return err
	}
	defer r.close(fd)
	var st unix.Stat_t
	if err := r.admit(fd, &st, want); err != nil {
		return err
	}
	if int(st.Uid) != os.Geteuid() {
		return unix.EACCES
	}
	mode := st.Mode&0o7777 | 0o700
	if !r.opts.procChmod {
		// fchmod(2) refuses an O_PATH handle; fchmodat2 (Linux 6.6) with
		// AT_EMPTY_PATH changes the handle's own inode.
		err := unix.Fchmodat(fd, "", mode, unix.AT_EMPTY_PATH)
		if err == nil || !(errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM)) {
			return err
		}
	}
	// Older kernels (or a seccomp filter that predates fchmodat2): the
	// handle's /proc link names this descriptor's inode, not a tree path.
	return unix.Fchmodat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), mode, 0)
}

// btrfs subvolume flags (linux/btrfs.h): the inode number of a
// subvolume's root directory, BTRFS_IOC_SUBVOL_GETFLAGS and _SETFLAGS
// (_IOR and _IOW(0x94, 25 and 26, __u64)), and BTRFS_SUBVOL_RDONLY.
const (
	btrfsSubvolRootIno     = 256
	btrfsIocSubvolGetflags = 0x80089419
	btrfsIocSubvolSetflags = 0x4008941a
	btrfsSubvolRdonly      = 1 << 1
)

// makeSubvolWritable clears the read-only flag of the btrfs subvolume
// whose root directory fd holds; the kernel allows it to the subvolume's
// owner and to root.
func makeSubvolWritable(fd int) {
	var flags uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), btrfsIocSubvolGetflags, uintptr(unsafe.Pointer(&flags))); e != 0 || flags&btrfsSubvolRdonly == 0 {
		return
	}
	flags &^= btrfsSubvolRdonly
	unix.Syscall(unix.SYS_IOCTL, uintptr(fd), btrfsIocSubvolSetflags, uintptr(unsafe.Pointer(&flags)))
}

// admit checks a directory handle before the walk uses or changes it: it
// must be a directory, the one recorded in want when set, and on the tree
// root's device and mount.
func (r *remover) admit(fd int, st *unix.Stat_t, want *dirLevel) error {
	if err := fstatRetry(fd, st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return ErrType
	}
	if want != nil && (st.Dev != want.dev || st.Ino != want.ino) {
		return fmt.Errorf("%w: unexpected directory at \"..\": the tree moved during removal", ErrUnsafe)
	}
	// The mount ID decides where the kernel reports it: a btrfs subvolume,
	// which any user may create where it can write, has a device number of
	// its own but is no mount. The device stands in only without mount IDs.
	if r.rooted && ((r.mnt != 0 && mountID(fd) != r.mnt) || (r.mnt == 0 && st.Dev != r.dev)) {
		return fmt.Errorf("%w: mount point inside the tree", ErrUnsafe)
	}
	return nil
}

// next returns the next entry of lv, reading a new batch when the last one
// is used up; ok is false at the end of the directory.
func (r *remover) next(lv *dirLevel) (name string, isDir, ok bool, err error) {
	for {
		if lv.pos >= lv.end {
			if lv.buf == nil {
				lv.buf = r.buffer()
			}
			var n int
			err := ignoringEINTR(func() (err error) { n, err = unix.Getdents(lv.fd, lv.buf); return err })
			if err != nil || n <= 0 {
				return "", false, false, err
			}
			lv.pos, lv.end = 0, n
		}
		d, ok := parseDirent(lv.buf[lv.pos:lv.end])
		if !ok {
			return "", false, false, errors.New("malformed directory entry")
		}
		lv.pos += d.reclen
		if d.ino == 0 || d.name == "." || d.name == ".." {
			continue
		}
		return d.name, d.typ == unix.DT_DIR, true, nil
	}
}

func (r *remover) push(name string, fd int, st *unix.Stat_t) {
	r.levels = append(r.levels, dirLevel{name: name, dev: st.Dev, ino: st.Ino, fd: fd})
}

func (r *remover) pop() {
	i := len(r.levels) - 1
	r.closeLevel(&r.levels[i])
	r.levels[i] = dirLevel{}
	r.levels = r.levels[:i]
	r.lo = min(r.lo, i)
}

// makeRoom closes the shallowest open directories until one more fits.
func (r *remover) makeRoom() {
	for len(r.levels)-r.lo >= removeMaxOpenDirs {
		r.closeLevel(&r.levels[r.lo])
		r.lo++
	}
}

func (r *remover) closeLevel(lv *dirLevel) {
	if lv.fd >= 0 {
		r.close(lv.fd)
		lv.fd = -1
	}
	if lv.buf != nil {
		r.free = append(r.free, lv.buf)
		lv.buf = nil
	}
	lv.pos, lv.end = 0, 0
}

func (r *remover) closeAll() {
	for i := range r.levels {
		r.closeLevel(&r.levels[i])
	}
}

// buffer returns a batch buffer; at most removeMaxOpenDirs exist at once.
func (r *remover) buffer() []byte {
	if n := len(r.free); n > 0 {
		b := r.free[n-1]
		r.free = r.free[:n-1]
		return b
	}
	return make([]byte, removeBatchBytes)
}

func (r *remover) openat(dirfd int, name string, flags int) (int, error) {
	fd, err := openRetry(func() (int, error) { return unix.Openat(dirfd, name, flags, 0) })
	if err != nil {
		return -1, err
	}
	r.held++
	if r.opts.onOpen != nil {
		r.opts.onOpen(r.held)
	}
	return fd, nil
}

func (r *remover) close(fd int) {
	unix.Close(fd)
	r.held--
}

// fail names the failed step and a hostile name, truncated and quoted.
func (r *remover) fail(op, name string, err error) error {
	if len(name) > removeMaxNameInError {
		name = name[:removeMaxNameInError] + "..."
	}
	return fmt.Errorf("remove tree: %s %q at depth %d: %w", op, name, len(r.levels), err)
}

// mountID returns the mount ID of an open file, or 0 when the kernel does
// not report it (before Linux 5.8). It tells a bind mount, which shares
// the device number of its source, from its mount point.
func mountID(fd int) uint64 {
	var stx unix.Statx_t
	err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &stx)
	if err != nil || stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0
	}
	return stx.Mnt_id
}

// direntHeader is the size of a linux_dirent64 before its name: d_ino (8
// bytes), d_off (8), d_reclen (2), d_type (1).
const direntHeader = 19

type dirent struct {
	ino    uint64
	typ    uint8
	name   string
	reclen int
}

// parseDirent decodes the linux_dirent64 record at the start of buf. ok is
// false for a record that is truncated, runs past buf, or has no
// NUL-terminated, non-empty name free of '/'.
func parseDirent(buf []byte) (d dirent, ok bool) {
	if len(buf) < direntHeader {
		return d, false
	}
	reclen := int(binary.NativeEndian.Uint16(buf[16:18]))
	if reclen <= direntHeader || reclen > len(buf) {
		return d, false
	}
	name := buf[direntHeader:reclen]
	n := bytes.IndexByte(name, 0)
	if n <= 0 || bytes.IndexByte(name[:n], '/') >= 0 {
		return d, false
	}
	return dirent{ino: binary.NativeEndian.Uint64(buf[0:8]), typ: buf[18], name: string(name[:n]), reclen: reclen}, true
}

func ignoringEINTR(fn func() error) error {
	for {
		err := fn()
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
