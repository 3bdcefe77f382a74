// Package delegate hands a directory tree (a fresh git worktree) to a
// workspace consumer: a non-root uid and gid other than the runtime's.
//
// Existing entries keep their file and directory modes and only change
// owner. Every directory also gets the default ACL ConsumerACL(gid), so
// whatever is created below later gives its owner and the consumer group
// access and others none, whatever the creator's umask, even below a
// directory that was world-readable. The access ACLs and modes of existing
// entries are not touched.
//
// A file with more than one link is refused: the other link may be
// outside the tree (a repository cloned from a local path shares its
// objects with the source), and re-owning the inode would hand that file
// over too.
//
// The walk never follows a symbolic link: every entry is opened with
// O_PATH|O_NOFOLLOW relative to its parent's descriptor and re-owned through
// that descriptor, so a planted link (the root included) cannot redirect it
// outside the tree. Errors name entries relative to the root, never by
// their host path.
//
// Delegating needs CAP_CHOWN and CAP_FOWNER (in practice root).
package delegate

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoACLSupport reports a filesystem without POSIX ACLs. Delegation fails
// rather than leave new files to the umask.
var ErrNoACLSupport = errors.New("filesystem lacks POSIX ACL support")

// Tree delegates root and everything below it to uid:gid. root must be a
// directory and not a symbolic link.
func Tree(root string, uid, gid int) error {
	w, err := newWalker(uid, gid)
	if err != nil {
		return err
	}
	fd, err := openDir(unix.AT_FDCWD, root, ".")
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return w.dir(fd, ".")
}

// Subtrees delegates the named directories directly inside base, each
// with everything below it, and leaves base and its other entries alone
// (for example objects, refs and logs of a .git directory, but not its
// config or hooks). Every name is opened before anything changes, so a
// missing, non-directory or symlinked name leaves the whole base untouched.
func Subtrees(base string, names []string, uid, gid int) error {
	w, err := newWalker(uid, gid)
	if err != nil {
		return err
	}
	bfd, err := openDir(unix.AT_FDCWD, base, ".")
	if err != nil {
		return err
	}
	defer unix.Close(bfd)
	fds := make([]int, 0, len(names))
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, name := range names {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			return fmt.Errorf("delegate: %q: not a single path component", name)
		}
		fd, err := openDir(bfd, name, name)
		if err != nil {
			return err
		}
		fds = append(fds, fd)
	}
	for i, fd := range fds {
		if err := w.dir(fd, names[i]); err != nil {
			return err
		}
	}
	return nil
}

type walker struct {
	uid, gid int
	acl      []byte // encoded ConsumerACL(gid)
}

func newWalker(uid, gid int) (*walker, error) {
	// -1 would mean "leave unchanged" to chown, 0 is root: neither is a
	// consumer.
	if uid <= 0 || gid <= 0 || uint64(uid) >= uint64(UndefinedID) || uint64(gid) >= uint64(UndefinedID) {
		return nil, fmt.Errorf("delegate: consumer uid %d gid %d: must be non-root ids", uid, gid)
	}
	return &walker{uid: uid, gid: gid, acl: EncodeACL(ConsumerACL(gid))}, nil
}

func fail(rel, op string, err error) error {
	return fmt.Errorf("delegate: %q: %s: %w", rel, op, err)
}

// openPath opens name below dirfd as O_PATH without following a symlink:
// the descriptor pins the inode that is then stat-ed and re-owned, and
// opening it has no side effect even on a FIFO or device.
func openPath(dirfd int, name, rel string) (int, *unix.Stat_t, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, fail(rel, "open", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nil, fail(rel, "stat", err)
	}
	return fd, &st, nil
}

// openDir opens name below dirfd, which must be a directory and not a
// symlink, and returns an O_PATH descriptor for it.
func openDir(dirfd int, name, rel string) (int, error) {
	fd, st, err := openPath(dirfd, name, rel)
	if err != nil {
		return -1, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return fd, nil
	case unix.S_IFLNK:
		err = errors.New("is a symbolic link")
	default:
		err = errors.New("not a directory")
	}
	unix.Close(fd)
	return -1, fmt.Errorf("delegate: %q: %w", rel, err)
}

// entry delegates name inside the directory dirfd.
func (w *walker) entry(dirfd int, name, rel string) error {
	fd, st, err := openPath(dirfd, name, rel)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return w.dir(fd, rel)
	}
	// Another link to the inode may be outside the tree (a local clone's
	// objects are hard links to its source's): re-owning it would hand
	// that file to the consumer too.
	if st.Nlink != 1 {
		return fmt.Errorf("delegate: %q: %d hard links (it may be shared with a file outside the tree)", rel, st.Nlink)
	}
	return w.own(fd, st, rel)
}

// dir delegates the directory held by the O_PATH descriptor pfd. The ACL
// goes first, so a filesystem without ACLs fails before anything changes,
// and the directory is re-owned last, so the consumer gets it only once
// everything below is done.
func (w *walker) dir(pfd int, rel string) error {
	// Reopening "." below the O_PATH descriptor reads the same inode, not
	// whatever the name points at by now.
	fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(rel, "open", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(rel, "stat", err)
	}
	if err := unix.Fsetxattr(fd, xattrDefaultACL, w.acl, 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("delegate: %q: %w", rel, ErrNoACLSupport)
		}
		return fail(rel, "set default ACL", err)
	}
	names, err := readNames(fd)
	if err != nil {
		return fail(rel, "read directory", err)
	}
	for _, name := range names {
		if err := w.entry(fd, name, path.Join(rel, name)); err != nil {
			return err
		}
	}
	return w.own(fd, &st, rel)
}

// own re-owns the entry held by fd (a symlink itself, never its target)
// and puts back mode bits the chown cleared: the kernel drops setuid and
// setgid from non-directories on chown, even when root does it.
func (w *walker) own(fd int, before *unix.Stat_t, rel string) error {
	if err := unix.Fchownat(fd, "", w.uid, w.gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail(rel, "chown", err)
	}
	if before.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil // a symlink's mode is meaningless and cannot be set
	}
	var after unix.Stat_t
	if err := unix.Fstat(fd, &after); err != nil {
		return fail(rel, "stat", err)
	}
	if after.Mode&07777 == before.Mode&07777 {
		return nil
	}
	// fchmod refuses O_PATH descriptors; the /proc link names exactly the
	// inode fd holds, whatever its path has become.
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), before.Mode&07777); err != nil {
		return fail(rel, "restore mode", err)
	}
	return nil
}

// readNames lists the directory fd, without "." and "..".
func readNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 16<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
