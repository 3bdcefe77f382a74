package secfs_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"agentbox/internal/secfs"
)

// TestChmodNeverFollows: a socket, a file and a directory get their
// mode; a name that is a symlink is refused and its target keeps its
// mode (the broker chmods the socket it just made, in a directory a
// sandbox might write: a symlink swapped in must not aim the chmod at a
// host file).
func TestChmodNeverFollows(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "d")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]os.FileMode{sock: 0o600, file: 0o600, sub: 0o755} {
		if err := secfs.Chmod(p, mode); err != nil {
			t.Fatalf("Chmod(%s): %v", filepath.Base(p), err)
		}
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s: %v, %v; want %v", filepath.Base(p), fi.Mode(), err, mode)
		}
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if err := secfs.Chmod(link, 0o600); !errors.Is(err, secfs.ErrUnsafe) {
		t.Fatalf("Chmod of a symlink: %v, want ErrUnsafe", err)
	}
	if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("the symlink's target: %v, %v; want 0644 untouched", fi.Mode(), err)
	}
}
