// Package runlayout lays an assignment document out on disk the way the
// on-disk rules (package leasecheck) require: the run directory, the
// materializations directory, every file materialization with its digest
// written into the document, every shared-directory and tool-endpoint
// source, and finally the assignment itself.
//
// It is shared by `branchbox managed example`, which writes a run a new
// user can try, and by package managedtest, which builds run directories
// for tests. Documents are generic JSON values (map[string]any) so tests
// can also lay out documents the rules refuse.
package runlayout

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/secfs"
)

// AssignmentFile is the name Lay gives the assignment in the run directory.
const AssignmentFile = "assignment.json"

// Modes the on-disk rules require.
const (
	// PrivateDirMode: the run directory, the materializations directory and
	// every directory between the run directory and a run source.
	PrivateDirMode fs.FileMode = 0o700
	// FileMode: the assignment and every file materialization (owner-only).
	FileMode fs.FileMode = 0o600
	// SharedDirMode: a shared-directory source, readable by any container
	// user through its read-only bind.
	SharedDirMode fs.FileMode = 0o755
	// EndpointDirMode: a tool-endpoint source that is a directory.
	EndpointDirMode fs.FileMode = 0o700
	// SocketMode: a tool-endpoint source that is a socket (owner-only).
	SocketMode fs.FileMode = 0o600
)

// SocketSuffix marks a tool-endpoint source Lay makes a Unix socket; any
// other tool-endpoint source becomes a directory.
const SocketSuffix = ".sock"

// Options say what Lay writes for the sources it creates.
type Options struct {
	// Content returns the bytes of file materialization mat of lease
	// lease, whose scope is scope. Required when the document has file
	// materializations.
	Content func(scope string, lease, mat int) []byte
	// Socket creates an owner-only Unix socket file at path (mode
	// SocketMode). When nil, a tool-endpoint source named *.sock is
	// refused.
	Socket func(path string) error
}

// Digest is the lowercase hexadecimal SHA-256 of data, as a
// materialization's sha256 field holds it.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Marshal encodes a document as Lay stores it: indented JSON with a final
// newline.
func Marshal(doc map[string]any) ([]byte, error) {
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// Lay creates the run directory runDir (mode 0700; it must not exist yet,
// its parent must), then, for every materialization of doc whose source is
// below runDir, the missing directories between runDir and the source
// (0700) and the source itself:
//
//   - shared-directory: a directory of mode 0755;
//   - tool-endpoint: a socket (opts.Socket) when the name ends in ".sock",
//     else a directory of mode 0700;
//   - any other scope: a file materialization of mode 0600 holding
//     opts.Content, whose SHA-256 Lay writes into the materialization's
//     "sha256" field.
//
// Sources elsewhere are left alone (a test of a misplaced source). Last it
// stores doc as runDir/assignment.json (mode 0600). Files are written with
// secfs.WriteFileAtomic (temporary file, fsync, rename, directory fsync).
//
// Lay returns every path it created, in creation order, also when it fails
// part way, so a caller can report or remove them. The caller makes sure
// no other uid can replace runDir's ancestors while Lay runs (the rule
// validate applies to them).
func Lay(runDir string, doc map[string]any, opts Options) (created []string, err error) {
	if err := secfs.MkdirFresh(runDir); err != nil {
		return nil, err
	}
	created = append(created, runDir)
	leases, _ := doc["leases"].([]any)
	for i := range leases {
		l, _ := leases[i].(map[string]any)
		scope, _ := l["scope"].(string)
		mats, _ := l["materializations"].([]any)
		for j := range mats {
			m, _ := mats[j].(map[string]any)
			src, _ := m["source_path"].(string)
			rel, ok := strings.CutPrefix(src, runDir+"/")
			if !ok || !secfs.IsAbsClean(src) {
				continue
			}
			dirs, err := mkdirs(runDir, rel)
			created = append(created, dirs...)
			if err != nil {
				return created, err
			}
			if err := laySource(assignment.Scope(scope), m, src, i, j, opts); err != nil {
				return created, err
			}
			created = append(created, src)
		}
	}
	data, err := Marshal(doc)
	if err != nil {
		return created, err
	}
	p := filepath.Join(runDir, AssignmentFile)
	if err := secfs.WriteFileAtomic(p, data, FileMode); err != nil {
		return created, err
	}
	return append(created, p), nil
}

// mkdirs creates the missing directories between runDir and the source
// rel (relative to runDir), each with mode 0700, and returns those it
// created.
func mkdirs(runDir, rel string) ([]string, error) {
	var created []string
	dir := runDir
	comps := strings.Split(rel, "/")
	for _, c := range comps[:len(comps)-1] {
		dir = filepath.Join(dir, c)
		if _, err := os.Lstat(dir); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return created, err
		}
		if err := secfs.MkdirFresh(dir); err != nil {
			return created, err
		}
		created = append(created, dir)
	}
	return created, nil
}

func laySource(scope assignment.Scope, m map[string]any, src string, i, j int, opts Options) error {
	switch scope {
	case assignment.ScopeSharedDirectory:
		if err := secfs.MkdirFresh(src); err != nil {
			return err
		}
		return secfs.Chmod(src, SharedDirMode)
	case assignment.ScopeToolEndpoint:
		if strings.HasSuffix(src, SocketSuffix) {
			if opts.Socket == nil {
				return fmt.Errorf("lease %d materialization %d: no way to create an endpoint socket", i, j)
			}
			return opts.Socket(src)
		}
		if err := secfs.MkdirFresh(src); err != nil {
			return err
		}
		return secfs.Chmod(src, EndpointDirMode)
	}
	if opts.Content == nil {
		return fmt.Errorf("lease %d materialization %d: no content for a file materialization", i, j)
	}
	data := opts.Content(string(scope), i, j)
	if err := secfs.WriteFileAtomic(src, data, FileMode); err != nil {
		return err
	}
	m["sha256"] = Digest(data)
	return nil
}
