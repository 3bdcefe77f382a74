package secfs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox/internal/testutil/contain"
)

// nonRootEnv marks a test binary re-executed as nobody by
// TestRemoveTreeAsNonRoot.
const nonRootEnv = "SECFS_TEST_NONROOT"

const nobody = 65534

// fileState is what a removal must leave unchanged on a file outside the
// tree: ctime moves on any chmod, link or unlink of the inode.
type fileState struct {
	mode         fs.FileMode
	size         int64
	mtime, ctime int64
	data         string // file content or symlink target
}

func snapshot(t *testing.T, root string) map[string]fileState {
	t.Helper()
	m := map[string]fileState{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		s := fileState{mode: fi.Mode(), size: fi.Size(), mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			s.data, err = os.Readlink(p)
		case fi.Mode().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			s.data = string(b)
		}
		m[p] = s
		return err
	})
	must(t, err)
	return m
}

func checkUnchanged(t *testing.T, root string, before map[string]fileState) {
	t.Helper()
	if after := snapshot(t, root); !maps.Equal(before, after) {
		t.Errorf("outside the tree changed:\nbefore %v\nafter  %v", before, after)
	}
}

// makeOutside makes a directory beside the tree that a removal must not
// touch: files, a read-only directory and a 0500 directory a chmod-happy
// walk would "fix".
func makeOutside(t *testing.T, dir string) map[string]fileState {
	t.Helper()
	must(t, os.MkdirAll(filepath.Join(dir, "sub", "ro"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "file"), []byte("outside"), 0o640))
	must(t, os.WriteFile(filepath.Join(dir, "sub", "ro", "keep"), []byte("keep"), 0o400))
	must(t, os.Chmod(filepath.Join(dir, "sub", "ro"), 0o500))
	must(t, os.Chmod(filepath.Join(dir, "sub"), 0o555))
	must(t, os.Chmod(dir, 0o750))
	t.Cleanup(func() { os.Chmod(filepath.Join(dir, "sub"), 0o755); os.Chmod(filepath.Join(dir, "sub", "ro"), 0o755) })
	return snapshot(t, dir)
}

func checkGone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still there: %v", filepath.Base(path), err)
	}
}

func writeFile(t *testing.T, path, data string, perm fs.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(path), 0o700))
	must(t, os.WriteFile(path, []byte(data), perm))
}

func TestRemoveTreePlain(t *testing.T) {
	tree := filepath.Join(t.TempDir(), "tree")
	writeFile(t, filepath.Join(tree, "a", "b", "c", "file"), "x", 0o600)
	writeFile(t, filepath.Join(tree, "a", "top"), "y", 0o000)
	must(t, os.MkdirAll(filepath.Join(tree, "empty", "nested"), 0o700))
	must(t, os.Symlink("a/b", filepath.Join(tree, "inner-link")))
	must(t, os.Symlink("nowhere", filepath.Join(tree, "a", "dangling")))
	long := strings.Repeat("n", 255)
	writeFile(t, filepath.Join(tree, long, long), "z", 0o600)

	must(t, RemoveTree(tree))
	checkGone(t, tree)
	must(t, RemoveTree(tree)) // a missing path is not an error
}

func TestRemoveTreeRefusesRoot(t *testing.T) {
	if err := removeTreePath("/"); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("removeTreePath(/) = %v, want ErrUnsafe", err)
	}
}

func TestRemoveTreeBadPaths(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	before := makeOutside(t, outside)
	must(t, os.Symlink(outside, filepath.Join(base, "alias")))

	if err := RemoveTree(filepath.Join(base, "missing", "child")); err != nil {
		t.Errorf("missing parent: %v", err)
	}
	// "/" itself is refused by the same check (removeTreePath); it is
	// never handed to RemoveTree here, where a regression would be fatal.
	for _, p := range []string{"relative", "", base + "/", base + "/./x", base + "/../x"} {
		if err := RemoveTree(p); !errors.Is(err, ErrUnsafe) {
			t.Errorf("%q: %v, want ErrUnsafe", p, err)
		}
	}
	// The parent is opened without following symlinks too.
	if err := RemoveTree(filepath.Join(base, "alias", "sub")); !errors.Is(err, ErrUnsafe) {
		t.Errorf("symlink in the parent: %v, want ErrUnsafe", err)
	}
	checkUnchanged(t, outside, before)
}

// TestRemoveTreeSpecialFiles removes trees holding (or being) entries that
// must only ever be unlinked, and checks nothing outside changed.
func TestRemoveTreeSpecialFiles(t *testing.T) {
	cases := []struct {
		name  string
		build func(t *testing.T, tree, outside string) string // returns the path to remove
	}{
		{"fifo", func(t *testing.T, tree, _ string) string {
			must(t, os.MkdirAll(filepath.Join(tree, "d"), 0o700))
			must(t, unix.Mkfifo(filepath.Join(tree, "d", "fifo"), 0o600))
			return tree
		}},
		{"socket", func(t *testing.T, tree, _ string) string {
			must(t, os.MkdirAll(tree, 0o700))
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			must(t, err)
			defer unix.Close(fd)
			must(t, unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(tree, "sock")}))
			return tree
		}},
		{"symlink to outside dir", func(t *testing.T, tree, outside string) string {
			must(t, os.MkdirAll(filepath.Join(tree, "d"), 0o700))
			must(t, os.Symlink(outside, filepath.Join(tree, "d", "link")))
			must(t, os.Symlink(filepath.Join(outside, "sub", "ro"), filepath.Join(tree, "ro-link")))
			return tree
		}},
		{"symlink to outside file", func(t *testing.T, tree, outside string) string {
			must(t, os.MkdirAll(tree, 0o700))
			must(t, os.Symlink(filepath.Join(outside, "file"), filepath.Join(tree, "link")))
			return tree
		}},
		{"path is a symlink to a dir", func(t *testing.T, tree, outside string) string {
			must(t, os.Symlink(outside, tree))
			return tree
		}},
		{"path is a symlink to a file", func(t *testing.T, tree, outside string) string {
			must(t, os.Symlink(filepath.Join(outside, "file"), tree))
			return tree
		}},
		{"path is a fifo", func(t *testing.T, tree, _ string) string {
			must(t, unix.Mkfifo(tree, 0o600))
			return tree
		}},
		{"path is a file", func(t *testing.T, tree, _ string) string {
			writeFile(t, tree, "f", 0o400)
			return tree
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			before := makeOutside(t, outside)
			path := c.build(t, filepath.Join(base, "tree"), outside)
			must(t, RemoveTree(path))
			checkGone(t, path)
			checkUnchanged(t, outside, before)
		})
	}
}

// TestRemoveTreeHardLink unlinks a hard link to a file outside the tree;
// the file itself survives unchanged.
func TestRemoveTreeHardLink(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "outside-file")
	writeFile(t, target, "host data", 0o640)
	tree := filepath.Join(base, "tree")
	must(t, os.MkdirAll(filepath.Join(tree, "d"), 0o700))
	must(t, os.Link(target, filepath.Join(tree, "d", "hard")))
	before, err := os.Stat(target)
	must(t, err)

	must(t, RemoveTree(tree))
	checkGone(t, tree)
	after, err := os.Stat(target)
	must(t, err)
	data, err := os.ReadFile(target)
	must(t, err)
	if string(data) != "host data" || after.Mode() != before.Mode() || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("outside file changed: %q %v %v", data, after.Mode(), after.ModTime())
	}
	if n := after.Sys().(*syscall.Stat_t).Nlink; n != 1 {
		t.Errorf("nlink %d, want 1", n)
	}
}

// TestRemoveTreeReadOnlyDirs removes directories their owner cannot write,
// search or read. As root no permission is missing; re-executed as nobody
// by TestRemoveTreeAsNonRoot (or run by a non-root user) it takes the
// fchmod paths: fchmod on a readable directory's handle, fchmodat2 or
// /proc/self/fd on an O_PATH handle of an unreadable one.
func TestRemoveTreeReadOnlyDirs(t *testing.T) {
	if os.Getenv(nonRootEnv) != "" {
		if os.Geteuid() == 0 {
			t.Fatal("re-executed test still runs as root")
		}
		t.Logf("running as uid %d", os.Geteuid())
	}
	for _, procChmod := range []bool{false, true} {
		t.Run(fmt.Sprintf("procChmod=%v", procChmod), func(t *testing.T) {
			tree := filepath.Join(t.TempDir(), "tree")
			modes := map[string]fs.FileMode{
				"r-x": 0o500, "none": 0o000, "wx": 0o300, "x": 0o100, "rw": 0o600, "r-x/none": 0o000, "none/r-x": 0o500,
			}
			for d := range modes {
				writeFile(t, filepath.Join(tree, d, "file"), "x", 0o400)
			}
			// Deepest first, so the parents are still writable.
			for _, d := range []string{"r-x/none", "none/r-x", "r-x", "none", "wx", "x", "rw"} {
				must(t, os.Chmod(filepath.Join(tree, d), modes[d]))
			}
			must(t, os.Chmod(tree, 0o500))

			must(t, removeTree(tree, removeOpts{procChmod: procChmod}))
			checkGone(t, tree)
		})
	}
}

// TestRemoveTreeAsNonRoot re-executes the tests that depend on permissions
// as nobody, so the fchmod paths run even when the suite runs as root.
func TestRemoveTreeAsNonRoot(t *testing.T) {
	if os.Getenv(nonRootEnv) != "" {
		t.Skip("already re-executed")
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: the other tests already run as a non-root user")
	}
	// The test binary and a TMPDIR nobody can use.
	dir, err := os.MkdirTemp("", "secfs-nonroot-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o755))
	exe, err := os.Executable()
	must(t, err)
	bin := filepath.Join(dir, "secfs.test")
	copyFile(t, exe, bin, 0o755)
	tmp := filepath.Join(dir, "tmp")
	must(t, os.Mkdir(tmp, 0o700))
	must(t, os.Chown(tmp, nobody, nobody))

	cmd := exec.Command(bin, "-test.run=^(TestRemoveTreeReadOnlyDirs|TestRemoveTreePlain|TestRemoveTreeSpecialFiles|TestRemoveTreeHardLink|TestRemoveTreeTypeChanges)$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), nonRootEnv+"=1", "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte(fmt.Sprintf("running as uid %d", nobody))) || !bytes.Contains(out, []byte("--- PASS: TestRemoveTreeReadOnlyDirs")) {
		t.Fatalf("as nobody: the read-only test did not run:\n%s", out)
	}
}

func copyFile(t *testing.T, from, to string, perm fs.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	must(t, err)
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	must(t, err)
	_, err = io.Copy(dst, src)
	must(t, err)
	must(t, dst.Close())
}

// TestRemoveTreeTypeChanges swaps entries the walk has already listed:
// directories for symlinks to an outside directory, files for directories.
// The symlinks must be unlinked, never opened; the directories emptied.
func TestRemoveTreeTypeChanges(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	before := makeOutside(t, outside)
	tree := filepath.Join(base, "tree")
	const n = 40
	for i := range n {
		writeFile(t, filepath.Join(tree, fmt.Sprintf("d%02d", i), "file"), "x", 0o600)
		writeFile(t, filepath.Join(tree, fmt.Sprintf("f%02d", i)), "x", 0o600)
	}
	swapped := false
	onOpen := func(held int) {
		// held 3: the parent, the tree root and its first subdirectory.
		// The root's whole listing is in one batch by now.
		if swapped || held < 3 {
			return
		}
		swapped = true
		for i := range n {
			d, f := filepath.Join(tree, fmt.Sprintf("d%02d", i)), filepath.Join(tree, fmt.Sprintf("f%02d", i))
			must(t, os.Rename(d, filepath.Join(tree, fmt.Sprintf(".moved%02d", i))))
			must(t, os.Symlink(outside, d))
			if os.Remove(f) == nil {
				writeFile(t, filepath.Join(f, "inner"), "y", 0o600)
			}
		}
	}
	must(t, removeTree(tree, removeOpts{onOpen: onOpen}))
	if !swapped {
		t.Fatal("no swap happened")
	}
	checkGone(t, tree)
	checkUnchanged(t, outside, before)
}

// fdWatch checks, at every open RemoveTree makes, both its own count of
// descriptors and the process's (/proc/self/fd) against removeMaxFds.
type fdWatch struct {
	t                   *testing.T
	base                int
	opens, held, growth int
}

func newFdWatch(t *testing.T) *fdWatch { return &fdWatch{t: t, base: countFds(t)} }

func (w *fdWatch) onOpen(held int) {
	w.opens++
	w.held = max(w.held, held)
	w.growth = max(w.growth, countFds(w.t)-w.base)
}

func (w *fdWatch) check() {
	w.t.Helper()
	w.t.Logf("%d opens, at most %d descriptors held, process grew by at most %d", w.opens, w.held, w.growth)
	if w.held > removeMaxFds || w.growth > removeMaxFds {
		w.t.Errorf("held %d, process grew by %d descriptors; bound %d", w.held, w.growth, removeMaxFds)
	}
	if w.growth < 1 {
		w.t.Error("descriptor count never observed")
	}
}

func countFds(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestRemoveTreeDeepChain removes a chain deeper than PATH_MAX allows to
// name, with descriptors bounded: the walk must close shallow directories
// and climb back through verified "..".
func TestRemoveTreeDeepChain(t *testing.T) {
	const depth = 10_000
	tree := filepath.Join(t.TempDir(), "tree")
	makeChain(t, tree, depth)

	w := newFdWatch(t)
	must(t, removeTree(tree, removeOpts{onOpen: w.onOpen}))
	checkGone(t, tree)
	w.check()
	if w.held < removeMaxOpenDirs {
		t.Errorf("at most %d descriptors held: the window was never full", w.held)
	}
	if w.opens <= depth+1 {
		t.Errorf("%d opens for %d directories: no directory was reopened through \"..\"", w.opens, depth+1)
	}
}

// makeChain makes tree/d/d/... depth levels deep through handles, as
// the paths would pass PATH_MAX, with a file every 1000 levels.
func makeChain(t *testing.T, tree string, depth int) {
	t.Helper()
	must(t, os.Mkdir(tree, 0o700))
	fd, err := unix.Open(tree, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	for i := range depth {
		if i%1000 == 0 {
			f, err := unix.Openat(fd, "file", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
			must(t, err)
			unix.Close(f)
		}
		must(t, unix.Mkdirat(fd, "d", 0o700))
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		must(t, err)
		unix.Close(fd)
		fd = next
	}
	unix.Close(fd)
}

// TestRemoveTreeMovedAncestor moves a directory whose handle the walk has
// closed out of the tree while the walk is below it. Climbing back, the
// walk must find the wrong inode at ".." and stop with ErrUnsafe rather
// than empty the directory the moved one now sits in.
func TestRemoveTreeMovedAncestor(t *testing.T) {
	const depth, moved = 100, 10 // level 10 is far above the open window at the bottom
	base := t.TempDir()
	tree := filepath.Join(base, "tree")
	makeChain(t, tree, depth)
	// Deep below base: a walk that wrongly follows ".." from the moved
	// directory climbs through these levels and stays inside base.
	elsewhere := filepath.Join(base, strings.Repeat("x/", 12)+"elsewhere")
	writeFile(t, filepath.Join(elsewhere, "keep"), "keep", 0o600)

	var before map[string]fileState
	opens := 0
	onOpen := func(int) {
		if opens++; opens != depth+1 { // the deepest directory was just opened
			return
		}
		must(t, os.Rename(tree+strings.Repeat("/d", moved), filepath.Join(elsewhere, "moved")))
		before = snapshot(t, filepath.Join(elsewhere, "keep"))
		before[elsewhere] = snapshot(t, elsewhere)[elsewhere]
	}
	err := removeTree(tree, removeOpts{onOpen: onOpen})
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), `".."`) {
		t.Fatalf("err = %v, want ErrUnsafe about \"..\"", err)
	}
	after := snapshot(t, filepath.Join(elsewhere, "keep"))
	after[elsewhere] = snapshot(t, elsewhere)[elsewhere]
	if !maps.Equal(before, after) {
		t.Errorf("the directory the moved one sits in changed:\nbefore %v\nafter  %v", before, after)
	}
}

// TestRemoveTreeRefilled ends, with an error, against a sandbox that
// never stops writing: each directory opened makes another appear.
func TestRemoveTreeRefilled(t *testing.T) {
	tree := filepath.Join(t.TempDir(), "tree")
	must(t, os.MkdirAll(filepath.Join(tree, "s0"), 0o700))
	n := 0
	onOpen := func(held int) {
		if held == 3 {
			n++
			must(t, os.Mkdir(filepath.Join(tree, fmt.Sprintf("s%d", n)), 0o700))
		}
	}
	err := removeTree(tree, removeOpts{onOpen: onOpen})
	if err == nil || !strings.Contains(err.Error(), "keeps changing") {
		t.Fatalf("err = %v, want a directory that keeps changing", err)
	}
}

// TestRemoveTreeWideDir removes a directory of 100,000 entries (some of
// them non-empty directories) reading it in bounded batches.
func TestRemoveTreeWideDir(t *testing.T) {
	const entries = 100_000
	tree := filepath.Join(t.TempDir(), "tree")
	must(t, os.Mkdir(tree, 0o700))
	fd, err := unix.Open(tree, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(fd)
	for i := range entries {
		name := fmt.Sprintf("e%06d", i)
		if i%97 == 0 {
			name += strings.Repeat("-", 200) // fewer entries per batch
		}
		if i%1000 == 0 {
			must(t, unix.Mkdirat(fd, name, 0o700))
			writeFile(t, filepath.Join(tree, name, "sub", "file"), "x", 0o600)
			continue
		}
		f, err := unix.Openat(fd, name, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
		must(t, err)
		unix.Close(f)
	}

	w := newFdWatch(t)
	must(t, removeTree(tree, removeOpts{onOpen: w.onOpen}))
	checkGone(t, tree)
	w.check()
}

// TestRemoveTreeSwapAttack races RemoveTree against a sandbox that keeps
// replacing a directory being removed with a symlink to a directory
// outside the tree, and back. Nothing outside may change, whatever the
// walk returns; once the attack stops, a second call removes the rest.
func TestRemoveTreeSwapAttack(t *testing.T) {
	iterations := 200
	if testing.Short() {
		iterations = 20
	}
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	before := makeOutside(t, outside)
	failures := 0
	for i := range iterations {
		tree := filepath.Join(base, fmt.Sprintf("tree%d", i))
		victim := filepath.Join(tree, "a", "victim")
		for j := range 20 {
			writeFile(t, filepath.Join(victim, fmt.Sprintf("f%02d", j)), "x", 0o600)
			writeFile(t, filepath.Join(victim, "sub", fmt.Sprintf("g%02d", j)), "x", 0o600)
		}
		writeFile(t, filepath.Join(victim, "ro", "file"), "x", 0o600)
		must(t, os.Chmod(filepath.Join(victim, "ro"), 0o500))
		writeFile(t, filepath.Join(tree, "a", "other"), "x", 0o600)
		writeFile(t, filepath.Join(tree, "b", "file"), "x", 0o600)

		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			away := filepath.Join(tree, "a", ".away")
			for {
				select {
				case <-stop:
					return
				default:
				}
				os.Rename(victim, away)
				os.Symlink(outside, victim)
				runtime.Gosched()
				os.Remove(victim)
				os.Rename(away, victim)
			}
		}()
		err := RemoveTree(tree)
		close(stop)
		<-done
		if err != nil {
			failures++
			t.Logf("iteration %d under attack: %v", i, err)
		}
		checkUnchanged(t, outside, before)
		if t.Failed() {
			t.Fatalf("iteration %d changed the outside directory", i)
		}
		must(t, RemoveTree(tree))
		checkGone(t, tree)
	}
	t.Logf("%d of %d removals under attack returned an error", failures, iterations)
}

// TestRemoveTreeMountPoint refuses to enter a mount inside the tree, a
// tmpfs (another device) or a bind mount (same device, another mount).
func TestRemoveTreeMountPoint(t *testing.T) {
	for _, kind := range []string{"tmpfs", "bind"} {
		t.Run(kind, func(t *testing.T) {
			base := t.TempDir()
			tree := filepath.Join(base, "tree")
			mnt := filepath.Join(tree, "a", "mnt")
			must(t, os.MkdirAll(mnt, 0o700))
			writeFile(t, filepath.Join(tree, "a", "file"), "x", 0o600)
			src := filepath.Join(base, "outside")
			var err error
			if kind == "tmpfs" {
				err = unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m,mode=0755")
			} else {
				must(t, os.Mkdir(src, 0o755))
				err = unix.Mount(src, mnt, "", unix.MS_BIND, "")
			}
			if err != nil {
				t.Skipf("cannot mount here: %v", err)
			}
			t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
			if kind == "bind" {
				f, err := os.Open(mnt)
				must(t, err)
				id := mountID(int(f.Fd()))
				f.Close()
				if id == 0 {
					t.Skip("kernel reports no mount IDs")
				}
			}
			writeFile(t, filepath.Join(mnt, "keep", "file"), "mounted", 0o644)
			must(t, os.Chmod(filepath.Join(mnt, "keep"), 0o500))
			before := snapshot(t, mnt)

			if err := RemoveTree(tree); !errors.Is(err, ErrUnsafe) {
				t.Fatalf("err = %v, want ErrUnsafe", err)
			}
			checkUnchanged(t, mnt, before)
			must(t, os.Chmod(filepath.Join(mnt, "keep"), 0o700))
		})
	}
}

// TestRemoveTreeBtrfsSubvolume: on btrfs any user may create a subvolume
// in a directory it can write (and rmdir it once empty); a subvolume has
// its own st_dev but stays on its parent's mount. A sandbox that makes one
// in its home must not make its tree impossible to remove, while a real
// mount below the subvolume is still refused.
func TestRemoveTreeBtrfsSubvolume(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a btrfs image")
	}
	mkfs, err := exec.LookPath("mkfs.btrfs")
	if err != nil {
		t.Skip("no mkfs.btrfs")
	}
	btrfs, err := exec.LookPath("btrfs")
	if err != nil {
		t.Skip("no btrfs tool")
	}
	base := t.TempDir()
	// nobody must reach the tree: t.TempDir's directories are 0700.
	must(t, os.Chmod(filepath.Dir(base), 0o755))
	must(t, os.Chmod(base, 0o755))
	img, mnt := filepath.Join(base, "img"), filepath.Join(base, "mnt")
	must(t, os.WriteFile(img, nil, 0o600))
	must(t, os.Truncate(img, 128<<20))
	if out, err := exec.Command(mkfs, "-q", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs.btrfs: %v: %s", err, out)
	}
	must(t, os.Mkdir(mnt, 0o755))
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a btrfs image here: %v: %s", err, out)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	tree := filepath.Join(mnt, "tree")
	must(t, os.Mkdir(tree, 0o755))
	must(t, os.Chown(tree, nobody, nobody))
	// The sandbox's uid makes the subvolume: no privilege needed.
	asNobody := func(args ...string) error {
		cmd := exec.Command(btrfs, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := asNobody("subvolume", "create", filepath.Join(tree, "sv")); err != nil {
		t.Skipf("nobody cannot create a subvolume: %v", err)
	}
	writeFile(t, filepath.Join(tree, "sv", "a", "file"), "x", 0o600)
	must(t, os.Chown(filepath.Join(tree, "sv", "a"), nobody, nobody))
	must(t, os.Chown(filepath.Join(tree, "sv", "a", "file"), nobody, nobody))
	// A read-only snapshot of its own subvolume, also unprivileged: not
	// even root can unlink what is in it while it stays read-only.
	if err := asNobody("subvolume", "snapshot", "-r", filepath.Join(tree, "sv"), filepath.Join(tree, "ro")); err != nil {
		t.Fatalf("nobody cannot snapshot its subvolume: %v", err)
	}

	// A bind mount below the subvolume is still another mount.
	src := filepath.Join(base, "outside")
	must(t, os.Mkdir(src, 0o755))
	writeFile(t, filepath.Join(src, "keep"), "mounted", 0o644)
	point := filepath.Join(tree, "sv", "a", "mnt")
	must(t, os.Mkdir(point, 0o755))
	must(t, unix.Mount(src, point, "", unix.MS_BIND, ""))
	f, err := os.Open(point)
	must(t, err)
	id := mountID(int(f.Fd()))
	f.Close()
	if id == 0 {
		unix.Unmount(point, unix.MNT_DETACH)
		t.Skip("kernel reports no mount IDs")
	}
	before := snapshot(t, src)
	if err := RemoveTree(tree); !errors.Is(err, ErrUnsafe) {
		t.Errorf("with a mount in the subvolume: err = %v, want ErrUnsafe", err)
	}
	checkUnchanged(t, src, before)
	must(t, unix.Unmount(point, unix.MNT_DETACH))

	if err := RemoveTree(tree); err != nil {
		t.Fatalf("RemoveTree with a subvolume inside: %v", err)
	}
	checkGone(t, tree)
}

func TestRemoveTreeErrorTruncatesNames(t *testing.T) {
	r := &remover{}
	err := r.fail("remove", strings.Repeat("x", 255), unix.EPERM)
	if len(err.Error()) > 150 || !errors.Is(err, unix.EPERM) {
		t.Errorf("error %q (%d bytes)", err, len(err.Error()))
	}
}

// appendDirent encodes a linux_dirent64 record as getdents would.
func appendDirent(buf []byte, ino uint64, typ uint8, name string) []byte {
	reclen := (direntHeader + len(name) + 1 + 7) &^ 7
	rec := make([]byte, reclen)
	binary.NativeEndian.PutUint64(rec[0:8], ino)
	binary.NativeEndian.PutUint64(rec[8:16], uint64(len(buf)+reclen))
	binary.NativeEndian.PutUint16(rec[16:18], uint16(reclen))
	rec[18] = typ
	copy(rec[direntHeader:], name)
	return append(buf, rec...)
}

func TestParseDirentMatchesKernel(t *testing.T) {
	dir := t.TempDir()
	want := map[string]uint8{"file": unix.DT_REG, "dir": unix.DT_DIR, "link": unix.DT_LNK}
	must(t, os.WriteFile(filepath.Join(dir, "file"), nil, 0o600))
	must(t, os.Mkdir(filepath.Join(dir, "dir"), 0o700))
	must(t, os.Symlink("dir", filepath.Join(dir, "link")))
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(fd)
	buf := make([]byte, removeBatchBytes)
	n, err := unix.Getdents(fd, buf)
	must(t, err)
	got := map[string]uint8{}
	for b := buf[:n]; len(b) > 0; {
		d, ok := parseDirent(b)
		if !ok {
			t.Fatalf("kernel record rejected: %x", b)
		}
		if d.name != "." && d.name != ".." {
			got[d.name] = d.typ
		}
		b = b[d.reclen:]
	}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func FuzzParseDirent(f *testing.F) {
	f.Add(appendDirent(nil, 1, unix.DT_REG, "file"))
	f.Add(appendDirent(appendDirent(nil, 2, unix.DT_DIR, "."), 3, unix.DT_DIR, ".."))
	f.Add(appendDirent(nil, 4, unix.DT_LNK, strings.Repeat("n", 255)))
	f.Add([]byte{})
	f.Add(make([]byte, direntHeader+1))
	f.Fuzz(func(t *testing.T, buf []byte) {
		d, ok := parseDirent(buf)
		if !ok {
			return
		}
		if d.reclen <= direntHeader || d.reclen > len(buf) || d.name == "" ||
			len(d.name) >= d.reclen-direntHeader+1 || strings.ContainsAny(d.name, "/\x00") {
			t.Fatalf("accepted a bad record: %+v from %x", d, buf)
		}
		// What parses re-encodes to a record that parses the same way.
		again, ok := parseDirent(appendDirent(nil, d.ino, d.typ, d.name))
		if !ok || again.name != d.name || again.ino != d.ino || again.typ != d.typ {
			t.Fatalf("round trip: %+v -> %+v", d, again)
		}
	})
}

// TestMain runs the package's tests, which attack paths with symlinks and
// moves, in a mount namespace where only the scratch dir is writable: a
// regression fails a test instead of deleting the host's files.
func TestMain(m *testing.M) { contain.Main(m, nil, nil) }
