// Package leasecheck checks an assignment and every materialization it
// names against the real files: where the assignment is stored, the modes
// and owners of the run directory, of every source-directory ancestor and
// of each source, file types, link counts, sizes and SHA-256 digests, and
// file contents (through package assignment's pure content rules).
//
// No check follows a symbolic link: every path is opened one component at
// a time from an open directory handle with openat2(RESOLVE_NO_SYMLINKS)
// (package secfs), and types, owners and modes are read from the open
// handle with fstat, never from the path string.
package leasecheck

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/secfs"
)

// ManagedRootEnv names the environment variable that replaces the managed
// root /run/branchbox/managed (tests point it at a temporary directory).
// The lease target namespace /run/branchbox/leases is never replaced: it
// names paths inside the container.
const ManagedRootEnv = "BRANCHBOX_MANAGED_ROOT"

// Options are the inputs of a check that do not come from the files.
type Options struct {
	// ManagedRoot replaces assignment.DefaultManagedRoot when not "".
	ManagedRoot string
	// Now is the time lease expiries are compared with.
	Now time.Time
	// Runtime is the runtime's effective uid and gid.
	Runtime assignment.Identity
	// PinnedSHA256, when not "", is the lowercase hex SHA-256 the
	// assignment's bytes must have (what `feature start` validated and
	// recorded): other bytes are refused as ErrChanged before they are
	// parsed.
	PinnedSHA256 string
}

// ErrChanged is the class of Load's refusal of an assignment whose bytes
// differ from Options.PinnedSHA256 (test with errors.Is). The refusal is
// an *assignment.Error (class assignment.ErrInvalid) too.
var ErrChanged = errors.New("the assignment changed since it was pinned")

// changedError is a refusal in both classes.
type changedError struct{ refusal *assignment.Error }

func (e *changedError) Error() string   { return e.refusal.Error() }
func (e *changedError) Unwrap() []error { return []error{e.refusal, ErrChanged} }

// Source is what a check observed of one materialization source.
type Source struct {
	Field string // JSON location of the materialization
	Path  string
	Kind  string // "file", "directory" or "socket"
	Dev   uint64
	Ino   uint64
	Birth int64  // creation time (ns), 0 if unknown: inode numbers are reused
	Mode  uint32 // st_mode: type and permission bits
	UID   uint32
}

// Checked is an assignment whose document and files passed every check.
type Checked struct {
	Assignment *assignment.Assignment
	Path       string // the assignment file
	Owner      uint32 // the assignment owner's uid
	// SHA256 is the lowercase hex SHA-256 of the assignment bytes that
	// were parsed and checked.
	SHA256  string
	Sources []Source
}

// Load reads the assignment at path without following a symlink, checks
// where and how it is stored, parses and validates it (package assignment)
// and checks every materialization on disk. Every refusal is an
// *assignment.Error (class assignment.ErrInvalid) naming a field or
// "assignment", never a value or a file's bytes.
func Load(assignmentPath string, opts Options) (*Checked, error) {
	root := opts.ManagedRoot
	if root == "" {
		root = assignment.DefaultManagedRoot
	}
	if !secfs.IsAbsClean(root) || root == "/" {
		return nil, assignment.Errorf("", "the managed root (%s) must be an absolute, clean path below /", ManagedRootEnv)
	}
	if !secfs.IsAbsClean(assignmentPath) {
		return nil, assignment.Errorf("assignment", "the path must be absolute and clean")
	}
	runDir := path.Dir(assignmentPath)
	if path.Dir(runDir) != root || runDir == root {
		return nil, assignment.Errorf("assignment", "must be stored directly in a run directory %s/<run-id>/", root)
	}
	c := &Checked{Path: assignmentPath}

	runFd, ancestors, runSt, err := openRun(runDir)
	if err != nil {
		return nil, err
	}
	defer runFd.Close()

	f, st, err := secfs.OpenChild(runFd, path.Base(assignmentPath), unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, assignment.Errorf("assignment", "%s", Describe(err))
	}
	defer f.Close()
	if err := fileRules(&st, "assignment", assignment.MaxAssignmentBytes); err != nil {
		return nil, err
	}
	c.Owner = st.Uid
	if c.Owner != 0 && c.Owner != opts.Runtime.UID {
		return nil, assignment.Errorf("assignment", "is owned by uid %d, which is neither root nor the runtime's uid %d", c.Owner, opts.Runtime.UID)
	}
	if err := checkRunDir(&runSt, ancestors, runDir, c.Owner); err != nil {
		return nil, err
	}
	data, err := secfs.ReadAllLimited(f, assignment.MaxAssignmentBytes)
	if err != nil {
		return nil, assignment.Errorf("assignment", "cannot be read: %s", Describe(err))
	}
	sum := sha256.Sum256(data)
	c.SHA256 = hex.EncodeToString(sum[:])
	if opts.PinnedSHA256 != "" && subtle.ConstantTimeCompare([]byte(c.SHA256), []byte(opts.PinnedSHA256)) != 1 {
		clear(data)
		return nil, &changedError{refusal: assignment.Errorf("assignment", "changed since the launch validated it (its SHA-256 differs from the one recorded at start)")}
	}
	rt := opts.Runtime
	a, err := assignment.Parse(data, assignment.Options{Now: opts.Now, ManagedRoot: root, Runtime: &rt})
	clear(data)
	if err != nil {
		return nil, err
	}
	if a.RunDir != runDir {
		return nil, assignment.Errorf("run_id", "does not name the run directory the assignment is stored in")
	}
	c.Assignment = a

	sources, err := c.checkSources(runFd)
	if err != nil {
		return nil, err
	}
	inodes := map[[2]uint64]string{{st.Dev, st.Ino}: "the assignment"}
	for _, src := range sources {
		key := [2]uint64{src.Dev, src.Ino}
		if other, dup := inodes[key]; dup {
			return nil, assignment.Errorf(src.Field+".source_path", "is the same file as %s (a hard link): sources must not overlap", other)
		}
		inodes[key] = src.Field
	}
	c.Sources = sources
	return c, nil
}

// Recheck repeats every source check and refuses any change since Load: a
// different file (device and inode), type, owner or mode, or a file whose
// bytes no longer match their digest.
func (c *Checked) Recheck() error {
	runFd, err := c.openCheckedRun()
	if err != nil {
		return err
	}
	defer runFd.Close()
	sources, err := c.checkSources(runFd)
	if err != nil {
		return err
	}
	for k, now := range sources {
		was, f := c.Sources[k], now.Field+".source_path"
		switch {
		case now.Kind != was.Kind:
			return assignment.Errorf(f, "changed type since validation (%s, now %s)", was.Kind, now.Kind)
		case now.Dev != was.Dev || now.Ino != was.Ino || now.Birth != was.Birth:
			return assignment.Errorf(f, "was replaced by another file since validation")
		case now.UID != was.UID:
			return assignment.Errorf(f, "changed owner since validation (uid %d, now %d)", was.UID, now.UID)
		case now.Mode != was.Mode:
			return assignment.Errorf(f, "changed mode since validation (%s, now %s)", octal(was.Mode), octal(now.Mode))
		}
	}
	return nil
}

// checkSources checks every materialization source, in lease order.
func (c *Checked) checkSources(runFd *os.File) ([]Source, error) {
	var matDir *os.File
	defer func() {
		if matDir != nil {
			matDir.Close()
		}
	}()
	var sources []Source
	for i := range c.Assignment.Leases {
		l := &c.Assignment.Leases[i]
		for j := range l.Materializations {
			m := &l.Materializations[j]
			var src Source
			var err error
			if m.Kind == assignment.SourceFile {
				if matDir == nil {
					if matDir, err = openMaterializations(runFd, c.Owner); err != nil {
						return nil, err
					}
				}
				src, err = checkFile(matDir, m, l.Scope, c.Owner, nil)
			} else {
				src, err = checkRunSource(runFd, c.Assignment.RunDir, m, c.Owner)
			}
			if err != nil {
				return nil, err
			}
			sources = append(sources, src)
		}
	}
	return sources, nil
}

// ReadValue reads one provider-environment value immediately before use:
// the run directory, the materializations directory and the file are
// opened and checked afresh, and the digest is recomputed from exactly the
// bytes returned, so a value rotated after validation is refused. The
// caller should clear the returned slice once it has used it.
func (c *Checked) ReadValue(b assignment.ValueBinding) ([]byte, error) {
	l := &c.Assignment.Leases[b.Lease]
	m := &l.Materializations[b.Index]
	runFd, err := c.openCheckedRun()
	if err != nil {
		return nil, err
	}
	defer runFd.Close()
	matDir, err := openMaterializations(runFd, c.Owner)
	if err != nil {
		return nil, err
	}
	defer matDir.Close()
	var data []byte
	if _, err := checkFile(matDir, m, l.Scope, c.Owner, &data); err != nil {
		return nil, err
	}
	return data, nil
}

// openCheckedRun reopens the run directory of a checked assignment and
// checks it and its ancestors again.
func (c *Checked) openCheckedRun() (*os.File, error) {
	runFd, ancestors, runSt, err := openRun(c.Assignment.RunDir)
	if err != nil {
		return nil, err
	}
	if err := checkRunDir(&runSt, ancestors, c.Assignment.RunDir, c.Owner); err != nil {
		runFd.Close()
		return nil, err
	}
	return runFd, nil
}

func field(m *assignment.Materialization) string { return m.Field + ".source_path" }

// openRun walks from "/" to the run directory without following a symlink
// and returns its handle, the stats of its ancestors ("/" first) and its
// own stat.
func openRun(runDir string) (*os.File, []unix.Stat_t, unix.Stat_t, error) {
	var ancestors []unix.Stat_t
	depth := strings.Count(runDir, "/")
	fd, st, err := secfs.OpenDirNoFollow(runDir, func(d int, st *unix.Stat_t) error {
		if d < depth {
			ancestors = append(ancestors, *st)
		}
		return nil
	})
	if err != nil {
		return nil, nil, st, assignment.Errorf("assignment", "the run directory: %s", Describe(err))
	}
	return fd, ancestors, st, nil
}

// checkRunDir: the run directory is a directory of mode exactly 0700 owned
// by the assignment owner; no ancestor can be replaced by another uid: each
// is owned by root or the assignment owner and is not group- or
// other-writable unless sticky (like /tmp).
func checkRunDir(st *unix.Stat_t, ancestors []unix.Stat_t, runDir string, owner uint32) error {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return assignment.Errorf("assignment", "the run directory is not a directory")
	}
	if st.Mode&07777 != 0o700 {
		return assignment.Errorf("assignment", "the run directory must have mode 0700, found %04o", st.Mode&07777)
	}
	if st.Uid != owner {
		return assignment.Errorf("assignment", "the run directory is owned by uid %d, not by the assignment owner uid %d", st.Uid, owner)
	}
	prefix := "/"
	comps := strings.Split(runDir[1:], "/")
	for i, a := range ancestors {
		if i > 0 {
			prefix = "/" + strings.Join(comps[:i], "/")
		}
		if r := AncestorReason(&a, owner); r != "" {
			return assignment.Errorf("assignment", "ancestor directory %s of the run directory %s", prefix, r)
		}
	}
	return nil
}

// AncestorReason returns why a directory with stat st may not be an
// ancestor of a run directory whose assignment owner is owner ("" when it
// may): another uid could replace what is below it. An ancestor is owned
// by root or the assignment owner and is not group- or other-writable
// unless sticky (like /tmp). It is exported so a command that creates a run
// directory (managed example) can refuse a place validate would refuse.
func AncestorReason(st *unix.Stat_t, owner uint32) string {
	if st.Uid != 0 && st.Uid != owner {
		return "is owned by uid " + itoa(st.Uid) + ", neither root nor the assignment owner"
	}
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return "is group- or other-writable without the sticky bit (mode " + octal(st.Mode) + ")"
	}
	return ""
}

// openMaterializations opens <run>/materializations: a directory of mode
// 0700 owned by the assignment owner (a source-directory ancestor).
func openMaterializations(runFd *os.File, owner uint32) (*os.File, error) {
	const f = "assignment"
	d, st, err := secfs.OpenChild(runFd, assignment.MaterializationsDir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return nil, assignment.Errorf(f, "the materializations directory: %s", Describe(err))
	}
	if err := privateDir(&st, owner); err != "" {
		d.Close()
		return nil, assignment.Errorf(f, "the materializations directory %s", err)
	}
	return d, nil
}

// privateDir returns why st is not a 0700 directory owned by owner.
func privateDir(st *unix.Stat_t, owner uint32) string {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "is not a directory"
	}
	if st.Mode&07777 != 0o700 {
		return "must have mode 0700, found " + octal(st.Mode)
	}
	if st.Uid != owner {
		return "is owned by uid " + itoa(st.Uid) + ", not by the assignment owner uid " + itoa(owner)
	}
	return ""
}

// fileRules: an owner-only regular file (no group or other bits, no
// set-id or sticky bit) with exactly one link and at most max bytes.
func fileRules(st *unix.Stat_t, f string, max int64) error {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return assignment.Errorf(f, "must be a regular file, found %s", kindName(st.Mode))
	}
	if st.Mode&0o077 != 0 {
		return assignment.Errorf(f, "must be owner-only (mode 0600 or stricter), found %s", octal(st.Mode))
	}
	if st.Mode&07000 != 0 {
		return assignment.Errorf(f, "must not have the set-uid, set-gid or sticky bit, found %s", octal(st.Mode))
	}
	if st.Nlink != 1 {
		return assignment.Errorf(f, "must have exactly one link, found %d (a hard link could alias a file outside the run)", st.Nlink)
	}
	if st.Size > max {
		return assignment.Errorf(f, "must hold at most %d bytes", max)
	}
	return nil
}

// checkFile checks one file materialization, a direct child of the
// materializations directory: owner-only regular file of the assignment
// owner, one link, within the scope's size bounds, matching its SHA-256
// and the scope's content rule. With keep non-nil the bytes are handed
// over; otherwise they are cleared.
func checkFile(matDir *os.File, m *assignment.Materialization, scope assignment.Scope, owner uint32, keep *[]byte) (Source, error) {
	f := field(m)
	fh, st, err := secfs.OpenChild(matDir, path.Base(m.SourcePath), unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return Source{}, assignment.Errorf(f, "%s", Describe(err))
	}
	defer fh.Close()
	_, max := assignment.FileSizeBounds(scope)
	if err := fileRules(&st, f, max); err != nil {
		return Source{}, err
	}
	if st.Uid != owner {
		return Source{}, assignment.Errorf(f, "is owned by uid %d, not by the assignment owner uid %d", st.Uid, owner)
	}
	data, err := secfs.ReadAllLimited(fh, max)
	if err != nil {
		return Source{}, assignment.Errorf(f, "cannot be read: %s", Describe(err))
	}
	sum := sha256.Sum256(data)
	want, _ := hex.DecodeString(m.SHA256)
	if subtle.ConstantTimeCompare(sum[:], want) != 1 {
		clear(data)
		return Source{}, assignment.Errorf(f, "does not match its sha256")
	}
	if err := assignment.CheckFileContent(scope, data); err != nil {
		clear(data)
		var ae *assignment.Error
		if errors.As(err, &ae) {
			return Source{}, assignment.Errorf(f, "content: %s", ae.Reason)
		}
		return Source{}, assignment.Errorf(f, "content is invalid")
	}
	if keep != nil {
		*keep = data
	} else {
		clear(data)
	}
	return Source{Field: m.Field, Path: m.SourcePath, Kind: "file", Dev: st.Dev, Ino: st.Ino, Birth: secfs.BirthTime(fh), Mode: st.Mode, UID: st.Uid}, nil
}

// checkRunSource checks a shared-directory or tool-endpoint source below
// the run directory: every directory between the run directory and the
// source has mode 0700 and the assignment owner; the source itself is
// owned by the assignment owner and is a directory of mode exactly 0755
// (shared-directory), a 0700 directory or an owner-only socket
// (tool-endpoint), or an owner-only socket (an endpoint linked to a
// request spool).
func checkRunSource(runFd *os.File, runDir string, m *assignment.Materialization, owner uint32) (Source, error) {
	f := field(m)
	comps := strings.Split(strings.TrimPrefix(m.SourcePath, runDir+"/"), "/")
	dir := runFd
	defer func() {
		if dir != runFd {
			dir.Close()
		}
	}()
	for i, c := range comps[:len(comps)-1] {
		next, st, err := secfs.OpenChild(dir, c, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return Source{}, assignment.Errorf(f, "intermediate directory %d below the run directory: %s", i+1, Describe(err))
		}
		if dir != runFd {
			dir.Close()
		}
		dir = next
		if r := privateDir(&st, owner); r != "" {
			return Source{}, assignment.Errorf(f, "intermediate directory %d below the run directory %s", i+1, r)
		}
	}
	leaf, st, err := secfs.OpenChild(dir, comps[len(comps)-1], unix.O_PATH)
	if err != nil {
		return Source{}, assignment.Errorf(f, "%s", Describe(err))
	}
	birth := secfs.BirthTime(leaf)
	leaf.Close()
	if st.Uid != owner {
		return Source{}, assignment.Errorf(f, "is owned by uid %d, not by the assignment owner uid %d", st.Uid, owner)
	}
	perm := st.Mode & 07777
	typ := st.Mode & unix.S_IFMT
	src := Source{Field: m.Field, Path: m.SourcePath, Dev: st.Dev, Ino: st.Ino, Birth: birth, Mode: st.Mode, UID: st.Uid}
	switch m.Kind {
	case assignment.SourceSharedDirectory:
		if typ != unix.S_IFDIR {
			return Source{}, assignment.Errorf(f, "a shared-directory source must be a directory, found %s", kindName(st.Mode))
		}
		if perm != 0o755 {
			return Source{}, assignment.Errorf(f, "a shared-directory source must have mode exactly 0755, found %s", octal(st.Mode))
		}
		src.Kind = "directory"
	case assignment.SourceEndpoint, assignment.SourceSocket:
		switch {
		case typ == unix.S_IFSOCK:
			if perm&0o077 != 0 || perm&0o600 != 0o600 || perm&07000 != 0 {
				return Source{}, assignment.Errorf(f, "a tool-endpoint socket must be owner-only (mode 0600 or 0700), found %s", octal(st.Mode))
			}
			src.Kind = "socket"
		case typ == unix.S_IFDIR && m.Kind == assignment.SourceEndpoint:
			if perm != 0o700 {
				return Source{}, assignment.Errorf(f, "a tool-endpoint directory must have mode 0700, found %s", octal(st.Mode))
			}
			src.Kind = "directory"
		case m.Kind == assignment.SourceSocket:
			return Source{}, assignment.Errorf(f, "an endpoint linked to a tool-request spool must be a Unix socket, found %s", kindName(st.Mode))
		default:
			return Source{}, assignment.Errorf(f, "a tool-endpoint source must be a directory or a Unix socket, found %s", kindName(st.Mode))
		}
	default:
		return Source{}, assignment.Errorf(f, "unexpected source kind")
	}
	return src, nil
}

// Describe turns an open error into a message without a path.
func Describe(err error) string {
	switch {
	case errors.Is(err, secfs.ErrSymlink):
		return "a symbolic link is on the path (no check follows one)"
	case errors.Is(err, secfs.ErrType):
		return "has an unexpected file type (a socket, device or non-directory on the path)"
	case errors.Is(err, fs.ErrNotExist):
		return "does not exist"
	case errors.Is(err, fs.ErrPermission):
		return "permission denied"
	case errors.Is(err, secfs.ErrUnsafe):
		return "is not a safe path"
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		return "cannot be opened: " + errno.Error()
	}
	return "cannot be opened"
}

func kindName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	}
	return "an unknown file type"
}

func octal(mode uint32) string { return fmt.Sprintf("%04o", mode&07777) }

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
