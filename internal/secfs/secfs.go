// Package secfs holds the filesystem primitives both programs use on
// trusted paths: private directories, atomic durable writes, opens that
// never follow a symlink, and removal of a hostile tree below a trusted
// directory through directory handles (RemoveTree). No other package calls
// os.Chmod, os.Rename or os.OpenFile on trusted paths directly.
package secfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrUnsafe reports a trusted path that is a symlink, has the wrong type,
// owner or mode.
var ErrUnsafe = errors.New("unsafe path")

// EnsurePrivateDir creates dir (and missing parents with 0700) and checks
// that dir itself is a real directory (not a symlink) owned by the current
// user with mode 0700; a wider mode is tightened, another owner refused.
func EnsurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir() {
		return fmt.Errorf("%w: not a directory", ErrUnsafe)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: directory owned by another user", ErrUnsafe)
	}
	if fi.Mode().Perm() != 0o700 {
		return os.Chmod(dir, 0o700)
	}
	return nil
}

// MkdirFresh creates dir with mode 0700; it fails if dir already exists,
// so a caller knows the directory is new.
func MkdirFresh(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700) // exact mode regardless of umask
}

// Chmod sets the permission bits of a path this program created, never
// through a symlink: the name's last component is opened O_PATH and
// O_NOFOLLOW, refused if it is a symlink, and the mode is set on what
// was opened (through its /proc/self/fd link), so a name swapped for a
// symlink after it was made (a socket in a directory a sandbox can write)
// redirects nothing.
func Chmod(path string, mode os.FileMode) error {
	fail := func(err error) error { return &os.PathError{Op: "chmod", Path: path, Err: err} }
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return fail(fmt.Errorf("%w: symlink", ErrUnsafe))
	}
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), uint32(mode.Perm())); err != nil {
		return fail(err)
	}
	return nil
}

// WriteFileAtomic writes data to path durably: a temp file beside it
// (O_EXCL, 0600), write, fsync, chmod, close, rename, fsync the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return FsyncDir(dir)
}

// FsyncDir makes a directory's entries durable.
func FsyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReadFileNoFollow reads a regular file, refusing a symlink at the last
// component and anything that is not a regular file.
func ReadFileNoFollow(path string, maxBytes int64) ([]byte, error) {
	f, err := OpenRegularNoFollow(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxBytes {
		return nil, fmt.Errorf("file larger than %d bytes", maxBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > maxBytes {
		return nil, fmt.Errorf("file larger than %d bytes", maxBytes)
	}
	return data, nil
}

// OpenRegularNoFollow opens path for reading when it is a regular file:
// a symlink as its last component is refused, and a FIFO or device is
// refused without blocking (O_NONBLOCK, the type checked on the handle).
func OpenRegularNoFollow(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%w: symlink", ErrUnsafe)
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: not a regular file", ErrUnsafe)
	}
	return f, nil
}

// MkdirOwned creates dir (which must not exist) with mode 0700 and gives
// it to uid:gid, through the new directory's own handle.
func MkdirOwned(dir string, uid, gid int) error {
	if err := MkdirFresh(dir); err != nil {
		return err
	}
	return ChownNoFollow(dir, uid, gid)
}

// ChownNoFollow gives path to uid:gid through a handle opened without
// following a symlink at its last component; a symlink there is refused.
// It is a no-op when path already has that owner.
func ChownNoFollow(path string, uid, gid int) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: filepath.Base(path), Err: err}
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
		return fmt.Errorf("%w: %s is a symlink", ErrUnsafe, filepath.Base(path))
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		return nil
	}
	// fchownat(fd, "", AT_EMPTY_PATH) changes the inode the handle names.
	if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
		return &os.PathError{Op: "chown", Path: filepath.Base(path), Err: err}
	}
	return nil
}

// CreateNew creates path for writing, failing when anything (a link
// included) is there already.
func CreateNew(path string, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
}

// RenameNoReplace renames oldpath to newpath unless newpath exists (then
// fs.ErrExist), atomically: of two writers, one wins and the other sees
// the winner's.
func RenameNoReplace(oldpath, newpath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: fs.ErrExist}
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
	return nil
}
