package local

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"agentbox/internal/backend"
	"agentbox/internal/secfs"
)

// maxMetaBytes bounds the metadata file read: it holds a few short fields.
const maxMetaBytes = 16 << 10

// metaVersion is the metadata format written by this code. Version 1
// sandboxes (run as the broker's own uid, without a supervisor) are not
// loaded: destroy them with the jailbee that made them.
const metaVersion = 2

// errIncomplete marks a sandbox directory without metadata: a Create in
// progress or one a crash interrupted. It is a not-found to callers.
var errIncomplete = fmt.Errorf("%w (creation did not finish)", backend.ErrNotFound)

// meta is a sandbox's durable state.
type meta struct {
	Version int    `json:"version"`
	UUID    string `json:"uuid"`
	// UID and GID are the host ids the sandbox runs as and that own its
	// checkout and home.
	UID       int            `json:"uid"`
	GID       int            `json:"gid"`
	Limits    backend.Limits `json:"limits"`
	SocketDir string         `json:"socket_dir,omitempty"`
	// ModelDir is the model socket's directory (absent in older files).
	ModelDir string `json:"model_dir,omitempty"`
	// PID and StartTime identify the running unit's supervisor (0: none
	// started since the last stop).
	PID       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"start_time,omitempty"`
}

// dirOf is the field holding the directory attached as kind.
func (m *meta) dirOf(kind backend.SocketKind) *string {
	if kind == backend.ModelSocket {
		return &m.ModelDir
	}
	return &m.SocketDir
}

// running reports whether the unit m records is alive.
func (m meta) running() bool { return m.PID > 0 && alive(m.PID, m.StartTime) }

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func loadMeta(dir string) (meta, error) {
	data, err := secfs.ReadFileNoFollow(filepath.Join(dir, metaFile), maxMetaBytes)
	if errors.Is(err, os.ErrNotExist) {
		return meta{}, fmt.Errorf("%w: %s", errIncomplete, filepath.Base(dir))
	}
	if err != nil {
		return meta{}, err
	}
	var m meta
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return meta{}, fmt.Errorf("sandbox %s metadata: %w", filepath.Base(dir), err)
	}
	if m.Version != metaVersion {
		return meta{}, fmt.Errorf("sandbox %s was made by another jailbee version (metadata version %d, this one reads %d)", filepath.Base(dir), m.Version, metaVersion)
	}
	if !uuidPattern.MatchString(m.UUID) || m.UID < 0 || m.GID < 0 {
		return meta{}, fmt.Errorf("sandbox %s metadata: bad uuid or ids", filepath.Base(dir))
	}
	return m, nil
}

func saveMeta(dir string, m meta) error {
	m.Version = metaVersion
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return secfs.WriteFileAtomic(filepath.Join(dir, metaFile), append(data, '\n'), 0o600)
}
