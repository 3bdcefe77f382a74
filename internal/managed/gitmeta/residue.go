package gitmeta

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"agentbox/internal/secfs"
)

// MaxWatchedBytes bounds one watched file read for the baseline.
const MaxWatchedBytes = 1 << 20

// watchedFiles are the files of a Git directory whose content decides
// what host Git runs there: configuration (core.fsmonitor,
// core.hooksPath, filters, an editor or pager...) and attributes (which
// filter runs on which path). The hooks directory is watched whole.
var watchedFiles = []string{"config", "config.worktree", filepath.Join("info", "attributes")}

const hooksDir = "hooks"

// Baseline is what of a Git directory can make host Git run code: each
// watched file and hook by its path relative to the Git directory, as a
// digest of its mode and content ("" for a missing watched file).
type Baseline map[string]string

// Executable reads the baseline of gitDir. Links are never followed: a
// link is recorded as such, by its mode, not its target.
func Executable(gitDir string) (Baseline, error) {
	b := Baseline{}
	for _, name := range watchedFiles {
		d, err := digest(filepath.Join(gitDir, name))
		if err != nil {
			return nil, err
		}
		b[name] = d
	}
	entries, err := os.ReadDir(filepath.Join(gitDir, hooksDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("gitmeta: read the hooks: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sample") {
			continue // git never runs these
		}
		name := filepath.Join(hooksDir, e.Name())
		d, err := digest(filepath.Join(gitDir, name))
		if err != nil {
			return nil, err
		}
		b[name] = d
	}
	return b, nil
}

// digest is a watched path's mode and content digest, "" when it does
// not exist.
func digest(path string) (string, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("gitmeta: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%o\x00", uint32(fi.Mode()))
	if fi.Mode().IsRegular() {
		data, err := secfs.ReadFileNoFollow(path, MaxWatchedBytes)
		if err != nil {
			return "", fmt.Errorf("gitmeta: %w", err)
		}
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Changed lists what differs between the baseline taken before a launch
// and gitDir now: each watched file or hook added, changed or removed, by
// its path relative to the Git directory, and for a configuration file
// the executable keys it sets now that it did not before (as
// "config: core.fsmonitor"). An error reading is reported as a change:
// what cannot be read cannot be trusted.
func Changed(gitDir string, before Baseline) []string {
	now, err := Executable(gitDir)
	if err != nil {
		return []string{"the Git directory could not be read"}
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(mergeKeys(before, now))) {
		if before[name] == now[name] {
			continue
		}
		out = append(out, name)
		if slices.Contains([]string{"config", "config.worktree"}, name) {
			for _, key := range ExecutableKeys(filepath.Join(gitDir, name)) {
				out = append(out, name+": "+key)
			}
		}
	}
	return out
}

func mergeKeys(a, b Baseline) Baseline {
	m := maps.Clone(a)
	if m == nil {
		m = Baseline{}
	}
	for k, v := range b {
		m[k] = v
	}
	return m
}

// executableKeys are configuration keys (lower case, as path.Match
// patterns; a "*" between dots is any subsection) whose value host Git runs, or which make it run a file or
// read another configuration file.
var executableKeys = []string{
	"core.fsmonitor", "core.hookspath", "core.sshcommand", "core.editor", "core.pager",
	"core.askpass", "core.gitproxy", "sequence.editor", "diff.external",
	"diff.*.textconv", "diff.*.command", "merge.*.driver", "filter.*.clean",
	"filter.*.smudge", "filter.*.process", "credential.helper", "credential.*.helper",
	"gpg.program", "gpg.*.program", "uploadpack.packobjectshook",
	"remote.*.uploadpack", "remote.*.receivepack", "include.path", "includeif.*.path",
	"pager.*", "alias.*",
}

// ExecutableKeys lists the executable keys (see executableKeys) a
// configuration file sets, as section[.subsection].key in lower case,
// sorted. It is a scanner for reporting, not Git's parser: it never
// decides what is safe.
func ExecutableKeys(file string) []string {
	data, err := secfs.ReadFileNoFollow(file, MaxWatchedBytes)
	if err != nil {
		return nil
	}
	found := map[string]bool{}
	section, hasSub := "", false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), MaxWatchedBytes)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			// [section], [section "subsection"] or the old [section.sub]
			head, rest, _ := strings.Cut(strings.TrimPrefix(line, "["), "]")
			name, _, quoted := strings.Cut(head, " ")
			name, _, dotted := strings.Cut(strings.TrimSpace(name), ".")
			section, hasSub = strings.ToLower(name), quoted || dotted
			line = strings.TrimSpace(rest)
		}
		if line == "" || line[0] == '#' || line[0] == ';' || section == "" {
			continue
		}
		key, _, _ := strings.Cut(line, "=")
		full := section + "." + strings.ToLower(strings.TrimSpace(key))
		if hasSub {
			full = section + ".*." + strings.ToLower(strings.TrimSpace(key))
		}
		for _, pattern := range executableKeys {
			if ok, _ := path.Match(pattern, full); ok {
				found[full] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(found))
}

// SetIDFiles lists, relative to root and sorted, every file or directory
// under it with a set-user-ID or set-group-ID bit, without following
// links (see walk: the tree may change while it is read). An unreadable
// part is listed as such; a missing root has none. At most MaxListed
// are listed.
func SetIDFiles(root string) []string {
	var out listing
	walk(root, func(rel string, st *unix.Stat_t) {
		if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			out.add(rel)
		}
	}, func(rel string) { out.add(rel + " (unreadable)") })
	return out.sorted()
}

// MaxListed bounds what one scan lists (a consumer could plant a
// million entries): past it, a last entry says how many more it found.
const MaxListed = 1000

// listing is a scan's bounded list.
type listing struct {
	items []string
	more  int
}

func (l *listing) add(s string) {
	if len(l.items) < MaxListed {
		l.items = append(l.items, s)
	} else {
		l.more++
	}
}

// sorted is the list, sorted, and "... and N more" when it was full.
func (l *listing) sorted() []string {
	slices.Sort(l.items)
	if l.more > 0 {
		return append(l.items, fmt.Sprintf("... and %d more", l.more))
	}
	return l.items
}

// Redirects lists, relative to gitDir and sorted, what there makes host
// Git read outside the repository or block: an alternates file
// (objects/info/alternates or objects/info/http-alternates), whatever its
// type, and every other entry that is neither a directory nor a regular
// file, with its type ("refs/heads/x (symlink)"): Git follows a link
// where it reads a ref, a reflog, a loose object or a pack, and opening
// a FIFO as a ref or as the alternates file blocks it. Links are never followed; an unreadable part is listed
// as such; a missing gitDir has none. At most MaxListed are listed.
func Redirects(gitDir string) []string {
	var out listing
	walk(gitDir, func(rel string, st *unix.Stat_t) {
		switch t := st.Mode & unix.S_IFMT; {
		case slices.Contains(alternatesFiles, rel):
			out.add(rel)
		case t != unix.S_IFDIR && t != unix.S_IFREG:
			out.add(rel + " (" + typeName(t) + ")")
		}
	}, func(rel string) { out.add(rel + " (unreadable)") })
	return out.sorted()
}

// typeName names a file type (S_IFMT bits) for a report.
func typeName(t uint32) string {
	switch t {
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "device"
	}
	return "special file"
}
