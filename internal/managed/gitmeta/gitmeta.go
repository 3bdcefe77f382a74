// Package gitmeta checks, before a managed launch makes a worktree, that
// the repository's shared Git metadata is the runtime's alone: a
// consumer of an earlier run (its workspace was delegated to it) or any
// other uid could otherwise have planted configuration, hooks or filters
// that the runtime's own git would run.
package gitmeta

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"agentbox/internal/secfs"
)

// MaxAttributesBytes bounds an attributes file read.
const MaxAttributesBytes = 1 << 20

// Check refuses the repository at repo unless:
//   - its Git metadata (the .git directory, or for a linked worktree the
//     directory its .git file names and that directory's common dir) holds
//     only directories and regular files, every one owned by runtimeUID
//     and writable by no group or other;
//   - every ancestor of that metadata is owned by runtimeUID or root and
//     is not group- or other-writable, unless sticky (another uid cannot
//     rename what it does not own there, as in /tmp);
//   - no file or directory there has a set-user-ID or set-group-ID bit;
//   - no attributes file (.gitattributes at the top, info/attributes)
//     defines a filter, which git would run on checkout;
//   - no configuration file there defines a filter driver's command or
//     includes another file: the assigned commit's own .gitattributes,
//     at any depth, are read only as it is checked out, and can name
//     any driver defined;
//   - no objects/info/alternates or objects/info/http-alternates makes
//     git read objects from a store the check did not look at.
//
// A Git directory with a commondir file (a .git directory too) is checked
// with the common dir it names, as Git reads both.
func Check(repo string, runtimeUID int) error {
	dirs, err := metadataDirs(repo)
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if err := checkAncestors(d, runtimeUID); err != nil {
			return err
		}
		if err := checkTree(d, runtimeUID); err != nil {
			return err
		}
		if err := checkAlternates(d); err != nil {
			return err
		}
		if err := checkConfig(d); err != nil {
			return err
		}
	}
	attrs := []string{filepath.Join(repo, ".gitattributes")}
	for _, d := range dirs {
		attrs = append(attrs, filepath.Join(d, "info", "attributes"))
	}
	for _, p := range attrs {
		if err := checkAttributes(p); err != nil {
			return err
		}
	}
	return nil
}

// metadataDirs are the Git directories of repo: .git, or the directory a
// .git file names and its common dir.
func metadataDirs(repo string) ([]string, error) {
	dotGit := filepath.Join(repo, ".git")
	fi, err := os.Lstat(dotGit)
	if err != nil {
		return nil, fmt.Errorf("gitmeta: %s is not a Git repository: %w", repo, err)
	}
	gitDir := dotGit
	switch {
	case fi.IsDir():
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("gitmeta: %s is neither a directory nor a gitdir file", dotGit)
	default:
		data, err := readSmall(dotGit)
		if err != nil {
			return nil, err
		}
		var ok bool
		gitDir, ok = strings.CutPrefix(strings.TrimSpace(string(data)), "gitdir: ")
		if !ok || gitDir == "" {
			return nil, fmt.Errorf("gitmeta: %s does not name a gitdir", dotGit)
		}
		if !filepath.IsAbs(gitDir) {
			gitDir = filepath.Join(repo, gitDir)
		}
	}
	// Git reads commondir in any Git directory, a .git directory too:
	// the configuration, hooks and objects are then the common dir's.
	dirs := []string{filepath.Clean(gitDir)}
	if data, err := readSmall(filepath.Join(gitDir, "commondir")); err == nil {
		common := strings.TrimSpace(string(data))
		if !filepath.IsAbs(common) {
			common = filepath.Join(gitDir, common)
		}
		dirs = append(dirs, filepath.Clean(common))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return dirs, nil
}

// alternatesFiles make Git read objects from other object stores, which
// the check does not look at (an earlier consumer's, for a snapshot made
// with `git clone --shared`): Git trusts what it reads there, and does
// not even verify a loose object's hash on checkout.
var alternatesFiles = []string{filepath.Join("objects", "info", "alternates"), filepath.Join("objects", "info", "http-alternates")}

// checkAlternates refuses a Git directory that borrows objects.
func checkAlternates(dir string) error {
	for _, name := range alternatesFiles {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			return fmt.Errorf("gitmeta: %s: the repository borrows objects from another store, which is not checked (make the snapshot with git clone --no-hardlinks, without --shared or --reference, or run git repack -a -d and remove the file)", filepath.Join(dir, name))
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("gitmeta: %w", err)
		}
	}
	return nil
}

// configRunning matches the configuration keys checkConfig refuses (git
// reads section and key names lowercased): a filter driver's commands,
// which a checkout runs for any path its attributes give that driver,
// and includes, which read configuration the check does not see (a file
// of the work tree the checkout itself writes, for one).
const configRunning = `^(filter\..+\.(smudge|clean|process)|include\.path|includeif\..+\.path)$`

// checkConfig refuses a Git directory whose config (or config.worktree)
// sets a key of configRunning, read by git itself so it is parsed as the
// checkout would parse it; a file git cannot read is refused too.
func checkConfig(dir string) error {
	for _, name := range []string{"config", "config.worktree"} {
		p := filepath.Join(dir, name)
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		cmd := exec.Command("git", "config", "--file", p, "--no-includes", "--name-only", "--get-regexp", configRunning)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C"}
		out, err := cmd.Output()
		if exit, ok := errors.AsType[*exec.ExitError](err); ok && exit.ExitCode() == 1 && len(out) == 0 {
			continue // no such key
		}
		if err != nil {
			return fmt.Errorf("gitmeta: %s cannot be read as Git configuration: %w", p, err)
		}
		key, _, _ := strings.Cut(string(out), "\n")
		return fmt.Errorf("gitmeta: %s sets %s: a checkout would run a program or read configuration the check does not see (remove it from the repository's configuration)", p, strconv.Quote(key))
	}
	return nil
}

// checkTree walks dir without following links.
func checkTree(dir string, runtimeUID int) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("gitmeta: %w", err)
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("gitmeta: %w", err)
		}
		if !fi.IsDir() && !fi.Mode().IsRegular() {
			return fmt.Errorf("gitmeta: %s is neither a directory nor a regular file (%s)", p, fi.Mode().Type())
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != runtimeUID {
			return fmt.Errorf("gitmeta: %s belongs to uid %d, not the runtime's %d", p, st.Uid, runtimeUID)
		}
		if fi.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("gitmeta: %s is writable by its group or others (%s)", p, fi.Mode().Perm())
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			return fmt.Errorf("gitmeta: %s has a set-user-ID or set-group-ID bit: a consumer may have planted it", p)
		}
		return nil
	})
}

// checkAncestors checks every directory above dir, up to /.
func checkAncestors(dir string, runtimeUID int) error {
	for p := filepath.Dir(filepath.Clean(dir)); ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("gitmeta: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("gitmeta: the ancestor %s is not a directory (a link?)", p)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 0 && int(st.Uid) != runtimeUID {
			return fmt.Errorf("gitmeta: the ancestor %s belongs to uid %d: it could replace what is below", p, st.Uid)
		}
		if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return fmt.Errorf("gitmeta: the ancestor %s is writable by its group or others and not sticky", p)
		}
		if p == "/" {
			return nil
		}
	}
}

// checkAttributes refuses an attributes file that sets the filter
// attribute (`filter` or `filter=NAME`, also in a macro); unsetting it
// (`-filter`, `!filter`) is fine. A missing file is fine.
func checkAttributes(path string) error {
	data, err := readSmall(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), MaxAttributesBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		for _, f := range fields[1:] {
			if f == "filter" || strings.HasPrefix(f, "filter=") {
				return fmt.Errorf("gitmeta: %s:%d defines a filter, which git would run on checkout", path, n)
			}
		}
	}
	return sc.Err()
}

// readSmall reads a file the check needs (never through a link, only a
// regular file), at most MaxAttributesBytes.
func readSmall(path string) ([]byte, error) {
	data, err := secfs.ReadFileNoFollow(path, MaxAttributesBytes)
	if err != nil {
		return nil, fmt.Errorf("gitmeta: %s: %w", path, err)
	}
	return data, nil
}
