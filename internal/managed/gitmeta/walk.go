package gitmeta

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"agentbox/internal/secfs"
)

// MaxWalkDepth bounds how deep a scan goes below its root: a directory
// deeper down is reported as unreadable, not entered. A scan holds one
// descriptor per level.
const MaxWalkDepth = 256

// walkBatch is how many names a scan reads from a directory at once.
const walkBatch = 256

// walk visits root (as ".") and everything below it with its lstat,
// names relative to root, for a tree whose owner may change it while
// the walk runs (a consumer uid with a host process). The root's path
// is opened one component at a time without following a link; below it,
// each entry is stat-ed relative to its directory's handle without
// following a link, and only a directory is ever opened: through
// O_PATH|O_NOFOLLOW from its parent's handle, accepted only when it is
// still the directory stat-ed (same device and inode), then read on a
// handle of its own. So a link or FIFO swapped in is neither followed
// nor opened. What cannot be read (swapped, unreadable, deeper than
// MaxWalkDepth) goes to problem. A missing root has nothing. Names are
// read in batches: memory does not grow with a directory's size.
func walk(root string, visit func(rel string, st *unix.Stat_t), problem func(rel string)) {
	pf, _, err := secfs.OpenDirNoFollow(root, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		problem(".")
		return
	}
	d, st, err := readHandle(pf)
	pf.Close()
	if err != nil {
		problem(".")
		return
	}
	defer d.Close()
	visit(".", &st)
	walkDir(d, "", 0, visit, problem)
}

// readHandle reopens the directory an O_PATH handle holds for reading:
// the same inode, whatever its name points at by now.
func readHandle(pf *os.File) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := unix.Openat(int(pf.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, st, err
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, st, err
	}
	return os.NewFile(uintptr(fd), "."), st, nil
}

func walkDir(d *os.File, rel string, depth int, visit func(string, *unix.Stat_t), problem func(string)) {
	here := rel
	if here == "" {
		here = "."
	}
	for {
		// Readdirnames, not ReadDir: it never stats by path.
		names, err := d.Readdirnames(walkBatch)
		for _, name := range names {
			r := path.Join(rel, name)
			var st unix.Stat_t
			if err := unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if !errors.Is(err, unix.ENOENT) { // gone while walking: nothing to report
					problem(r)
				}
				continue
			}
			visit(r, &st)
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			if depth+1 > MaxWalkDepth {
				problem(r)
				continue
			}
			pf, pst, err := secfs.OpenChild(d, name, unix.O_PATH|unix.O_DIRECTORY)
			if err != nil {
				problem(r) // a link or another non-directory by now
				continue
			}
			sub, sst, err := readHandle(pf)
			pf.Close()
			if err != nil || pst.Dev != st.Dev || pst.Ino != st.Ino || sst.Ino != st.Ino {
				if sub != nil {
					sub.Close()
				}
				problem(r)
				continue
			}
			walkDir(sub, r, depth+1, visit, problem)
			sub.Close()
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			problem(here)
			return
		}
		if len(names) == 0 {
			return
		}
	}
}
