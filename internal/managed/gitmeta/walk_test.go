package gitmeta_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/gitmeta"
)

// swapWhenOpened arranges for victim to be replaced by what replace
// makes as soon as the walk opens the directory trigger, which the walk
// reaches after it listed victim's parent and before it reaches victim
// (its sibling, first in name order, and full enough that the walk spends
// a while in it). It returns a function that waits for the swap.
func swapWhenOpened(t *testing.T, trigger, victim string, replace func(string) error) func() {
	t.Helper()
	for i := range 20000 {
		if err := os.WriteFile(filepath.Join(trigger, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(fd, trigger, unix.IN_OPEN); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		defer unix.Close(fd)
		buf := make([]byte, 4096)
		if _, err := unix.Read(fd, buf); err != nil {
			done <- err
			return
		}
		if err := os.Rename(victim, victim+".moved"); err != nil {
			done <- err
			return
		}
		done <- replace(victim)
	}()
	return func() {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestAttackWalkSwappedDirectory: a consumer uid with a process on the
// host keeps owning the delegated objects, refs and logs while teardown
// scans them. Between the scan listing objects and entering objects/ab,
// it swaps objects/ab for a link to a directory outside the repository:
// the scan walked and reported what is there, as root. Or for a FIFO.
// Each scan never follows the link nor opens anything but a directory;
// Redirects reports the swapped entry.
func TestAttackWalkSwappedDirectory(t *testing.T) {
	scans := map[string]func(string) []string{"SetIDFiles": gitmeta.SetIDFiles, "Redirects": gitmeta.Redirects}
	for _, scan := range []string{"SetIDFiles", "Redirects"} {
		for _, swap := range []string{"symlink", "fifo"} {
			t.Run(scan+"/"+swap, func(t *testing.T) {
				_, repo := newRepo(t)
				gitDir := filepath.Join(repo, ".git")
				outside := filepath.Join(t.TempDir(), "outside")
				write(t, filepath.Join(outside, "suid"), "x", 0o755)
				os.Chmod(filepath.Join(outside, "suid"), 0o755|os.ModeSetuid)
				os.Symlink("/", filepath.Join(outside, "link"))
				trigger := filepath.Join(gitDir, "objects", "aa")
				victim := filepath.Join(gitDir, "objects", "ab")
				os.MkdirAll(trigger, 0o755)
				os.MkdirAll(victim, 0o755)
				replace := func(p string) error { return os.Symlink(outside, p) }
				if swap == "fifo" {
					replace = func(p string) error { return unix.Mkfifo(p, 0o644) }
				}
				wait := swapWhenOpened(t, trigger, victim, replace)
				got := scans[scan](gitDir)
				wait()
				if slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, "objects/ab/") }) {
					t.Fatalf("%s followed the swapped directory: %q", scan, got)
				}
				// Redirects names what objects/ab is now; SetIDFiles has
				// nothing to say about a link or a FIFO.
				if want := "objects/ab (" + swap + ")"; scan == "Redirects" && !slices.Contains(got, want) {
					t.Fatalf("%s = %q, want %q", scan, got, want)
				}
			})
		}
	}
}

// TestWalkDepth: a scan enters directories down to MaxWalkDepth levels
// below its root; one level more is reported unreadable, not entered.
func TestWalkDepth(t *testing.T) {
	for _, levels := range []int{gitmeta.MaxWalkDepth, gitmeta.MaxWalkDepth + 1} {
		root := t.TempDir()
		deepest := root
		for range levels {
			deepest = filepath.Join(deepest, "d")
		}
		write(t, filepath.Join(deepest, "suid"), "x", 0o755)
		os.Chmod(filepath.Join(deepest, "suid"), 0o755|os.ModeSetuid)
		rel, _ := filepath.Rel(root, deepest)
		got := gitmeta.SetIDFiles(root)
		want := []string{rel + "/suid"}
		if levels > gitmeta.MaxWalkDepth {
			want = []string{rel + " (unreadable)"}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%d levels: SetIDFiles = %q, want %q", levels, got, want)
		}
	}
}

// TestScanListsAtMost: a consumer that plants a million links would make
// the receipt as long; a scan lists MaxListed entries, then how many more.
func TestScanListsAtMost(t *testing.T) {
	for _, n := range []int{gitmeta.MaxListed, gitmeta.MaxListed + 1} {
		_, repo := newRepo(t)
		gitDir := filepath.Join(repo, ".git")
		dir := filepath.Join(gitDir, "refs", "heads", "many")
		os.Mkdir(dir, 0o755)
		for i := range n {
			if err := os.Symlink("/", filepath.Join(dir, fmt.Sprintf("l%05d", i))); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(repo, "w", fmt.Sprintf("f%05d", i)), "", 0o755)
			os.Chmod(filepath.Join(repo, "w", fmt.Sprintf("f%05d", i)), 0o755|os.ModeSetuid)
		}
		got, setID := gitmeta.Redirects(gitDir), gitmeta.SetIDFiles(filepath.Join(repo, "w"))
		for _, l := range [][]string{got, setID} {
			if n == gitmeta.MaxListed && (len(l) != n || strings.Contains(l[len(l)-1], "more")) {
				t.Fatalf("%d planted: %d listed, last %q", n, len(l), l[len(l)-1])
			}
			if n > gitmeta.MaxListed && (len(l) != gitmeta.MaxListed+1 || l[len(l)-1] != "... and 1 more") {
				t.Fatalf("%d planted: %d listed, last %q", n, len(l), l[len(l)-1])
			}
		}
	}
}
