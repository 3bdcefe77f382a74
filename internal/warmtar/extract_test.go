package warmtar

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/testutil/contain"
)

// member is one entry of a test stream.
type member struct {
	name, body, link string
	typ              byte
	mode             int64
}

func stream(t *testing.T, ms ...member) *bytes.Reader {
	t.Helper()
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, m := range ms {
		typ := m.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := m.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: m.name, Typeflag: typ, Linkname: m.link, Mode: mode, Size: int64(len(m.body)),
			ModTime: time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			w.Write([]byte(m.body))
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(buf.Bytes())
}

// checkout is a fork's checkout with a committed symlink `lnk` to a
// directory outside it (`outside`), as a committed symlink to the agent's
// home would be, and a committed file.
func checkout(t *testing.T) (root *os.File, dir, outside string) {
	t.Helper()
	base := t.TempDir()
	dir, outside = filepath.Join(base, "workspace"), filepath.Join(base, "home")
	for _, d := range []string{dir, outside, filepath.Join(dir, "src")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "lnk")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../home", filepath.Join(dir, "src", "rel")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("committed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	root = os.NewFile(uintptr(fd), dir)
	t.Cleanup(func() { root.Close() })
	return root, dir, outside
}

// TestExtractRefusesWhatTarWouldFollow: hostile streams, each refused
// with its reason, and nothing written outside the checkout or into .git.
func TestExtractRefusesWhatTarWouldFollow(t *testing.T) {
	cases := []struct {
		name    string
		members []member
		want    error
	}{
		{"through a committed symlink", []member{{name: "lnk/.bashrc", body: "pwned"}}, ErrSymlink},
		{"through a committed relative symlink", []member{{name: "src/rel/.profile", body: "pwned"}}, ErrSymlink},
		{"a directory through a committed symlink", []member{{name: "lnk/.ssh/", typ: tar.TypeDir}}, ErrSymlink},
		{"through a symlink of the stream", []member{{name: "out", typ: tar.TypeSymlink, link: "../home"}, {name: "out/x", body: "pwned"}}, ErrSymlink},
		{"a symlink of the stream as a directory", []member{{name: "d", typ: tar.TypeSymlink, link: "../home"}, {name: "d/", typ: tar.TypeDir}}, ErrSymlink},
		{"dot-dot", []member{{name: "a/../../home/x", body: "pwned"}}, ErrName},
		{"absolute", []member{{name: "/tmp/x", body: "pwned"}}, ErrName},
		{"not clean", []member{{name: "a//b", body: "pwned"}}, ErrName},
		{"hard link", []member{{name: "h", typ: tar.TypeLink, link: "README"}}, ErrType},
		{"fifo", []member{{name: "f", typ: tar.TypeFifo}}, ErrType},
		{"device", []member{{name: "d", typ: tar.TypeChar}}, ErrType},
		{"file over a directory", []member{{name: "src", body: "x"}}, ErrInWay},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root, dir, outside := checkout(t)
			err := Extract(root, stream(t, c.members...))
			if !errors.Is(err, c.want) {
				t.Fatalf("Extract: %v, want %v", err, c.want)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Errorf("wrote outside the checkout: %v", entries)
			}
			if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
				t.Error("wrote .git")
			}
			if fi, err := os.Lstat(filepath.Join(dir, "lnk")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Error("the committed symlink was replaced")
			}
		})
	}
}

// TestExtractSkipsGitDirs: members under a .git (any case, at any depth:
// a dependency's checkout in a build output) are skipped, nothing written
// there, and the members around them are written.
func TestExtractSkipsGitDirs(t *testing.T) {
	root, dir, _ := checkout(t)
	err := Extract(root, stream(t,
		member{name: ".git/hooks/post-checkout", body: "pwned"},
		member{name: "deps/foo/.GIT/", typ: tar.TypeDir},
		member{name: "deps/foo/.git/config", body: "[core]\n\tfsmonitor = evil\n"},
		member{name: "deps/foo/lib.ex", body: "code"},
	))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".git", "deps/foo/.git", "deps/foo/.GIT"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err == nil {
			t.Errorf("%s was written", p)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "deps/foo/lib.ex")); err != nil || string(b) != "code" {
		t.Errorf("the member after the skipped ones: %q %v", b, err)
	}
}

// TestExtractWritesBuildOutputs: files (times and modes, setuid dropped),
// directories, symlinks (absolute ones too: the fork's own business) and
// files over committed ones.
func TestExtractWritesBuildOutputs(t *testing.T) {
	root, dir, _ := checkout(t)
	err := Extract(root, stream(t,
		member{name: "target/", typ: tar.TypeDir, mode: 0o755},
		member{name: "target/debug/app", body: "built", mode: 0o4755},
		member{name: "target/link", typ: tar.TypeSymlink, link: "/etc/passwd"},
		member{name: "./node_modules/.bin/tool", typ: tar.TypeSymlink, link: "../tool/cli.js"},
		member{name: "README", body: "seeded\n"},
		member{name: "target/link", typ: tar.TypeSymlink, link: "debug/app"},
	))
	if err != nil {
		t.Fatal(err)
	}
	app := filepath.Join(dir, "target", "debug", "app")
	fi, err := os.Stat(app)
	if err != nil || fi.Mode().Perm() != 0o755 || fi.Mode()&os.ModeSetuid != 0 {
		t.Fatalf("app: %v %v", fi.Mode(), err)
	}
	if b, _ := os.ReadFile(app); string(b) != "built" {
		t.Errorf("app holds %q", b)
	}
	if !fi.ModTime().Equal(time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("app's time %v, want the stream's", fi.ModTime())
	}
	if d, _ := os.Stat(filepath.Join(dir, "target")); !d.ModTime().Equal(time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("target's time %v, want the stream's (set last)", d.ModTime())
	}
	for link, want := range map[string]string{"target/link": "debug/app", "node_modules/.bin/tool": "../tool/cli.js"} {
		if got, err := os.Readlink(filepath.Join(dir, link)); err != nil || got != want {
			t.Errorf("%s -> %q %v, want %q", link, got, err, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "README")); string(b) != "seeded\n" {
		t.Errorf("README holds %q", b)
	}
}

// TestExtractRefusesSparseFiles: GNU tar's sparse members (made with
// `tar --sparse`, PAX and GNU formats, of a 1 TiB file that is one hole
// and "hi"): 10 KiB of stream that would write a terabyte of zeros.
func TestExtractRefusesSparseFiles(t *testing.T) {
	for _, name := range []string{"sparse-pax.tar.gz", "sparse-gnu.tar.gz"} {
		f, err := os.Open(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		z, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		root, dir, _ := checkout(t)
		if err := Extract(root, z); !errors.Is(err, ErrSparse) && !errors.Is(err, ErrType) {
			t.Errorf("%s: %v, want refused", name, err)
		}
		if _, err := os.Lstat(filepath.Join(dir, "big")); err == nil {
			t.Errorf("%s: the sparse file was written", name)
		}
	}
}

// TestExtractNotATar: garbage is refused, not written.
func TestExtractNotATar(t *testing.T) {
	root, _, _ := checkout(t)
	if err := Extract(root, bytes.NewReader(bytes.Repeat([]byte("x"), 1024))); err == nil {
		t.Fatal("garbage extracted")
	}
}

func FuzzExtract(f *testing.F) {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	w.WriteHeader(&tar.Header{Name: "a/b", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	w.Write([]byte("x"))
	w.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../x"})
	w.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dir := filepath.Join(base, "w")
		os.Mkdir(dir, 0o755)
		os.Symlink(base, filepath.Join(dir, "lnk"))
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		root := os.NewFile(uintptr(fd), dir)
		defer root.Close()
		Extract(root, bytes.NewReader(data))
		var written int64
		filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				written += fi.Size()
			}
			return nil
		})
		if written > int64(len(data)) {
			t.Fatalf("%d bytes of stream wrote %d bytes", len(data), written)
		}
		entries, _ := os.ReadDir(base)
		if len(entries) != 1 {
			t.Fatalf("wrote beside the checkout: %v", entries)
		}
	})
}

// TestMain runs the tests, which feed hostile streams that aim outside
// their checkout, contained: a regression fails a test instead of writing
// the host's files.
func TestMain(m *testing.M) { contain.Main(m, nil, nil) }
