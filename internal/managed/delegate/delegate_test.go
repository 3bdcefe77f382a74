package delegate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	consumerUID = 1000
	consumerGID = 1000
	strangerID  = 4242 // uid and gid: neither owner nor in the consumer group
	peerUID     = 4343 // another member of the consumer group
)

// wantACL is the default ACL every delegated directory must carry, spelled
// out rather than taken from ConsumerACL.
var wantACL = []Entry{
	{TagUserObj, 7, UndefinedID},
	{TagGroupObj, 7, UndefinedID},
	{TagGroup, 7, consumerGID},
	{TagMask, 7, UndefinedID},
	{TagOther, 0, UndefinedID},
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: re-owns files to other uids")
	}
}

// newBase returns an empty directory that any uid can reach, for helper
// processes running with other credentials. t.TempDir's parent is 0700.
func newBase(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	must(t, os.Chmod(filepath.Dir(base), 0o755))
	must(t, os.Chmod(base, 0o755))
	if out, err := runAs(strangerID, strangerID, base, "true"); err != nil {
		t.Fatalf("temp dir not reachable by uid %d (set TMPDIR): %v %s", strangerID, err, out)
	}
	return base
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// mk creates rel below dir with exactly mode (type and permission bits,
// setuid/setgid included, whatever the umask).
func mk(t *testing.T, dir, rel string, mode uint32) {
	t.Helper()
	p := filepath.Join(dir, rel)
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		must(t, unix.Mkdir(p, 0o700))
	case unix.S_IFREG:
		must(t, os.WriteFile(p, []byte(rel+"\n"), 0o600))
	default: // FIFO, socket
		must(t, unix.Mknod(p, mode&unix.S_IFMT|0o600, 0))
	}
	must(t, unix.Chmod(p, mode&0o7777))
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return st
}

// snapshot lstats every entry below root (root included) by relative path;
// WalkDir does not follow symlinks.
func snapshot(t *testing.T, root string) map[string]unix.Stat_t {
	t.Helper()
	m := map[string]unix.Stat_t{}
	must(t, filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		m[rel] = lstat(t, p)
		return err
	}))
	return m
}

func defaultACLOf(t *testing.T, dir string) []Entry {
	t.Helper()
	f, err := os.Open(dir)
	must(t, err)
	defer f.Close()
	entries, err := DefaultACL(int(f.Fd()))
	must(t, err)
	return entries
}

func runAs(uid, gid int, dir, script string) (string, error) {
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
		Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{},
	}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// checkErr fails unless err is an error mentioning want and no host path.
func checkErr(t *testing.T, err error, base, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %s", want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not mention %s", err, want)
	}
	if strings.Contains(err.Error(), base) || strings.Contains(err.Error(), os.TempDir()) {
		t.Errorf("error %q contains a host path", err)
	}
}

func checkOwner(t *testing.T, p string, uid, gid int) {
	t.Helper()
	if st := lstat(t, p); int(st.Uid) != uid || int(st.Gid) != gid {
		t.Errorf("%s owned by %d:%d, want %d:%d", filepath.Base(p), st.Uid, st.Gid, uid, gid)
	}
}

func TestTree(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(newBase(t), "tree")
	for _, e := range []struct {
		rel  string
		mode uint32
	}{
		{".", unix.S_IFDIR | 0o755},
		{"pub", unix.S_IFDIR | 0o755},
		{"pub/readme", unix.S_IFREG | 0o644},
		{"private", unix.S_IFDIR | 0o700},
		{"private/secret", unix.S_IFREG | 0o600},
		{"private/deep", unix.S_IFDIR | 0o750},
		{"private/deep/notes", unix.S_IFREG | 0o640},
		{"tool.sh", unix.S_IFREG | 0o755},
		{"setuid", unix.S_IFREG | 0o4755}, // chown clears these two
		{"setgid", unix.S_IFREG | 0o2755},
		{"sgiddir", unix.S_IFDIR | 0o2775},
		{"empty", unix.S_IFDIR | 0o555},
		{"fifo", unix.S_IFIFO | 0o640},
		{"sock", unix.S_IFSOCK | 0o755},
	} {
		mk(t, root, e.rel, e.mode)
	}
	must(t, os.Symlink("pub/readme", filepath.Join(root, "pub-link")))
	before := snapshot(t, root)

	must(t, Tree(root, consumerUID, consumerGID))

	after := snapshot(t, root)
	if len(after) != len(before) {
		t.Fatalf("entries changed: %d before, %d after", len(before), len(after))
	}
	var dirs []string
	for rel, was := range before {
		st := after[rel]
		if st.Uid != consumerUID || st.Gid != consumerGID {
			t.Errorf("%s owned by %d:%d, want %d:%d", rel, st.Uid, st.Gid, consumerUID, consumerGID)
		}
		if st.Mode != was.Mode {
			t.Errorf("%s mode %o, was %o", rel, st.Mode, was.Mode)
		}
		p := filepath.Join(root, rel)
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			// The access ACL stays as it was: none.
			if _, err := unix.Lgetxattr(p, "system.posix_acl_access", nil); !errors.Is(err, unix.ENODATA) {
				t.Errorf("%s: access ACL present or unreadable: %v", rel, err)
			}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		dirs = append(dirs, rel)
		if got := defaultACLOf(t, p); !reflect.DeepEqual(got, wantACL) {
			t.Errorf("%s default ACL %v, want %v", rel, got, wantACL)
		}
	}

	t.Run("getfacl", func(t *testing.T) {
		if _, err := exec.LookPath("getfacl"); err != nil {
			t.Skip("getfacl not installed (Debian package acl)")
		}
		for _, rel := range dirs {
			out, err := exec.Command("getfacl", "-p", "-n", "--omit-header", filepath.Join(root, rel)).CombinedOutput()
			if err != nil {
				t.Fatalf("getfacl %s: %v %s", rel, err, out)
			}
			m := after[rel].Mode
			want := fmt.Sprintf("user::%s\ngroup::%s\nother::%s\n", rwx(m>>6), rwx(m>>3), rwx(m)) +
				"default:user::rwx\ndefault:group::rwx\ndefault:group:1000:rwx\ndefault:mask::rwx\ndefault:other::---\n\n"
			if string(out) != want {
				t.Errorf("getfacl %s:\n%s\nwant:\n%s", rel, out, want)
			}
		}
	})
}

func rwx(m uint32) string {
	b := []byte("---")
	for i, c := range "rwx" {
		if m&(4>>i) != 0 {
			b[i] = byte(c)
		}
	}
	return string(b)
}

// TestTreeInheritance checks what the consumer and others can do with what
// is created after delegation, below a directory that was world-readable.
func TestTreeInheritance(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(newBase(t), "tree")
	mk(t, root, ".", unix.S_IFDIR|0o755)
	mk(t, root, "pub", unix.S_IFDIR|0o755)
	mk(t, root, "pub/existing.txt", unix.S_IFREG|0o644)

	must(t, Tree(root, consumerUID, consumerGID))

	if out, err := runAs(consumerUID, consumerGID, root,
		"umask 022 && mkdir pub/newdir && echo x > pub/new.txt && echo y > pub/newdir/inner.txt && echo more >> pub/existing.txt"); err != nil {
		t.Fatalf("consumer: %v %s", err, out)
	}
	// Without the default ACL, umask 022 would give 0644 and 0755.
	for _, rel := range []string{"pub/new.txt", "pub/newdir/inner.txt", "pub/newdir"} {
		p := filepath.Join(root, rel)
		st := lstat(t, p)
		checkOwner(t, p, consumerUID, consumerGID)
		if st.Mode&0o007 != 0 {
			t.Errorf("%s mode %o gives others access", rel, st.Mode&0o777)
		}
		if st.Mode&0o060 != 0o060 {
			t.Errorf("%s mode %o: group lacks rw", rel, st.Mode&0o777)
		}
	}
	if got := defaultACLOf(t, filepath.Join(root, "pub/newdir")); !reflect.DeepEqual(got, wantACL) {
		t.Errorf("new directory default ACL %v, want %v", got, wantACL)
	}
	data, err := os.ReadFile(filepath.Join(root, "pub/existing.txt"))
	must(t, err)
	if string(data) != "pub/existing.txt\nmore\n" {
		t.Errorf("existing.txt = %q: consumer's append missing", data)
	}
	if st := lstat(t, filepath.Join(root, "pub/existing.txt")); st.Mode&0o7777 != 0o644 {
		t.Errorf("existing.txt mode %o, want 0644", st.Mode&0o7777)
	}

	// The runtime (root) adds a file later: the consumer group can write it.
	if out, err := runAs(0, 0, root, "umask 022 && echo r > pub/runtime.txt"); err != nil {
		t.Fatalf("runtime: %v %s", err, out)
	}

	tests := []struct {
		name     string
		uid, gid int
		script   string
		ok       bool
	}{
		{"stranger reads pre-existing 0644 file", strangerID, strangerID, "cat pub/existing.txt", true},
		{"stranger reads new file", strangerID, strangerID, "cat pub/new.txt", false},
		{"stranger reads runtime's new file", strangerID, strangerID, "cat pub/runtime.txt", false},
		{"stranger lists new dir", strangerID, strangerID, "ls pub/newdir", false},
		{"stranger writes existing file", strangerID, strangerID, "echo s >> pub/existing.txt", false},
		{"group peer reads and writes new file", peerUID, consumerGID, "cat pub/new.txt && echo p >> pub/new.txt", true},
		{"group peer creates in new dir", peerUID, consumerGID, "umask 077 && echo p > pub/newdir/peer.txt", true},
		{"consumer writes runtime's new file", consumerUID, consumerGID, "echo c >> pub/runtime.txt", true},
		{"consumer reads group peer's umask 077 file", consumerUID, consumerGID, "cat pub/newdir/peer.txt", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runAs(tt.uid, tt.gid, root, tt.script)
			if (err == nil) != tt.ok {
				t.Errorf("uid %d gid %d %q: err %v (%s), want ok=%v", tt.uid, tt.gid, tt.script, err, strings.TrimSpace(out), tt.ok)
			}
		})
	}
}

func TestTreeSymlinks(t *testing.T) {
	requireRoot(t)
	base := newBase(t)
	root := filepath.Join(base, "tree")
	mk(t, root, ".", unix.S_IFDIR|0o755)
	mk(t, base, "outside.txt", unix.S_IFREG|0o644)
	mk(t, base, "outside-dir", unix.S_IFDIR|0o755)
	mk(t, base, "outside-dir/inner", unix.S_IFREG|0o644)
	must(t, os.Symlink(filepath.Join(base, "outside.txt"), filepath.Join(root, "file-link")))
	must(t, os.Symlink("../outside-dir", filepath.Join(root, "dir-link")))

	must(t, Tree(root, consumerUID, consumerGID))

	checkOwner(t, filepath.Join(root, "file-link"), consumerUID, consumerGID)
	checkOwner(t, filepath.Join(root, "dir-link"), consumerUID, consumerGID)
	for _, rel := range []string{"outside.txt", "outside-dir", "outside-dir/inner"} {
		checkOwner(t, filepath.Join(base, rel), 0, 0)
	}
	if st := lstat(t, filepath.Join(base, "outside.txt")); st.Mode&0o7777 != 0o644 {
		t.Errorf("outside.txt mode %o, want 0644", st.Mode&0o7777)
	}
	if got := defaultACLOf(t, filepath.Join(base, "outside-dir")); got != nil {
		t.Errorf("symlinked directory descended: default ACL %v", got)
	}
}

func TestTreeRefusesRoot(t *testing.T) {
	requireRoot(t)
	base := newBase(t)
	mk(t, base, "dir", unix.S_IFDIR|0o755)
	mk(t, base, "file", unix.S_IFREG|0o644)
	must(t, os.Symlink("dir", filepath.Join(base, "link")))
	tests := []struct {
		name, root string
		uid, gid   int
		want       string
	}{
		{"symlink root", "link", consumerUID, consumerGID, "symbolic link"},
		{"file root", "file", consumerUID, consumerGID, "not a directory"},
		{"missing root", "missing", consumerUID, consumerGID, "no such file"},
		{"root uid", "dir", 0, consumerGID, "non-root"},
		{"root gid", "dir", consumerUID, 0, "non-root"},
		{"unchanged uid", "dir", -1, consumerGID, "non-root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, Tree(filepath.Join(base, tt.root), tt.uid, tt.gid), base, tt.want)
			for _, rel := range []string{"dir", "file", "link"} {
				checkOwner(t, filepath.Join(base, rel), 0, 0)
			}
			if got := defaultACLOf(t, filepath.Join(base, "dir")); got != nil {
				t.Errorf("dir got default ACL %v", got)
			}
		})
	}
}

// gitDir builds a small .git-like directory and returns its path.
func gitDir(t *testing.T) (base, git string) {
	t.Helper()
	base = newBase(t)
	git = filepath.Join(base, ".git")
	for _, e := range []struct {
		rel  string
		mode uint32
	}{
		{".", unix.S_IFDIR | 0o755},
		{"HEAD", unix.S_IFREG | 0o644},
		{"config", unix.S_IFREG | 0o644},
		{"hooks", unix.S_IFDIR | 0o755},
		{"hooks/pre-commit", unix.S_IFREG | 0o755},
		{"objects", unix.S_IFDIR | 0o755},
		{"objects/ab", unix.S_IFDIR | 0o755},
		{"objects/ab/cdef", unix.S_IFREG | 0o444},
		{"refs", unix.S_IFDIR | 0o755},
		{"refs/heads", unix.S_IFDIR | 0o755},
		{"refs/heads/main", unix.S_IFREG | 0o644},
		{"logs", unix.S_IFDIR | 0o755},
		{"logs/HEAD", unix.S_IFREG | 0o644},
	} {
		mk(t, git, e.rel, e.mode)
	}
	return base, git
}

func TestSubtrees(t *testing.T) {
	requireRoot(t)
	_, git := gitDir(t)
	before := snapshot(t, git)

	must(t, Subtrees(git, []string{"objects", "refs", "logs"}, consumerUID, consumerGID))

	after := snapshot(t, git)
	for rel, st := range after {
		delegated := strings.HasPrefix(rel, "objects") || strings.HasPrefix(rel, "refs") || strings.HasPrefix(rel, "logs")
		uid, gid := 0, 0
		if delegated {
			uid, gid = consumerUID, consumerGID
		}
		if int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("%s owned by %d:%d, want %d:%d", rel, st.Uid, st.Gid, uid, gid)
		}
		if st.Mode != before[rel].Mode {
			t.Errorf("%s mode %o, was %o", rel, st.Mode, before[rel].Mode)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		var want []Entry
		if delegated {
			want = wantACL
		}
		if got := defaultACLOf(t, filepath.Join(git, rel)); !reflect.DeepEqual(got, want) {
			t.Errorf("%s default ACL %v, want %v", rel, got, want)
		}
	}
}

func TestSubtreesRefuses(t *testing.T) {
	requireRoot(t)
	base, git := gitDir(t)
	must(t, os.Symlink("objects", filepath.Join(git, "linked")))
	tests := []struct {
		name  string
		names []string
		want  string
	}{
		{"missing", []string{"objects", "nope"}, `"nope": open: no such file`},
		{"symlink", []string{"objects", "linked"}, `"linked": is a symbolic link`},
		{"file", []string{"objects", "config"}, `"config": not a directory`},
		{"nested", []string{"objects", "refs/heads"}, `"refs/heads": not a single path component`},
		{"parent", []string{"objects", ".."}, `"..": not a single path component`},
		{"empty", []string{"objects", ""}, `"": not a single path component`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, Subtrees(git, tt.names, consumerUID, consumerGID), base, tt.want)
			// Nothing changes before every name checked out.
			checkOwner(t, filepath.Join(git, "objects"), 0, 0)
			if got := defaultACLOf(t, filepath.Join(git, "objects")); got != nil {
				t.Errorf("objects got default ACL %v", got)
			}
		})
	}
	t.Run("symlink base", func(t *testing.T) {
		must(t, os.Symlink(".git", filepath.Join(base, "git-link")))
		checkErr(t, Subtrees(filepath.Join(base, "git-link"), []string{"objects"}, consumerUID, consumerGID), base, "symbolic link")
		checkOwner(t, filepath.Join(git, "objects"), 0, 0)
	})
}

// fsImmutableFL is FS_IMMUTABLE_FL (linux/fs.h), which x/sys/unix lacks.
const fsImmutableFL = 0x10

// TestTreeErrorNamesEntry fails deep in the walk (an immutable file that
// even root cannot chown) and checks the error names the entry relative to
// the root.
func TestTreeErrorNamesEntry(t *testing.T) {
	requireRoot(t)
	base := newBase(t)
	root := filepath.Join(base, "tree")
	mk(t, root, ".", unix.S_IFDIR|0o755)
	mk(t, root, "a", unix.S_IFDIR|0o755)
	mk(t, root, "a/b", unix.S_IFDIR|0o755)
	mk(t, root, "a/b/locked", unix.S_IFREG|0o644)
	f, err := os.Open(filepath.Join(root, "a/b/locked"))
	must(t, err)
	// Closed in the cleanup, which TempDir's removal waits for.
	t.Cleanup(func() { f.Close() })
	flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err == nil {
		err = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags|fsImmutableFL)
	}
	if err != nil {
		t.Skipf("cannot make a file immutable here: %v", err)
	}
	t.Cleanup(func() { unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags) })

	err = Tree(root, consumerUID, consumerGID)
	checkErr(t, err, base, `delegate: "a/b/locked": chown: operation not permitted`)
	if !errors.Is(err, unix.EPERM) {
		t.Errorf("error %v does not wrap EPERM", err)
	}
}

// TestTreeNoACLSupport runs Tree on ramfs, which has no ACLs: it must fail
// closed, saying so, before re-owning anything.
func TestTreeNoACLSupport(t *testing.T) {
	requireRoot(t)
	base := newBase(t)
	root := filepath.Join(base, "ramfs")
	mk(t, root, ".", unix.S_IFDIR|0o755)
	if err := unix.Mount("none", root, "ramfs", 0, "mode=0755"); err != nil {
		t.Skipf("cannot mount ramfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	mk(t, root, "file", unix.S_IFREG|0o644)

	err := Tree(root, consumerUID, consumerGID)
	checkErr(t, err, base, `delegate: ".": filesystem lacks POSIX ACL support`)
	if !errors.Is(err, ErrNoACLSupport) {
		t.Errorf("error %v is not ErrNoACLSupport", err)
	}
	checkOwner(t, root, 0, 0)
	checkOwner(t, filepath.Join(root, "file"), 0, 0)
}

// TestAttackSubtreesHardLinkedObjects: a repository cloned from a local
// path (git's default for a path: its objects are hard links to the
// source's) shares its object files' inodes with the source repository.
// Delegating objects/ must not hand those inodes to the consumer: it could
// then chmod and rewrite the other repository's objects from inside its
// container. Delegation refuses a file with more than one link, and leaves
// the shared inode alone.
func TestAttackSubtreesHardLinkedObjects(t *testing.T) {
	requireRoot(t)
	base := newBase(t)
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
			"GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@example.com", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@example.com")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	must(t, os.Mkdir(src, 0o755))
	git(src, "init", "-q")
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("trusted\n"), 0o644))
	git(src, "add", "f")
	git(src, "commit", "-q", "-m", "x")
	git(base, "clone", "-q", src, dst)

	// A source object the clone shares.
	var shared string
	must(t, filepath.WalkDir(filepath.Join(src, ".git", "objects"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && lstat(t, p).Nlink > 1 && shared == "" {
			shared = p
		}
		return err
	}))
	if shared == "" {
		t.Skip("git did not hard-link the clone's objects here")
	}
	rel, err := filepath.Rel(filepath.Join(src, ".git"), shared)
	must(t, err)
	before, err := os.ReadFile(shared)
	must(t, err)

	err = Subtrees(filepath.Join(dst, ".git"), []string{"objects", "refs", "logs"}, consumerUID, consumerGID)
	if err == nil {
		t.Error("delegated a tree holding a hard-linked file")
	} else {
		checkErr(t, err, base, "hard links")
	}
	checkOwner(t, shared, 0, 0)
	// What the consumer could do with the inode had it been handed over.
	obj := filepath.Join(".git", rel)
	if out, err := runAs(consumerUID, consumerGID, dst, "chmod u+w "+obj+" && printf forged > "+obj); err == nil {
		t.Errorf("the consumer rewrote the source repository's object: %s", out)
	}
	if after, _ := os.ReadFile(shared); string(after) != string(before) {
		t.Fatal("the source repository's object changed")
	}
}
