package secfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// both runs a test with openat2 and with the openat+fstat fallback.
func both(t *testing.T, f func(t *testing.T)) {
	t.Run("openat2", f)
	t.Run("fallback", func(t *testing.T) {
		SetOpenatFallbackForTest(true)
		defer SetOpenatFallbackForTest(false)
		f(t)
	})
}

func TestOpenChild(t *testing.T) {
	both(t, func(t *testing.T) {
		dir := t.TempDir()
		must(t, os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o600))
		must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o700))
		must(t, os.Symlink("file", filepath.Join(dir, "link")))
		must(t, os.Symlink("sub", filepath.Join(dir, "dirlink")))
		must(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
		sock := filepath.Join(dir, "sock")
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		must(t, err)
		must(t, unix.Bind(fd, &unix.SockaddrUnix{Name: sock}))
		unix.Close(fd)

		d, _, err := OpenDirNoFollow(dir, nil)
		must(t, err)
		defer d.Close()

		f, st, err := OpenChild(d, "file", unix.O_RDONLY|unix.O_NONBLOCK)
		must(t, err)
		f.Close()
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			t.Errorf("file mode %o", st.Mode)
		}
		for _, name := range []string{"link", "dirlink"} {
			for _, flags := range []int{unix.O_RDONLY | unix.O_NONBLOCK, unix.O_PATH, unix.O_PATH | unix.O_DIRECTORY} {
				if _, _, err := OpenChild(d, name, flags); !errors.Is(err, ErrSymlink) && !errors.Is(err, ErrType) {
					t.Errorf("%s flags %x: err = %v, want a symlink refusal", name, flags, err)
				}
			}
		}
		// A FIFO opens without blocking and reports its type.
		f, st, err = OpenChild(d, "fifo", unix.O_RDONLY|unix.O_NONBLOCK)
		must(t, err)
		f.Close()
		if st.Mode&unix.S_IFMT != unix.S_IFIFO {
			t.Errorf("fifo mode %o", st.Mode)
		}
		// A socket cannot be opened for reading; with O_PATH it can be
		// inspected.
		if _, _, err := OpenChild(d, "sock", unix.O_RDONLY|unix.O_NONBLOCK); !errors.Is(err, ErrType) {
			t.Errorf("socket read open: %v", err)
		}
		f, st, err = OpenChild(d, "sock", unix.O_PATH)
		must(t, err)
		f.Close()
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			t.Errorf("socket mode %o", st.Mode)
		}
		if _, _, err := OpenChild(d, "missing", unix.O_PATH); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("missing: %v", err)
		}
		for _, bad := range []string{"", ".", "..", "a/b", "x\x00"} {
			if _, _, err := OpenChild(d, bad, unix.O_PATH); !errors.Is(err, ErrUnsafe) {
				t.Errorf("%q: %v", bad, err)
			}
		}
	})
}

func TestOpenDirNoFollow(t *testing.T) {
	both(t, func(t *testing.T) {
		dir := t.TempDir()
		must(t, os.MkdirAll(filepath.Join(dir, "a", "b"), 0o700))
		must(t, os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "alias")))
		must(t, os.WriteFile(filepath.Join(dir, "f"), nil, 0o600))

		var depths []int
		d, st, err := OpenDirNoFollow(filepath.Join(dir, "a", "b"), func(depth int, st *unix.Stat_t) error {
			depths = append(depths, depth)
			return nil
		})
		must(t, err)
		d.Close()
		want, _ := Components(filepath.Join(dir, "a", "b"))
		if len(depths) != len(want)+1 || depths[0] != 0 || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			t.Errorf("depths %v for %d components", depths, len(want))
		}
		if _, _, err := OpenDirNoFollow(filepath.Join(dir, "alias", "b"), nil); !errors.Is(err, ErrSymlink) && !errors.Is(err, ErrType) {
			t.Errorf("symlink in the middle: %v", err)
		}
		if _, _, err := OpenDirNoFollow(filepath.Join(dir, "alias"), nil); !errors.Is(err, ErrSymlink) && !errors.Is(err, ErrType) {
			t.Errorf("symlink at the end: %v", err)
		}
		if _, _, err := OpenDirNoFollow(filepath.Join(dir, "f"), nil); !errors.Is(err, ErrType) {
			t.Errorf("file as directory: %v", err)
		}
		for _, bad := range []string{"relative", "/a/../b", "/a//b", "/a/"} {
			if _, _, err := OpenDirNoFollow(bad, nil); !errors.Is(err, ErrUnsafe) {
				t.Errorf("%q: %v", bad, err)
			}
		}
		stop := errors.New("stop")
		if _, _, err := OpenDirNoFollow(dir, func(int, *unix.Stat_t) error { return stop }); err != stop {
			t.Errorf("visit error not returned: %v", err)
		}
	})
}

func TestReadAllLimited(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	must(t, os.WriteFile(p, []byte("12345"), 0o600))
	f, err := os.Open(p)
	must(t, err)
	defer f.Close()
	if b, err := ReadAllLimited(f, 5); err != nil || string(b) != "12345" {
		t.Fatalf("at limit: %q %v", b, err)
	}
	_, _ = f.Seek(0, 0)
	if _, err := ReadAllLimited(f, 4); err == nil {
		t.Fatal("past limit accepted")
	}
}

func TestIsAbsClean(t *testing.T) {
	for p, want := range map[string]bool{"/": true, "/a/b": true, "": false, "a": false, "/a/": false, "/a/./b": false, "/a/../b": false, "//a": false, "/a\x00": false} {
		if IsAbsClean(p) != want {
			t.Errorf("IsAbsClean(%q) != %v", p, want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReadFileBelow: the file is read below its root through no symlink;
// a symlink on the way or as the file, a FIFO (no block), a file past the
// bound and a path that is not relative and clean are refused.
func TestReadFileBelow(t *testing.T) {
	root, other := t.TempDir(), t.TempDir()
	mustMkdir := func(p string) {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustMkdir(filepath.Join(root, "a", "b"))
	if err := os.WriteFile(filepath.Join(root, "a", "b", "f"), []byte("below"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "f"), []byte("elsewhere"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink(other, filepath.Join(root, "a", "lnk"))
	os.Symlink(filepath.Join(other, "f"), filepath.Join(root, "a", "b", "flink"))
	if err := unix.Mkfifo(filepath.Join(root, "a", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadFileBelow(root, "a/b/f", 5); err != nil || string(got) != "below" {
		t.Fatalf("a/b/f: %q %v", got, err)
	}
	for _, c := range []struct {
		rel  string
		want error
	}{
		{"a/lnk/f", ErrSymlink},
		{"a/b/flink", ErrSymlink},
		{"a/fifo", ErrType},
		{"a/missing", os.ErrNotExist},
		{"a/../a/b/f", ErrUnsafe},
		{"/a/b/f", ErrUnsafe},
		{"a//b/f", ErrUnsafe},
		{"", ErrUnsafe},
	} {
		if got, err := ReadFileBelow(root, c.rel, 5); !errors.Is(err, c.want) {
			t.Errorf("%q: %q %v, want %v", c.rel, got, err, c.want)
		}
	}
	if _, err := ReadFileBelow(root, "a/b/f", 4); err == nil {
		t.Error("a 5-byte file read with a 4-byte bound")
	}
}
