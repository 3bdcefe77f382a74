package gitmeta_test

import (
	"bytes"
	"compress/zlib"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/managed/gitmeta"
)

// newRepo makes a real repository with one commit under a private
// parent, so the parent's mode is the test's to set.
func newRepo(t *testing.T) (parent, repo string) {
	t.Helper()
	parent = filepath.Join(t.TempDir(), "p")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	repo = filepath.Join(parent, "repo")
	for _, args := range [][]string{{"init", "-q", "-b", "main", repo},
		{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "--allow-empty", "-m", "init"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	// git's own files may be group-writable under a loose umask.
	filepath.Walk(filepath.Join(repo, ".git"), func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			os.Chmod(p, fi.Mode().Perm()&^0o022)
		}
		return nil
	})
	return parent, repo
}

func TestCheck(t *testing.T) {
	uid := os.Getuid()
	parent, repo := newRepo(t)
	if err := gitmeta.Check(repo, uid); err != nil {
		t.Fatalf("a clean repository: %v", err)
	}
	for _, tc := range []struct {
		name  string
		root  bool // needs root (chown to another uid)
		plant func(t *testing.T, parent, repo string) func()
		want  string
	}{
		{"a set-user-ID object", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "objects", "evil")
			os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755)
			os.Chmod(p, 0o755|os.ModeSetuid)
			return func() { os.Remove(p) }
		}, "objects/evil has a set-user-ID or set-group-ID bit"},
		{"a set-group-ID directory", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "refs", "heads")
			os.Chmod(p, 0o755|os.ModeSetgid)
			return func() { os.Chmod(p, 0o755) }
		}, "refs/heads has a set-user-ID or set-group-ID bit"},
		{"a group-writable config", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "config")
			os.Chmod(p, 0o664)
			return func() { os.Chmod(p, 0o644) }
		}, "config is writable by its group or others"},
		{"an other-writable hooks dir", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "hooks")
			os.Chmod(p, 0o757)
			return func() { os.Chmod(p, 0o755) }
		}, "hooks is writable by its group or others"},
		{"a symlink in .git", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "hooks", "pre-commit")
			os.Symlink("/bin/true", p)
			return func() { os.Remove(p) }
		}, "neither a directory nor a regular file"},
		{"a fifo in .git", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "fifo")
			if err := exec.Command("mkfifo", p).Run(); err != nil {
				t.Skip("no mkfifo")
			}
			return func() { os.Remove(p) }
		}, "neither a directory nor a regular file"},
		{"a file of another uid", true, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "description")
			os.Lchown(p, 4242, 4242)
			return func() { os.Lchown(p, uid, uid) }
		}, "description belongs to uid 4242"},
		{"an ancestor of another uid", true, func(t *testing.T, parent, _ string) func() {
			os.Lchown(parent, 4242, 4242)
			return func() { os.Lchown(parent, uid, uid) }
		}, "the ancestor " + "PARENT" + " belongs to uid 4242"},
		{"a group-writable ancestor", false, func(t *testing.T, parent, _ string) func() {
			os.Chmod(parent, 0o775)
			return func() { os.Chmod(parent, 0o755) }
		}, "writable by its group or others and not sticky"},
		{"a filter in .gitattributes", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".gitattributes")
			os.WriteFile(p, []byte("# ok\n*.txt text\n*.bin filter=lfs diff=lfs\n"), 0o644)
			return func() { os.Remove(p) }
		}, ".gitattributes:3 defines a filter"},
		{"a filter set in info/attributes", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "info", "attributes")
			os.WriteFile(p, []byte("* filter\n"), 0o644)
			return func() { os.Remove(p) }
		}, "attributes:1 defines a filter"},
		{"a filter in a macro", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".gitattributes")
			os.WriteFile(p, []byte("[attr]evil filter=x\n*.c evil\n"), 0o644)
			return func() { os.Remove(p) }
		}, ".gitattributes:1 defines a filter"},
		// The assigned commit's .gitattributes, at any depth, can name
		// any filter driver: none may be defined, nor configuration
		// read from elsewhere.
		{"a filter driver's smudge", false, func(t *testing.T, _, repo string) func() {
			gitRun(t, repo, "config", "filter.x.smudge", "sh -c 'touch /tmp/mark; cat'")
			return func() { gitRun(t, repo, "config", "--remove-section", "filter.x") }
		}, `sets "filter.x.smudge"`},
		{"a filter driver's process", false, func(t *testing.T, _, repo string) func() {
			gitRun(t, repo, "config", "filter.Lfs.process", "git-lfs filter-process")
			return func() { gitRun(t, repo, "config", "--remove-section", "filter.Lfs") }
		}, `sets "filter.Lfs.process"`},
		{"an include", false, func(t *testing.T, _, repo string) func() {
			gitRun(t, repo, "config", "include.path", "../work-tree-file")
			return func() { gitRun(t, repo, "config", "--unset", "include.path") }
		}, `sets "include.path"`},
		{"a conditional include", false, func(t *testing.T, _, repo string) func() {
			gitRun(t, repo, "config", "includeIf.onbranch:main.path", "x")
			return func() { gitRun(t, repo, "config", "--remove-section", "includeIf.onbranch:main") }
		}, `sets "includeif.onbranch:main.path"`},
		{"a config.worktree", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "config.worktree")
			os.WriteFile(p, []byte("[filter \"y\"]\n\tclean = cat\n"), 0o644)
			return func() { os.Remove(p) }
		}, `config.worktree sets "filter.y.clean"`},
		{"a config git cannot read", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".git", "config.worktree")
			os.WriteFile(p, []byte("[filter\n"), 0o644)
			return func() { os.Remove(p) }
		}, "cannot be read as Git configuration"},
		{"a linked .gitattributes", false, func(t *testing.T, _, repo string) func() {
			p := filepath.Join(repo, ".gitattributes")
			os.Symlink("/etc/hostname", p)
			return func() { os.Remove(p) }
		}, ".gitattributes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("chown to another uid needs root")
			}
			undo := tc.plant(t, parent, repo)
			err := gitmeta.Check(repo, uid)
			undo()
			want := strings.ReplaceAll(tc.want, "PARENT", parent)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Check = %v, want an error with %q", err, want)
			}
			if err := gitmeta.Check(repo, uid); err != nil {
				t.Fatalf("after undoing: %v", err)
			}
		})
	}
	// What is fine: unsetting a filter, a sticky world-writable ancestor.
	os.WriteFile(filepath.Join(repo, ".gitattributes"), []byte("* -filter\n*.x !filter\n*.y filtering\n"), 0o644)
	os.Chmod(parent, 0o777|os.ModeSticky)
	if err := gitmeta.Check(repo, uid); err != nil {
		t.Fatalf("unset filters under a sticky ancestor: %v", err)
	}
	// Another runtime uid owns none of it.
	if err := gitmeta.Check(repo, uid+1); err == nil || !strings.Contains(err.Error(), "not the runtime's") {
		t.Fatalf("checked for another runtime uid: %v", err)
	}
}

// TestLinkedWorktree: a repository that is itself a linked worktree is
// checked through its gitdir and the common dir.
func TestLinkedWorktree(t *testing.T) {
	uid := os.Getuid()
	parent, repo := newRepo(t)
	wt := filepath.Join(parent, "wt")
	if out, err := exec.Command("git", "-C", repo, "worktree", "add", "-q", "-b", "task", wt).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add: %v %s", err, out)
	}
	filepath.Walk(filepath.Join(repo, ".git"), func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			os.Chmod(p, fi.Mode().Perm()&^0o022)
		}
		return nil
	})
	if err := gitmeta.Check(wt, uid); err != nil {
		t.Fatalf("a linked worktree: %v", err)
	}
	// The common dir is checked too.
	cfg := filepath.Join(repo, ".git", "config")
	os.Chmod(cfg, 0o666)
	defer os.Chmod(cfg, 0o644)
	if err := gitmeta.Check(wt, uid); err == nil || !strings.Contains(err.Error(), "config is writable") {
		t.Fatalf("the common dir's config writable: %v", err)
	}
}

// TestAttackCheckAlternates: a repository snapshot made with `git clone
// --shared` (or --reference) of an earlier, delegated repository reads
// its objects from that repository's object store, which the earlier
// consumer owns. Its own metadata is the runtime's, so the check passed;
// but the consumer rewrites a loose object there and host Git checks the
// rewritten content out for the assigned revision (Git does not verify a
// loose object's hash on checkout), or makes its own alternates file a FIFO that hangs it.
// Any alternates file is refused: the objects it names are outside what
// the check looked at.
func TestAttackCheckAlternates(t *testing.T) {
	uid := os.Getuid()
	parent, old := newRepo(t)
	write(t, filepath.Join(old, "cfg.json"), "{\"safe\": true}\n", 0o644)
	gitRun(t, old, "add", "cfg.json")
	gitRun(t, old, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "second")
	repo := filepath.Join(parent, "snapshot")
	gitRun(t, parent, "clone", "-q", "--shared", "--no-checkout", old, repo)
	// The attack: the earlier consumer rewrites the blob in its store;
	// host Git in the snapshot reads the rewrite for the committed name.
	blob := gitOut(t, repo, "rev-parse", "HEAD:cfg.json")
	loose := filepath.Join(old, ".git", "objects", blob[:2], blob[2:])
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	fmt.Fprintf(zw, "blob %d\x00%s", len("{\"evil\": true}\n"), "{\"evil\": true}\n")
	zw.Close()
	os.Chmod(loose, 0o644)
	if err := os.WriteFile(loose, z.Bytes(), 0o444); err != nil {
		t.Fatal(err)
	}
	if got := gitOut(t, repo, "show", "HEAD:cfg.json"); got != "{\"evil\": true}" {
		t.Fatalf("the snapshot reads %q: the attack needs the rewritten object", got)
	}
	filepath.Walk(filepath.Join(repo, ".git"), func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			os.Chmod(p, fi.Mode().Perm()&^0o022)
		}
		return nil
	})
	if os.Geteuid() == 0 { // the earlier launch delegated old's objects
		filepath.Walk(filepath.Join(old, ".git", "objects"), func(p string, _ os.FileInfo, err error) error {
			if err == nil {
				os.Lchown(p, 4242, 4242)
			}
			return nil
		})
	}
	alt := filepath.Join(repo, ".git", "objects", "info", "alternates")
	if err := gitmeta.Check(repo, uid); err == nil || !strings.Contains(err.Error(), "objects/info/alternates") {
		t.Fatalf("Check of a repository borrowing another's objects = %v, want a refusal naming objects/info/alternates", err)
	}
	// A relative path, or only the HTTP form, is refused the same way.
	orig, err := os.ReadFile(alt)
	if err != nil {
		t.Fatal(err)
	}
	write(t, alt, "../../../repo/.git/objects\n", 0o644)
	if err := gitmeta.Check(repo, uid); err == nil || !strings.Contains(err.Error(), "objects/info/alternates") {
		t.Fatalf("relative alternates: %v", err)
	}
	os.Remove(alt)
	httpAlt := filepath.Join(repo, ".git", "objects", "info", "http-alternates")
	write(t, httpAlt, "http://example.invalid/objects\n", 0o644)
	if err := gitmeta.Check(repo, uid); err == nil || !strings.Contains(err.Error(), "objects/info/http-alternates") {
		t.Fatalf("http-alternates: %v", err)
	}
	os.Remove(httpAlt)
	// Without them (after `git repack -a -d` and removing the file) the
	// snapshot's objects are its own and it passes.
	write(t, alt, string(orig), 0o644)
	gitRun(t, repo, "repack", "-q", "-a", "-d")
	os.Remove(alt)
	filepath.Walk(filepath.Join(repo, ".git"), func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			os.Chmod(p, fi.Mode().Perm()&^0o022)
		}
		return nil
	})
	if err := gitmeta.Check(repo, uid); err != nil {
		t.Fatalf("a repacked snapshot without alternates: %v", err)
	}
}

// TestAttackCheckCommondir: a .git directory with a commondir file is a
// linked worktree's Git directory to Git, whatever its place: Git takes
// the configuration, hooks and objects of the directory it names. The
// check looked at .git alone, so a commondir naming an earlier,
// delegated repository (its config the consumer's) passed, and host Git
// then ran that config's core.fsmonitor.
func TestAttackCheckCommondir(t *testing.T) {
	uid := os.Getuid()
	parent, repo := newRepo(t)
	other := filepath.Join(parent, "other")
	gitRun(t, parent, "init", "-q", "-b", "main", other)
	otherCfg := filepath.Join(other, ".git", "config")
	appendTo(t, otherCfg, "[core]\n\tfsmonitor = echo planted\n")
	os.Chmod(otherCfg, 0o666) // the consumer's to change
	cd := filepath.Join(repo, ".git", "commondir")
	write(t, cd, "../../other/.git\n", 0o644) // relative to .git
	if out, err := exec.Command("git", "-C", repo, "config", "--get", "core.fsmonitor").Output(); err != nil || strings.TrimSpace(string(out)) != "echo planted" {
		t.Fatalf("git does not read the commondir's config (%v %q): the attack needs it", err, out)
	}
	if err := gitmeta.Check(repo, uid); err == nil || !strings.Contains(err.Error(), "config is writable") {
		t.Fatalf("Check through a .git directory's commondir = %v, want the common dir's config refused", err)
	}
	os.Chmod(otherCfg, 0o644)
	os.Remove(cd)
	if err := gitmeta.Check(repo, uid); err != nil {
		t.Fatalf("without commondir: %v", err)
	}
}

func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

func gitRun(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v %s", args, err, out)
	}
}
