package secfs

// Opens that never follow a symbolic link anywhere on a path.
//
// Every trusted path is opened one component at a time from an open
// directory handle: with openat2(2) and RESOLVE_NO_SYMLINKS |
// RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH where the kernel has it (Linux
// 5.6+), and otherwise with openat(2) and O_NOFOLLOW followed by an fstat of
// the handle. Either way the caller inspects the type, owner and mode on the
// open handle, never on the path string, and the next component is opened
// relative to that handle, so a directory swapped for a symlink between two
// checks is never followed.
//
// Errors never carry the path (callers name the field instead); a symbolic
// link is ErrSymlink, an unexpected file type ErrType, a missing component
// fs.ErrNotExist (unix.ENOENT).

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrSymlink reports a symbolic link met while resolving a trusted path.
var ErrSymlink = fmt.Errorf("%w: symbolic link on the path", ErrUnsafe)

// ErrType reports a path component of an unexpected file type (a socket or
// device opened for reading, a non-directory where a directory is needed).
var ErrType = fmt.Errorf("%w: unexpected file type", ErrUnsafe)

// openat2 availability: 0 unknown, 1 available, 2 unavailable (fallback).
var openat2State atomic.Int32

// forceOpenatFallbackForTest makes every open use the openat+fstat walk, so
// tests cover the path kernels without openat2 take.
var forceOpenatFallbackForTest atomic.Bool

// SetOpenatFallbackForTest forces (or stops forcing) the openat fallback.
func SetOpenatFallbackForTest(on bool) { forceOpenatFallbackForTest.Store(on) }

const resolveNoFollow = unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_BENEATH

// OpenChild opens the single path component name below dir without
// following a symbolic link, and returns the handle with its fstat. flags
// are open(2) flags (O_PATH, O_RDONLY|O_NONBLOCK, O_DIRECTORY, ...);
// O_NOFOLLOW and O_CLOEXEC are always added. O_DIRECTORY is checked on the
// handle; combine it with O_PATH (opening a FIFO without it would block). A FIFO opened for reading must
// be opened with O_NONBLOCK (or O_PATH) so the open does not block.
func OpenChild(dir *os.File, name string, flags int) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.IndexByte(name, 0) >= 0 {
		return nil, st, fmt.Errorf("%w: not a single path component", ErrUnsafe)
	}
	// O_DIRECTORY is checked on the handle instead of passed to the kernel,
	// which would report a symlink as "not a directory" (ENOTDIR) rather
	// than as a symlink.
	wantDir := flags&unix.O_DIRECTORY != 0
	fd, err := openChildFd(int(dir.Fd()), name, flags&^unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
	if err != nil {
		return nil, st, err
	}
	if err := fstatRetry(fd, &st); err != nil {
		unix.Close(fd)
		return nil, st, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		// Only reachable through the fallback with O_PATH|O_NOFOLLOW, which
		// opens the link itself.
		unix.Close(fd)
		return nil, st, ErrSymlink
	}
	if wantDir && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return nil, st, ErrType
	}
	return os.NewFile(uintptr(fd), name), st, nil
}

// OpenRoot opens "/" as an O_PATH directory handle.
func OpenRoot() (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := openRetry(func() (int, error) {
		return unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, st, err
	}
	if err := fstatRetry(fd, &st); err != nil {
		unix.Close(fd)
		return nil, st, err
	}
	return os.NewFile(uintptr(fd), "/"), st, nil
}

// Components splits an absolute, clean path into its components. It fails
// for a relative path, a path that is not clean (".", "..", "//", a
// trailing slash) or one holding a NUL byte.
func Components(absPath string) ([]string, error) {
	if !IsAbsClean(absPath) {
		return nil, fmt.Errorf("%w: not an absolute, clean path", ErrUnsafe)
	}
	if absPath == "/" {
		return nil, nil
	}
	return strings.Split(absPath[1:], "/"), nil
}

// IsAbsClean reports whether p is absolute and already in clean form: no
// empty, "." or ".." component, no trailing slash, no NUL byte.
func IsAbsClean(p string) bool {
	if p == "/" {
		return true
	}
	if len(p) < 2 || p[0] != '/' || p[len(p)-1] == '/' || strings.IndexByte(p, 0) >= 0 {
		return false
	}
	for _, c := range strings.Split(p[1:], "/") {
		if c == "" || c == "." || c == ".." {
			return false
		}
	}
	return true
}

// OpenDirNoFollow opens the absolute, clean directory path as an O_PATH
// handle, one component at a time from "/", following no symbolic link.
// visit, when not nil, sees every directory on the way with its fstat, from
// "/" (depth 0) down to path itself (depth len(components)); a visit error
// stops the walk and is returned as is.
func OpenDirNoFollow(absPath string, visit func(depth int, st *unix.Stat_t) error) (*os.File, unix.Stat_t, error) {
	comps, err := Components(absPath)
	if err != nil {
		return nil, unix.Stat_t{}, err
	}
	dir, st, err := OpenRoot()
	if err != nil {
		return nil, st, err
	}
	if visit != nil {
		if err := visit(0, &st); err != nil {
			dir.Close()
			return nil, st, err
		}
	}
	for i, c := range comps {
		next, nst, err := OpenChild(dir, c, unix.O_PATH|unix.O_DIRECTORY)
		dir.Close()
		if err != nil {
			return nil, nst, err
		}
		dir, st = next, nst
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			dir.Close()
			return nil, st, ErrType
		}
		if visit != nil {
			if err := visit(i+1, &st); err != nil {
				dir.Close()
				return nil, st, err
			}
		}
	}
	return dir, st, nil
}

// ReadFileBelow reads the regular file rel (a relative, clean path)
// below dir, at most max bytes. dir itself is opened as given (the
// caller's trusted root, say a repository the user named); no component
// of rel is followed if it is a symlink, so a symlink committed in the
// tree never leads the read elsewhere. A missing component is
// fs.ErrNotExist.
func ReadFileBelow(dir, rel string, max int64) ([]byte, error) {
	comps := strings.Split(rel, "/")
	if rel == "" || slices.ContainsFunc(comps, func(c string) bool { return c == "" || c == "." || c == ".." }) {
		return nil, fmt.Errorf("%w: not a relative, clean path", ErrUnsafe)
	}
	fd, err := openRetry(func() (int, error) {
		return unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, mapOpenErr(err)
	}
	cur := os.NewFile(uintptr(fd), "")
	for _, c := range comps[:len(comps)-1] {
		next, _, err := OpenChild(cur, c, unix.O_PATH|unix.O_DIRECTORY)
		cur.Close()
		if err != nil {
			return nil, err
		}
		cur = next
	}
	f, st, err := OpenChild(cur, comps[len(comps)-1], unix.O_RDONLY|unix.O_NONBLOCK)
	cur.Close()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, ErrType
	}
	if st.Size > max {
		return nil, fmt.Errorf("file larger than %d bytes", max)
	}
	return ReadAllLimited(f, max)
}

// ReadAllLimited reads f to its end, failing when it holds more than max
// bytes; it never buffers more than max+1 bytes.
func ReadAllLimited(f *os.File, max int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, WithoutPath(err)
	}
	if int64(len(data)) > max {
		clear(data)
		return nil, fmt.Errorf("file larger than %d bytes", max)
	}
	return data, nil
}

// Fstat returns the stat of an open file without naming its path.
func Fstat(f *os.File) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := fstatRetry(int(f.Fd()), &st)
	return st, err
}

func openChildFd(dirfd int, name string, flags int) (int, error) {
	if !forceOpenatFallbackForTest.Load() && openat2State.Load() != 2 {
		fd, err := openRetry(func() (int, error) {
			return unix.Openat2(dirfd, name, &unix.OpenHow{Flags: uint64(flags), Resolve: resolveNoFollow})
		})
		switch {
		case err == nil:
			openat2State.Store(1)
			return fd, nil
		case errors.Is(err, unix.ENOSYS) || (errors.Is(err, unix.EPERM) && openat2State.Load() == 0):
			// No openat2 here (old kernel, or a seccomp filter that predates
			// it): take the equivalent walk below from now on.
			openat2State.Store(2)
		default:
			return -1, mapOpenErr(err)
		}
	}
	fd, err := openRetry(func() (int, error) { return unix.Openat(dirfd, name, flags, 0) })
	if err != nil {
		return -1, mapOpenErr(err)
	}
	return fd, nil
}

func mapOpenErr(err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return ErrSymlink
	case errors.Is(err, unix.ENXIO), errors.Is(err, unix.ENOTDIR):
		return ErrType
	case errors.Is(err, unix.EXDEV):
		// RESOLVE_BENEATH refused an escape; a single component cannot
		// escape, so this is a magic link or a crossed boundary.
		return fmt.Errorf("%w: path escapes its directory", ErrUnsafe)
	}
	return err
}

func openRetry(open func() (int, error)) (int, error) {
	for {
		fd, err := open()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return fd, err
	}
}

func fstatRetry(fd int, st *unix.Stat_t) error {
	for {
		err := unix.Fstat(fd, st)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err
	}
}

// BirthTime returns an open file's creation time (statx STATX_BTIME), in
// nanoseconds since the epoch, or 0 when the filesystem does not record it.
// With device and inode it tells a file from a new one that reused a freed
// inode number.
func BirthTime(f *os.File) int64 {
	var stx unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME, &stx); err != nil {
		return 0
	}
	if stx.Mask&unix.STATX_BTIME == 0 {
		return 0
	}
	return stx.Btime.Sec*1e9 + int64(stx.Btime.Nsec)
}
