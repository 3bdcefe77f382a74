package local

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"agentbox/internal/backend"
	"agentbox/internal/secfs"
)

// maxMetaBytes bounds the metadata file read: it holds three short fields.
const maxMetaBytes = 16 << 10

// metaVersion is the metadata format written by this code.
const metaVersion = 1

// errIncomplete marks a sandbox directory without metadata: a Create in
// progress or one a crash interrupted. It is a not-found to callers.
var errIncomplete = fmt.Errorf("%w (creation did not finish)", backend.ErrNotFound)

// meta is a sandbox's durable state.
type meta struct {
	Version   int    `json:"version"`
	UUID      string `json:"uuid"`
	Running   bool   `json:"running"`
	SocketDir string `json:"socket_dir,omitempty"`
}

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
	if m.Version != metaVersion || !uuidPattern.MatchString(m.UUID) {
		return meta{}, fmt.Errorf("sandbox %s metadata: unsupported version or bad uuid", filepath.Base(dir))
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

// newUUID returns a random (version 4) UUID.
func newUUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
