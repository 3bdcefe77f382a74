// Package compose reads a repository's Compose files for a managed
// launch and refuses, before any container exists, everything a
// sandboxed task must not reach through them: the host's namespaces,
// devices and engine socket, other files by include or extends, secrets
// and configs, and any value the engine would fill in from the
// environment. Files are parsed with compose-go with interpolation,
// includes, extends and environment resolution off: nothing is read but
// the files named here.
package compose

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// MaxFileBytes bounds one Compose file.
const MaxFileBytes = 8 << 20

// MaxFiles bounds the Compose files a devcontainer config may name, and
// MaxTotalBytes their bytes together: a config of 1 MiB can name one
// file over 100,000 times, each read (and parsed) in full.
const (
	MaxFiles      = 16
	MaxTotalBytes = 2 * MaxFileBytes
)

// DefaultFileNames are looked for, in this order, at the worktree's root
// when the devcontainer config names no Compose file.
var DefaultFileNames = []string{"compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml"}

// File is one Compose input: its path relative to the worktree and its
// bytes.
type File struct {
	Path string
	Data []byte
}

// DevcontainerFiles is what the devcontainer config says of Compose:
// Set when it has a dockerComposeFile key, Files its entries (relative to
// Dir, the config's directory relative to the worktree). Config is the
// config's path, for messages.
type DevcontainerFiles struct {
	Set    bool
	Dir    string
	Files  []string
	Config string
}

// Inputs reads the Compose files of worktree: those the devcontainer
// config names (at most MaxFiles), else the first of DefaultFileNames
// that exists. Each must resolve inside the worktree (a symlink may point
// only within it), be a regular file of at most MaxFileBytes, and hold
// UTF-8; together they hold at most MaxTotalBytes.
func Inputs(worktree string, dc DevcontainerFiles) ([]File, error) {
	root, err := os.OpenRoot(worktree)
	if err != nil {
		return nil, fmt.Errorf("compose: open the worktree: %w", err)
	}
	defer root.Close()
	var names []string
	switch {
	case dc.Set && len(dc.Files) == 0:
		return nil, fmt.Errorf("devcontainer: %s: dockerComposeFile: an empty list", dc.Config)
	case dc.Set && len(dc.Files) > MaxFiles:
		return nil, fmt.Errorf("devcontainer: %s: dockerComposeFile: %d files, at most %d", dc.Config, len(dc.Files), MaxFiles)
	case dc.Set:
		for i, f := range dc.Files {
			if f == "" || filepath.IsAbs(f) {
				return nil, fmt.Errorf("devcontainer: %s: dockerComposeFile[%d]: %q must be a path relative to the devcontainer config", dc.Config, i, f)
			}
			names = append(names, path.Clean(path.Join(filepath.ToSlash(dc.Dir), filepath.ToSlash(f))))
		}
	default:
		for _, n := range DefaultFileNames {
			if _, err := root.Lstat(n); err == nil {
				names = []string{n}
				break
			}
		}
		if names == nil {
			return nil, fmt.Errorf("compose: no Compose file in the worktree (looked for %s)", strings.Join(DefaultFileNames, ", "))
		}
	}
	files := make([]File, 0, len(names))
	total := 0
	for _, n := range names {
		data, err := ReadInside(root, n, MaxFileBytes)
		if err != nil {
			return nil, err
		}
		if total += len(data); total > MaxTotalBytes {
			return nil, fmt.Errorf("compose: the Compose files are over %d bytes together", MaxTotalBytes)
		}
		files = append(files, File{Path: n, Data: data})
	}
	return files, nil
}

// ReadInside reads name under root: a regular UTF-8 file of at most max
// bytes that resolves inside root (a symlink may point only within it).
func ReadInside(root *os.Root, name string, max int) ([]byte, error) {
	if !fs.ValidPath(name) {
		return nil, fmt.Errorf("compose: %s is outside the worktree", name)
	}
	f, err := root.Open(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("compose: %s does not exist", name)
		}
		return nil, fmt.Errorf("compose: %s does not resolve inside the worktree", name)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("compose: %s: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("compose: %s is not a regular file", name)
	}
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("compose: %s: %w", name, err)
	}
	if len(data) > max {
		return nil, fmt.Errorf("compose: %s is over %d bytes", name, max)
	}
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("compose: %s is not UTF-8", name)
	}
	return data, nil
}
