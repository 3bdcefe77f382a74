package gitmeta_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/gitmeta"
)

// TestChanged: the baseline sees each change to what can make host Git
// run code, and nothing else.
func TestChanged(t *testing.T) {
	_, repo := newRepo(t)
	gitDir := filepath.Join(repo, ".git")
	before, err := gitmeta.Executable(gitDir)
	if err != nil {
		t.Fatal(err)
	}
	if got := gitmeta.Changed(gitDir, before); len(got) != 0 {
		t.Fatalf("nothing changed, got %q", got)
	}
	// Not watched: objects, refs, a sample hook.
	write(t, filepath.Join(gitDir, "objects", "x"), "x", 0o644)
	write(t, filepath.Join(gitDir, "hooks", "pre-push.sample"), "#!/bin/sh\n", 0o755)
	if got := gitmeta.Changed(gitDir, before); len(got) != 0 {
		t.Fatalf("only unwatched files changed, got %q", got)
	}
	appendTo(t, filepath.Join(gitDir, "config"), "[filter \"lfs\"]\n\tsmudge = evil\n[core]\n\thooksPath = /tmp/h\n")
	write(t, filepath.Join(gitDir, "hooks", "pre-commit"), "#!/bin/sh\n", 0o755)
	write(t, filepath.Join(gitDir, "info", "attributes"), "* filter=lfs\n", 0o644)
	want := []string{"config", "config: core.hookspath", "config: filter.*.smudge", "hooks/pre-commit", "info/attributes"}
	if got := gitmeta.Changed(gitDir, before); !slices.Equal(got, want) {
		t.Fatalf("Changed = %q, want %q", got, want)
	}
	// A mode change alone is a change.
	after, _ := gitmeta.Executable(gitDir)
	os.Chmod(filepath.Join(gitDir, "hooks", "pre-commit"), 0o700)
	if got := gitmeta.Changed(gitDir, after); !slices.Equal(got, []string{"hooks/pre-commit"}) {
		t.Fatalf("a mode change: %q", got)
	}
	// A removed watched file too.
	os.Remove(filepath.Join(gitDir, "info", "attributes"))
	if got := gitmeta.Changed(gitDir, after); !slices.Contains(got, "info/attributes") {
		t.Fatalf("a removal: %q", got)
	}
}

func TestExecutableKeys(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		want         []string
	}{
		{"none", "[core]\n\tbare = false\n\tfilemode = true\n[remote \"origin\"]\n\turl = x\n", nil},
		{"fsmonitor", "[core]\n\tfsmonitor = /tmp/x\n", []string{"core.fsmonitor"}},
		{"mixed case", "[Core]\n\tFSMonitor=/tmp/x\n", []string{"core.fsmonitor"}},
		{"subsection filter", "[filter \"a\"]\n\tclean = c\n\tprocess = p\n", []string{"filter.*.clean", "filter.*.process"}},
		{"old dotted subsection", "[diff.x]\n\ttextconv = t\n", []string{"diff.*.textconv"}},
		{"alias and pager", "[alias]\n\tco = !evil\n[pager]\n\tlog = evil\n", []string{"alias.co", "pager.log"}},
		{"an include", "[include]\n\tpath = /tmp/other\n[includeIf \"gitdir:/\"]\n\tpath = /tmp/o\n", []string{"include.path", "includeif.*.path"}},
		{"comments", "[core]\n# fsmonitor = x\n; hooksPath = y\n", nil},
		{"a key on the header line", "[core] fsmonitor = x\n", []string{"core.fsmonitor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "config")
			write(t, p, tc.config, 0o644)
			if got := gitmeta.ExecutableKeys(p); !slices.Equal(got, tc.want) {
				t.Fatalf("ExecutableKeys = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSetIDFiles(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "a", "plain"), "x", 0o755)
	write(t, filepath.Join(root, "a", "suid"), "x", 0o755)
	os.Chmod(filepath.Join(root, "a", "suid"), 0o755|os.ModeSetuid)
	os.Mkdir(filepath.Join(root, "sgid"), 0o755)
	os.Chmod(filepath.Join(root, "sgid"), 0o755|os.ModeSetgid)
	os.Symlink("/usr/bin/passwd", filepath.Join(root, "link")) // a link is not followed
	if got, want := gitmeta.SetIDFiles(root), []string{"a/suid", "sgid"}; !slices.Equal(got, want) {
		t.Fatalf("SetIDFiles = %q, want %q", got, want)
	}
	if got := gitmeta.SetIDFiles(filepath.Join(root, "missing")); len(got) != 0 {
		t.Fatalf("a missing root (a worktree already removed) has none: %q", got)
	}
	os.Mkdir(filepath.Join(root, "closed"), 0o000)
	if os.Getuid() != 0 { // root reads it anyway
		if got := gitmeta.SetIDFiles(root); !slices.Contains(got, "closed (unreadable)") {
			t.Fatalf("an unreadable directory is listed: %q", got)
		}
	}
}

func write(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, mode)
}

func appendTo(t *testing.T, p, data string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
}

// FuzzExecutableKeys: whatever a configuration file holds (a consumer
// may have written it), the scanner answers without panicking, with
// sorted names that each match an executable key.
func FuzzExecutableKeys(f *testing.F) {
	f.Add([]byte("[core]\n\tfsmonitor = x\n"))
	f.Add([]byte("[filter \"a\"] clean = c\n[diff.x]\ntextconv=t\n"))
	f.Add([]byte("[\n]\n=\n[ \"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "config")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		keys := gitmeta.ExecutableKeys(p)
		if !slices.IsSorted(keys) {
			t.Fatalf("unsorted: %q", keys)
		}
	})
}

// TestAttackRedirects: the consumer owns the shared metadata's objects,
// refs and logs during a launch. It names a host repository it cannot
// read in objects/info/alternates and links a ref to that repository's
// branch: the operator's `git fetch` of the repository from a fresh
// clone, as root, copies the host repository's history in. A linked
// reflog makes the runtime's own commit append to a host file. A FIFO
// as a ref blocks host Git for good (git for-each-ref never returns). Redirects
// lists each, never following a link.
func TestAttackRedirects(t *testing.T) {
	parent, repo := newRepo(t)
	private := filepath.Join(parent, "private")
	gitRun(t, parent, "init", "-q", "-b", "main", private)
	write(t, filepath.Join(private, "secret"), "host secret\n", 0o600)
	gitRun(t, private, "add", "secret")
	gitRun(t, private, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "private")
	gitDir := filepath.Join(repo, ".git")
	if got := gitmeta.Redirects(gitDir); len(got) != 0 {
		t.Fatalf("a clean repository: %q", got)
	}

	write(t, filepath.Join(gitDir, "objects", "info", "alternates"), filepath.Join(private, ".git", "objects")+"\n", 0o644)
	if err := os.Symlink(filepath.Join(private, ".git", "refs", "heads", "main"), filepath.Join(gitDir, "refs", "heads", "task")); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(parent, "fresh")
	gitRun(t, parent, "init", "-q", fresh)
	gitRun(t, fresh, "fetch", "-q", repo, "task")
	if got := gitOut(t, fresh, "show", "FETCH_HEAD:secret"); got != "host secret" {
		t.Fatalf("the fetch got %q: the attack needs the host repository's content", got)
	}
	// A linked reflog: the runtime's own commit in the main checkout
	// appends to whatever host file it names.
	target := filepath.Join(parent, "host-file")
	write(t, target, "host\n", 0o600)
	reflog := filepath.Join(gitDir, "logs", "refs", "heads", "main")
	os.Remove(reflog)
	if err := os.Symlink(target, reflog); err != nil {
		t.Fatal(err)
	}
	gitRun(t, repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "--allow-empty", "-m", "runtime")
	if data, _ := os.ReadFile(target); !strings.Contains(string(data), "commit: runtime") {
		t.Fatalf("the host file holds %q: the attack needs Git to append there", data)
	}
	for _, p := range []string{filepath.Join(gitDir, "refs", "tags", "hang"), filepath.Join(gitDir, "objects", "pack", "pack-0.idx")} {
		if err := unix.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(gitDir, "objects", "info", "http-alternates"), "http://example.invalid/\n", 0o644)
	want := []string{
		"logs/refs/heads/main (symlink)", "objects/info/alternates", "objects/info/http-alternates",
		"objects/pack/pack-0.idx (fifo)", "refs/heads/task (symlink)", "refs/tags/hang (fifo)",
	}
	if got := gitmeta.Redirects(gitDir); !slices.Equal(got, want) {
		t.Fatalf("Redirects = %q, want %q", got, want)
	}
	// An alternates file is listed whatever its type, once.
	alt := filepath.Join(gitDir, "objects", "info", "alternates")
	os.Remove(alt)
	os.Symlink("/dev/zero", alt)
	if got := gitmeta.Redirects(gitDir); !slices.Contains(got, "objects/info/alternates") || slices.Contains(got, "objects/info/alternates (symlink)") {
		t.Fatalf("a linked alternates file: %q", got)
	}
	if got := gitmeta.Redirects(filepath.Join(parent, "missing")); len(got) != 0 {
		t.Fatalf("a missing Git directory: %q", got)
	}
}
