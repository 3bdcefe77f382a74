package launch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/leasecheck"
	mt "agentbox/internal/managed/managedtest"
)

// pinWorld is a version 3 launch assignment laid out on disk, the record
// `feature start` writes for it, and the configuration later commands
// load it with. No engine is needed: this is what exec-provider and
// dispatch-tool do with the assignment before they reach the container.
func pinWorld(t *testing.T) (*mt.Fixture, *Record, Config) {
	t.Helper()
	repo := filepath.Join(t.TempDir(), "repo")
	img := "sha256:" + strings.Repeat("ab", 32)
	doc := mt.LaunchDoc(repo, strings.Repeat("1", 40), mt.Images{Service: img, Proxy: img, ProxyPort: 8080})
	f := mt.New(t, doc)
	runtime := assignment.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
	cfg := Config{
		StateRoot: t.TempDir(),
		Runtime:   runtime,
		Checks:    leasecheck.Options{ManagedRoot: f.Root, Now: time.Now(), Runtime: runtime},
	}
	checked, err := leasecheck.Load(f.Path, cfg.Checks)
	if err != nil {
		t.Fatal(err)
	}
	if err := checked.Assignment.RequireManagedLaunch(cfg.Runtime); err != nil {
		t.Skipf("the runtime's ids are the fixture consumer's: %v", err)
	}
	rec := newRecord(Request{Name: "pinned", Repo: repo, Manifest: f.Path}, repo, checked, featureDir(cfg.StateRoot, "pinned"))
	return f, rec, cfg
}

func wantCode(t *testing.T, err error, code, reason string) {
	t.Helper()
	var le *Error
	if !errors.As(err, &le) || le.Code != code || !strings.Contains(le.Message, reason) {
		t.Fatalf("err = %v, want code %s with %q", err, code, reason)
	}
	if strings.Contains(le.Message, mt.Secret) || strings.Contains(le.Message, "/materializations/") {
		t.Fatalf("the refusal leaks: %q", le.Message)
	}
}

// TestLaterCommandsUseTheStartedAssignment: the record pins the bytes
// `feature start` validated; exec-provider and dispatch-tool
// (pinnedAssignment) refuse any other document at the manifest path, a
// valid one included (a version 2 downgrade, a widened provider), and a
// record that holds no digest.
func TestLaterCommandsUseTheStartedAssignment(t *testing.T) {
	f, rec, cfg := pinWorld(t)
	original, err := os.ReadFile(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.AssignmentSHA256) != 64 {
		t.Fatalf("the record pins %q", rec.AssignmentSHA256)
	}
	if _, err := pinnedAssignment(cfg, rec); err != nil {
		t.Fatalf("the started assignment: %v", err)
	}

	// Each replacement is a valid document on its own (the unpinned load
	// earlier versions did accepted it), or the very document reformatted.
	doc := func(edit func(doc map[string]any)) []byte {
		d := mt.Clone(f.Doc)
		edit(d)
		return mt.Marshal(d)
	}
	for _, tc := range []struct {
		name  string
		bytes []byte
	}{
		{"version 2 downgrade", doc(func(d map[string]any) {
			d["version"] = "2"
			for _, k := range []string{"workspace_consumer", "service_images", "port_proxy_image", "published_ports"} {
				delete(d, k)
			}
		})},
		{"another provider executable", doc(func(d map[string]any) { mt.Lease(d, 0)["executable"] = "/bin/sh" })},
		{"the same document reformatted", append(append([]byte(nil), original...), '\n')},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mt.WriteFile(t, f.Path, tc.bytes, 0o600)
			if _, err := leasecheck.Load(f.Path, cfg.Checks); err != nil {
				t.Fatalf("the replacement is not valid on its own: %v", err)
			}
			_, err := pinnedAssignment(cfg, rec)
			wantCode(t, err, CodeAssignmentChanged, "assignment: changed since the launch validated it")
		})
	}

	// The original bytes again: accepted, and the launch rule and the
	// launch's identity are applied again.
	mt.WriteFile(t, f.Path, original, 0o600)
	if _, err := pinnedAssignment(cfg, rec); err != nil {
		t.Fatalf("the original bytes again: %v", err)
	}
	asConsumer := cfg
	asConsumer.Runtime = rec.Consumer
	_, err = pinnedAssignment(asConsumer, rec)
	wantCode(t, err, CodeAssignment, "workspace_consumer.uid")
	other := *rec
	other.RunID = "run-2"
	_, err = pinnedAssignment(cfg, &other)
	wantCode(t, err, CodeAssignmentChanged, "run_id: the assignment does not match the launch record")

	// A record written before the digest was: refused, fail closed.
	legacy := *rec
	legacy.AssignmentSHA256 = ""
	_, err = pinnedAssignment(cfg, &legacy)
	wantCode(t, err, CodeAssignmentChanged, "holds no assignment digest")
}

// TestRecordKeepsTheDigest: the digest survives the record's save and
// load, and an older record without it still loads (teardown, status and
// ls work on it; only the pinned commands refuse it).
func TestRecordKeepsTheDigest(t *testing.T) {
	_, rec, cfg := pinWorld(t)
	if err := prepareFeatureDir(cfg.StateRoot, rec.Name); err != nil {
		t.Fatal(err)
	}
	if err := rec.save(cfg.StateRoot); err != nil {
		t.Fatal(err)
	}
	got, err := Load(cfg.StateRoot, rec.Name)
	if err != nil || got.AssignmentSHA256 != rec.AssignmentSHA256 {
		t.Fatalf("loaded %+v %v", got, err)
	}
	if _, err := pinnedAssignment(cfg, got); err != nil {
		t.Fatalf("pinned after a reload of the record: %v", err)
	}
	data, err := os.ReadFile(RecordPath(cfg.StateRoot, rec.Name))
	if err != nil {
		t.Fatal(err)
	}
	line := `  "assignment_sha256": "` + rec.AssignmentSHA256 + `",` + "\n"
	if !strings.Contains(string(data), line) {
		t.Fatalf("record without the digest line:\n%s", data)
	}
	mt.WriteFile(t, RecordPath(cfg.StateRoot, rec.Name), []byte(strings.Replace(string(data), line, "", 1)), 0o600)
	old, err := Load(cfg.StateRoot, rec.Name)
	if err != nil || old.AssignmentSHA256 != "" {
		t.Fatalf("an older record: %+v %v", old, err)
	}
	_, err = pinnedAssignment(cfg, old)
	wantCode(t, err, CodeAssignmentChanged, "holds no assignment digest")
}
