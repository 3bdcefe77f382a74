// Package warmtar is `jailbee _warm-extract`, run by the broker in a fresh
// fork as its agent user: it writes the tar stream of the orchestrator's
// warm paths (its git-ignored build outputs) into the fork's checkout.
//
// The stream is the orchestrator's, so hostile: on Incus root in the
// orchestrator's container can send any tar it likes, and anywhere it can
// swap a directory for a symlink between the broker's checks. GNU tar
// follows a symlink that already exists on a member's path, such as one
// committed in the fork's checkout: "lnk/.bashrc" with lnk -> /home/agent
// would write the fork's own start-up files. So the fork does not run
// tar: this helper opens every path component below the checkout without
// following a symlink (secfs), and takes only regular files, directories
// and symbolic links, and skips whatever is under a .git.
package warmtar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/secfs"
	"agentbox/internal/untrusted"
)

// Command is the hidden command's name.
const Command = "_warm-extract"

// Argv runs the helper; it reads the stream on its standard input and
// writes below its working directory.
func Argv() []string { return []string{"jailbee", Command} }

// IsHelperCommand reports whether arg names the helper.
func IsHelperCommand(arg string) bool { return arg == Command }

// MaxErrorBytes bounds what the broker reads of the helper's error.
const MaxErrorBytes = 1024

// HelperMain extracts standard input below the working directory. It
// prints the first refusal on standard error and exits 1.
func HelperMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: jailbee _warm-extract < TAR")
		return 2
	}
	fd, err := unix.Open(".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot open the checkout")
		return 1
	}
	root := os.NewFile(uintptr(fd), ".")
	defer root.Close()
	if err := Extract(root, os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Errors of Extract, each wrapped with the member's name.
var (
	ErrName    = errors.New("not a plain relative path")
	ErrGitDir  = errors.New("a .git path is not seeded")
	ErrType    = errors.New("only files, directories and symbolic links are seeded")
	ErrSymlink = errors.New("a symbolic link is on its path")
	ErrInWay   = errors.New("a directory is in the way")
	ErrSparse  = errors.New("a sparse file is not seeded")
)

// Extract writes the tar stream r below root. A member with a .git
// segment is skipped (build outputs hold git checkouts: a dependency's
// deps/x/.git), none is written; at any other member it refuses or cannot
// write it stops, and what it wrote before stays. Directories'
// modification times are set last, as tar does.
func Extract(root *os.File, r io.Reader) error {
	tr := tar.NewReader(r)
	var dirs []dirTime
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("the stream is not a tar archive: %w", err)
		}
		err = extractMember(root, h, tr, &dirs)
		if errors.Is(err, ErrGitDir) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%q: %w", untrusted.Printable(truncate(h.Name)), err)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		dirs[i].set(root) // best effort: a time is not worth failing for
	}
	return nil
}

// dirTime is a directory's time from the stream, set once it is full.
type dirTime struct {
	comps []string
	mtime time.Time
}

func (d dirTime) set(root *os.File) {
	parent, err := walk(root, d.comps[:len(d.comps)-1], false)
	if err != nil {
		return
	}
	defer closeUnlessRoot(parent, root)
	setTime(parent, d.comps[len(d.comps)-1], d.mtime)
}

func extractMember(root *os.File, h *tar.Header, body io.Reader, dirs *[]dirTime) error {
	comps, err := memberPath(h.Name)
	if err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
	default:
		return ErrType
	}
	for k := range h.PAXRecords {
		// A sparse file's holes are read as zeros: a few bytes of
		// stream could write terabytes.
		if strings.HasPrefix(k, "GNU.sparse.") {
			return ErrSparse
		}
	}
	parent, err := walk(root, comps[:len(comps)-1], true)
	if err != nil {
		return err
	}
	defer closeUnlessRoot(parent, root)
	name := comps[len(comps)-1]
	perm := uint32(h.Mode) & 0o777
	switch h.Typeflag {
	case tar.TypeDir:
		if err := mkdir(parent, name, perm|0o700); err != nil {
			return err
		}
		*dirs = append(*dirs, dirTime{comps: comps, mtime: h.ModTime})
		return nil
	case tar.TypeSymlink:
		if err := removeNonDir(parent, name); err != nil {
			return err
		}
		if err := unix.Symlinkat(h.Linkname, int(parent.Fd()), name); err != nil {
			return secfs.WithoutPath(err)
		}
	default:
		if err := removeNonDir(parent, name); err != nil {
			return err
		}
		// O_EXCL: the name was just cleared; a symlink put there since is
		// never followed.
		fd, err := unix.Openat(int(parent.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm|0o600)
		if err != nil {
			return secfs.WithoutPath(err)
		}
		f := os.NewFile(uintptr(fd), name)
		_, err = io.Copy(f, body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return secfs.WithoutPath(err)
		}
	}
	setTime(parent, name, h.ModTime)
	return nil
}

// memberPath splits a member's name ("./" and a trailing "/" allowed)
// into its components: relative, clean, no "..", no .git.
func memberPath(name string) ([]string, error) {
	name = strings.TrimSuffix(strings.TrimPrefix(name, "./"), "/")
	if name == "" || path.IsAbs(name) || path.Clean(name) != name || strings.IndexByte(name, 0) >= 0 {
		return nil, ErrName
	}
	comps := strings.Split(name, "/")
	for _, c := range comps {
		if c == ".." || c == "." {
			return nil, ErrName
		}
		if strings.EqualFold(c, ".git") {
			return nil, ErrGitDir
		}
	}
	return comps, nil
}

// walk opens the directories comps below root, none through a symlink,
// making the missing ones when create is set.
func walk(root *os.File, comps []string, create bool) (*os.File, error) {
	cur := root
	for _, c := range comps {
		next, _, err := secfs.OpenChild(cur, c, unix.O_PATH|unix.O_DIRECTORY)
		if errors.Is(err, os.ErrNotExist) && create {
			if err := mkdir(cur, c, 0o755); err != nil {
				closeUnlessRoot(cur, root)
				return nil, err
			}
			next, _, err = secfs.OpenChild(cur, c, unix.O_PATH|unix.O_DIRECTORY)
		}
		closeUnlessRoot(cur, root)
		if err != nil {
			return nil, openErr(err)
		}
		cur = next
	}
	return cur, nil
}

// mkdir makes name in dir, or checks that it is a directory already.
func mkdir(dir *os.File, name string, perm uint32) error {
	err := unix.Mkdirat(int(dir.Fd()), name, perm)
	if !errors.Is(err, unix.EEXIST) {
		return secfs.WithoutPath(err)
	}
	d, _, err := secfs.OpenChild(dir, name, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return openErr(err)
	}
	return d.Close()
}

// removeNonDir removes what name is in dir, unless it is a directory.
func removeNonDir(dir *os.File, name string) error {
	var st unix.Stat_t
	err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return secfs.WithoutPath(err)
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return ErrInWay
	}
	return secfs.WithoutPath(unix.Unlinkat(int(dir.Fd()), name, 0))
}

func setTime(dir *os.File, name string, mtime time.Time) {
	if mtime.IsZero() {
		return
	}
	ts := unix.NsecToTimespec(mtime.UnixNano())
	unix.UtimesNanoAt(int(dir.Fd()), name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

func openErr(err error) error {
	switch {
	case errors.Is(err, secfs.ErrSymlink):
		return ErrSymlink
	case errors.Is(err, secfs.ErrType):
		return fmt.Errorf("%w: not a directory", ErrInWay)
	}
	return secfs.WithoutPath(err)
}

func closeUnlessRoot(f, root *os.File) {
	if f != root {
		f.Close()
	}
}

// truncate keeps a refused member's name short in the error.
func truncate(name string) string {
	const max = 200
	if len(name) > max {
		return name[:max] + "..."
	}
	return name
}
