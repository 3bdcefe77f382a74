package dispatch

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/spool"
	"agentbox/internal/secfs"
)

// Names in a spool's directory.
const (
	BindingFile    = ".binding.json"
	CapabilityFile = ".capability"
	RequestsDir    = "requests"
	ResponsesDir   = "responses"
	ProcessingDir  = ".processing"
)

// Modes of a spool's entries (owner root unless said otherwise).
const (
	rootMode       = 0o755
	immutableMode  = 0o444 // .binding.json, .capability
	requestsMode   = 0o700 // owned by the consumer
	responsesMode  = 0o755
	processingMode = 0o700
	requestMode    = 0o600 // each request file, the consumer's
	responseMode   = 0o400 // each response file, the consumer's
)

// MaxRequestEntries bounds the entries of requests/, hidden temporary
// files included: the spec's pending requests and room for the
// consumer's temporary files beside them.
const MaxRequestEntries = 4 * spool.MaxPendingRequests

// Layout is one spool's expected content.
type Layout struct {
	Binding    []byte // .binding.json
	Capability []byte // .capability
	UID, GID   int    // the consumer
}

// openDir opens the directory at the absolute path dir for reading,
// following no symbolic link on the way.
func openDir(dir string) (*os.File, unix.Stat_t, error) {
	parent, _, err := secfs.OpenDirNoFollow(filepath.Dir(dir), nil)
	if err != nil {
		return nil, unix.Stat_t{}, err
	}
	defer parent.Close()
	return secfs.OpenChild(parent, filepath.Base(dir), unix.O_RDONLY|unix.O_DIRECTORY)
}

// Init lays a fresh spool out in dir, the spool volume's directory, as
// root: .binding.json and .capability root-owned 0444 (each a temporary
// file renamed into place), requests/ 0700 owned by the consumer,
// responses/ root-owned 0755 and .processing/ root-owned 0700. The
// directory must be root-owned and empty. Every mode is checked again
// afterwards.
func Init(dir string, l Layout) error {
	d, st, err := openDir(dir)
	if err != nil {
		return fmt.Errorf("spool: open the volume's directory: %w", secfs.OpWithoutPath(err))
	}
	defer d.Close()
	if st.Uid != 0 {
		return errors.New("spool: the volume's directory is not root's")
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("spool: list the volume: %w", err)
	}
	if len(names) != 0 {
		return errors.New("spool: the volume is not empty")
	}
	fd := int(d.Fd())
	if err := unix.Fchmod(fd, rootMode); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{CapabilityFile, l.Capability}, {BindingFile, l.Binding}} {
		if err := writeFileAt(fd, f.name, f.data, immutableMode, 0, 0, false, true); err != nil {
			return err
		}
	}
	for _, sub := range []struct {
		name     string
		mode     uint32
		uid, gid int
	}{{RequestsDir, requestsMode, l.UID, l.GID}, {ResponsesDir, responsesMode, 0, 0}, {ProcessingDir, processingMode, 0, 0}} {
		if err := unix.Mkdirat(fd, sub.name, sub.mode); err != nil {
			return fmt.Errorf("spool: create %s: %w", sub.name, err)
		}
		if err := unix.Fchownat(fd, sub.name, sub.uid, sub.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("spool: own %s: %w", sub.name, err)
		}
		if err := unix.Fchmodat(fd, sub.name, sub.mode, 0); err != nil {
			return fmt.Errorf("spool: mode of %s: %w", sub.name, err)
		}
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	return Verify(d, l)
}

// Verify checks a spool's layout on its open directory: every entry's
// type, owner and mode, and the binding and capability bytes.
func Verify(d *os.File, l Layout) error {
	fd := int(d.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if err := want(".", &st, unix.S_IFDIR, rootMode, 0); err != nil {
		return err
	}
	for _, e := range []struct {
		name string
		kind uint32
		mode uint32
		uid  int
	}{
		{BindingFile, unix.S_IFREG, immutableMode, 0},
		{CapabilityFile, unix.S_IFREG, immutableMode, 0},
		{RequestsDir, unix.S_IFDIR, requestsMode, l.UID},
		{ResponsesDir, unix.S_IFDIR, responsesMode, 0},
		{ProcessingDir, unix.S_IFDIR, processingMode, 0},
	} {
		if err := unix.Fstatat(fd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("spool: %s: %w", e.name, err)
		}
		if err := want(e.name, &st, e.kind, e.mode, e.uid); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{BindingFile, l.Binding}, {CapabilityFile, l.Capability}} {
		got, err := readFileAt(fd, f.name, int64(len(f.data)))
		if err != nil {
			return err
		}
		if !bytes.Equal(got, f.data) {
			return fmt.Errorf("spool: %s does not hold what the assignment binds", f.name)
		}
	}
	return nil
}

func want(name string, st *unix.Stat_t, kind, mode uint32, uid int) error {
	switch {
	case st.Mode&unix.S_IFMT != kind:
		return fmt.Errorf("spool: %s is not a %s", name, kindName(kind))
	case st.Mode&0o7777 != mode:
		return fmt.Errorf("spool: %s has mode %04o, want %04o", name, st.Mode&0o7777, mode)
	case int(st.Uid) != uid:
		return fmt.Errorf("spool: %s is owned by uid %d, want %d", name, st.Uid, uid)
	}
	return nil
}

func kindName(kind uint32) string {
	if kind == unix.S_IFDIR {
		return "directory"
	}
	return "regular file"
}

// writeFileAt writes name in directory fd: a temporary file with the
// bytes, owner and mode (createFileAt), fsync, then a rename into place
// (placeFileAt); with syncDir the directory is fsync'd too. With
// noReplace, an existing name is left alone and reported as os.ErrExist.
func writeFileAt(fd int, name string, data []byte, mode uint32, uid, gid int, noReplace, syncDir bool) error {
	tmp := "." + name + ".tmp"
	f, err := createFileAt(fd, tmp, data, mode, uid, gid)
	if err != nil {
		return err
	}
	err = unix.Fsync(int(f.Fd()))
	f.Close()
	if err != nil {
		_ = unix.Unlinkat(fd, tmp, 0)
		return fmt.Errorf("spool: write %s: %w", name, err)
	}
	if err := placeFileAt(fd, tmp, fd, name, noReplace); err != nil {
		return err
	}
	if syncDir {
		return unix.Fsync(fd)
	}
	return nil
}

// createFileAt writes data to the temporary file tmp in directory fd
// (created exclusively, never through a link; a crashed writer's is
// removed first) with its owner and mode, unsynced. The caller syncs,
// closes and places it.
func createFileAt(fd int, tmp string, data []byte, mode uint32, uid, gid int) (*os.File, error) {
	_ = unix.Unlinkat(fd, tmp, 0)
	t, err := unix.Openat(fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool: create a temporary file: %w", err)
	}
	f := os.NewFile(uintptr(t), tmp)
	if _, err = f.Write(data); err == nil {
		if err = unix.Fchown(t, uid, gid); err == nil {
			err = unix.Fchmod(t, mode)
		}
	}
	if err != nil {
		f.Close()
		_ = unix.Unlinkat(fd, tmp, 0)
		return nil, fmt.Errorf("spool: write a temporary file: %w", err)
	}
	return f, nil
}

// placeFileAt renames tmp in directory from to name in directory to,
// removing tmp if that fails. With noReplace, an existing name is left
// alone and reported as os.ErrExist.
func placeFileAt(from int, tmp string, to int, name string, noReplace bool) error {
	flags := uint(0)
	if noReplace {
		flags = unix.RENAME_NOREPLACE
	}
	err := unix.Renameat2(from, tmp, to, name, flags)
	if err == nil {
		return nil
	}
	_ = unix.Unlinkat(from, tmp, 0)
	if noReplace && errors.Is(err, unix.EEXIST) {
		return os.ErrExist
	}
	return fmt.Errorf("spool: write %s: %w", name, err)
}

// readFileAt reads the regular file name in directory fd, at most max
// bytes, without following a link or blocking on a FIFO.
func readFileAt(fd int, name string, max int64) ([]byte, error) {
	f, st, err := openFileAt(fd, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("spool: %s is not a regular file", name)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("spool: read %s: %w", name, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("spool: %s is over %d bytes", name, max)
	}
	return data, nil
}

// openFileAt opens name in directory fd for reading, never through a
// link, never blocking (a FIFO opens and is then refused by its type).
func openFileAt(fd int, name string) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	n, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, st, fmt.Errorf("spool: %s is a symbolic link", name)
		}
		return nil, st, fmt.Errorf("spool: open %s: %w", name, err)
	}
	if err := unix.Fstat(n, &st); err != nil {
		unix.Close(n)
		return nil, st, fmt.Errorf("spool: %s: %w", name, err)
	}
	return os.NewFile(uintptr(n), name), st, nil
}

// openSubdir opens the directory name in directory fd, never through a
// link.
func openSubdir(fd int, name string) (*os.File, error) {
	n, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spool: open %s: %w", name, err)
	}
	return os.NewFile(uintptr(n), name), nil
}

// requestFile is a request file's name for request id.
func requestFile(id string) string { return id + ".json" }

// pending checks every entry of requests/ (open as d) against the rules
// and quotas: each a regular file (never a link, a FIFO or a directory)
// owned by the consumer with one link; each *.json request of mode 0600
// and 1 byte to spool.MaxRequestBytes; at most spool.MaxPendingRequests
// requests and spool.MaxSpoolBytes in all. Hidden entries are the
// consumer's temporary files before their rename: they count towards the
// bytes but need no .json name, mode or size yet. It reports whether
// request id is there.
func pending(d *os.File, uid int, id string) (bool, error) {
	// One past the bound at most: the consumer may fill the directory
	// with millions of names, which must cost the dispatcher nothing.
	names, err := d.Readdirnames(MaxRequestEntries + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("spool: list requests: %w", err)
	}
	if len(names) > MaxRequestEntries {
		return false, fmt.Errorf("spool: requests/ holds more than %d entries, over the quota", MaxRequestEntries)
	}
	var count int
	var total int64
	found := false
	for i, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // renamed by the consumer meanwhile
			}
			return false, fmt.Errorf("spool: requests/: %w", err)
		}
		if err := entryRules(&st, uid); err != nil {
			return false, fmt.Errorf("spool: requests/ entry %d is %w", i+1, err)
		}
		total += st.Size
		if strings.HasPrefix(name, ".") {
			continue
		}
		count++
		if !strings.HasSuffix(name, ".json") {
			return false, errors.New("spool: requests/ holds a file whose name does not end in .json")
		}
		if err := requestRules(&st); err != nil {
			return false, err
		}
		if name == requestFile(id) {
			found = true
		}
	}
	switch {
	case count > spool.MaxPendingRequests:
		return false, fmt.Errorf("spool: %d pending requests, over the quota of %d", count, spool.MaxPendingRequests)
	case total > spool.MaxSpoolBytes:
		return false, fmt.Errorf("spool: %d bytes of requests, over the quota of %d", total, spool.MaxSpoolBytes)
	}
	return found, nil
}

// entryRules: a regular file of the consumer's with one link.
func entryRules(st *unix.Stat_t, uid int) error {
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return errors.New("a symbolic link")
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return errors.New("not a regular file")
	case int(st.Uid) != uid:
		return fmt.Errorf("owned by uid %d, not the consumer", st.Uid)
	case st.Nlink != 1:
		return fmt.Errorf("%d hard links", st.Nlink)
	}
	return nil
}

// requestRules: mode 0600, 1 byte to the request limit.
func requestRules(st *unix.Stat_t) error {
	switch {
	case st.Mode&0o7777 != requestMode:
		return fmt.Errorf("spool: a request has mode %04o, want %04o", st.Mode&0o7777, requestMode)
	case st.Size < 1:
		return errors.New("spool: a request is empty")
	case st.Size > spool.MaxRequestBytes:
		return fmt.Errorf("spool: a request is over %d bytes", spool.MaxRequestBytes)
	}
	return nil
}
