package runlayout_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/leasecheck"
	mt "agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/runlayout"
)

// TestLayBase lays out the base document (one lease of every scope) and
// checks each entry's type and mode and that the result passes every
// on-disk check.
func TestLayBase(t *testing.T) {
	f := mt.New(t, mt.Base()) // managedtest.New is runlayout.Lay
	want := map[string]os.FileMode{
		f.RunDir:                                   os.ModeDir | 0o700,
		f.RunDir + "/materializations":             os.ModeDir | 0o700,
		f.RunDir + "/shared":                       os.ModeDir | 0o700,
		f.RunDir + "/shared/exchange":              os.ModeDir | 0o755,
		f.RunDir + "/tool-endpoints":               os.ModeDir | 0o700,
		f.RunDir + "/tool-endpoints/status":        os.ModeDir | 0o700,
		f.RunDir + "/tool-endpoints/delivery.sock": os.ModeSocket | 0o600,
		f.Path: 0o600,
	}
	for _, name := range []string{"delivery-token", "project-env", "delivery-capability", "provider-credential"} {
		want[f.RunDir+"/materializations/"+name] = 0o600
	}
	err := filepath.Walk(f.RunDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		w, ok := want[p]
		if !ok {
			t.Errorf("unexpected %s", p)
		} else if fi.Mode() != w {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), w)
		}
		delete(want, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) > 0 {
		t.Errorf("missing %v", want)
	}
	rt := assignment.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := leasecheck.Load(f.Path, leasecheck.Options{ManagedRoot: f.Root, Now: now, Runtime: rt}); err != nil {
		t.Fatal(err)
	}
}

// TestLayDigests: each file materialization's digest is written into the
// document and matches the bytes on disk.
func TestLayDigests(t *testing.T) {
	f := mt.New(t, mt.Example("spec-model-identity"))
	m := mt.Mat(f.Doc, 1, 0)
	data, err := os.ReadFile(m["source_path"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if m["sha256"] != runlayout.Digest(data) || len(m["sha256"].(string)) != 64 {
		t.Fatalf("digest %v", m["sha256"])
	}
	stored, err := os.ReadFile(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(stored), m["sha256"].(string)) {
		t.Fatal("the stored assignment misses the digest")
	}
}

// TestLayRefusals: an existing run directory is never reused, and an
// endpoint socket needs a way to make one; either way Lay reports what it
// created.
func TestLayRefusals(t *testing.T) {
	base := t.TempDir()
	run := filepath.Join(base, "run-1")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	if created, err := runlayout.Lay(run, map[string]any{}, runlayout.Options{}); err == nil || len(created) != 0 {
		t.Fatalf("existing run directory: %v %v", created, err)
	}
	doc := map[string]any{"leases": []any{map[string]any{"scope": "tool-endpoint", "materializations": []any{
		map[string]any{"source_path": base + "/run-2/tool-endpoints/a.sock"},
	}}}}
	created, err := runlayout.Lay(base+"/run-2", doc, runlayout.Options{})
	if err == nil || len(created) != 2 || created[1] != base+"/run-2/tool-endpoints" {
		t.Fatalf("socket without a maker: %v %v", created, err)
	}
}
