package leasecheck_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/leasecheck"
	mt "agentbox/internal/managed/managedtest"
	"agentbox/internal/secfs"
)

var now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func runtimeID() assignment.Identity {
	return assignment.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
}

func load(f *mt.Fixture) (*leasecheck.Checked, error) {
	return leasecheck.Load(f.Path, leasecheck.Options{ManagedRoot: f.Root, Now: now, Runtime: runtimeID()})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Base lease indexes (see managedtest.Base).
const (
	provEnv    = 1
	projectEnv = 2
	shared     = 3
	endpoint   = 4 // socket, linked to the tool request
	capability = 5
	credential = 8
	statusDir  = 9 // standalone endpoint directory
)

const other = 1000 // a uid that is neither root nor the runtime

type diskCase struct {
	name   string
	root   bool // needs root (chown)
	setup  func(t *testing.T, f *mt.Fixture)
	path   func(f *mt.Fixture) string // the assignment path to load, when not f.Path
	field  string
	reason string
}

func replaceWithSymlink(t *testing.T, p string) {
	t.Helper()
	real := p + "-real"
	must(t, os.Rename(p, real))
	must(t, os.Symlink(filepath.Base(real), p))
}

func replaceWithFIFO(t *testing.T, p string) {
	t.Helper()
	must(t, os.RemoveAll(p))
	must(t, unix.Mkfifo(p, 0o600))
}

func replaceWithSocket(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	must(t, os.RemoveAll(p))
	mt.MakeSocket(t, p, mode)
}

func replaceWithDir(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	must(t, os.RemoveAll(p))
	must(t, os.Mkdir(p, mode))
	must(t, os.Chmod(p, mode))
}

func src(f *mt.Fixture, lease int) string { return f.Source(lease, 0) }

func srcField(lease int) string {
	return assignment.LeaseField(lease) + ".materializations[0].source_path"
}

var diskCases = []diskCase{
	// The assignment file and where it is stored.
	{name: "assignment symlink", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSymlink(t, f.Path) }, field: "assignment", reason: "symbolic link"},
	{name: "assignment group-readable", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(f.Path, 0o640)) }, field: "assignment", reason: "owner-only"},
	{name: "assignment world-readable", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(f.Path, 0o604)) }, field: "assignment", reason: "owner-only"},
	{name: "assignment setuid", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(f.Path, 0o600|os.ModeSetuid)) }, field: "assignment", reason: "set-uid"},
	{name: "assignment hard link", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Link(f.Path, filepath.Join(t.TempDir(), "copy"))) }, field: "assignment", reason: "exactly one link"},
	{name: "assignment FIFO", setup: func(t *testing.T, f *mt.Fixture) { replaceWithFIFO(t, f.Path) }, field: "assignment", reason: "found a FIFO"},
	{name: "assignment socket", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSocket(t, f.Path, 0o600) }, field: "assignment", reason: "unexpected file type"},
	{name: "assignment directory", setup: func(t *testing.T, f *mt.Fixture) { replaceWithDir(t, f.Path, 0o700) }, field: "assignment", reason: "found a directory"},
	{name: "assignment missing", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Remove(f.Path)) }, field: "assignment", reason: "does not exist"},
	{name: "assignment of another uid", root: true, setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chown(f.Path, other, other)) }, field: "assignment", reason: "neither root nor the runtime's uid"},
	{name: "assignment not in a run directory", path: func(f *mt.Fixture) string { return filepath.Join(f.Root, "assignment.json") }, field: "assignment", reason: "stored directly in a run directory"},
	{name: "assignment nested below the run", path: func(f *mt.Fixture) string { return filepath.Join(f.RunDir, "sub", "assignment.json") }, field: "assignment", reason: "stored directly in a run directory"},
	{name: "assignment path relative", path: func(f *mt.Fixture) string { return "run-1/assignment.json" }, field: "assignment", reason: "absolute and clean"},
	{name: "assignment path unclean", path: func(f *mt.Fixture) string { return f.RunDir + "/../run-1/assignment.json" }, field: "assignment", reason: "absolute and clean"},
	{name: "run directory of another run id", setup: func(t *testing.T, f *mt.Fixture) {
		must(t, os.Rename(f.RunDir, filepath.Join(f.Root, "run-2")))
	}, path: func(f *mt.Fixture) string { return filepath.Join(f.Root, "run-2", "assignment.json") }, field: "run_id", reason: "does not name the run directory"},

	// The run directory and its ancestors.
	{name: "run directory 0750", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(f.RunDir, 0o750)) }, field: "assignment", reason: "run directory must have mode 0700, found 0750"},
	{name: "run directory sticky", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(f.RunDir, 0o700|os.ModeSticky)) }, field: "assignment", reason: "found 1700"},
	{name: "run directory of another uid", root: true, setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chown(f.RunDir, other, other)) }, field: "assignment", reason: "run directory is owned by uid 1000"},
	{name: "run directory symlink", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSymlink(t, f.RunDir) }, field: "assignment", reason: "symbolic link"},
	{name: "run directory missing", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.RemoveAll(f.RunDir)) }, field: "assignment", reason: "does not exist"},
	{name: "managed root symlink", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSymlink(t, f.Root) }, field: "assignment", reason: "symbolic link"},
	{name: "managed root world-writable", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(f.Root, 0o777)) }, field: "assignment", reason: "without the sticky bit (mode 0777)"},
	{name: "managed root group-writable", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(f.Root, 0o775)) }, field: "assignment", reason: "without the sticky bit"},
	{name: "managed root of another uid", root: true, setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chown(f.Root, other, other)) }, field: "assignment", reason: "owned by uid 1000, neither root nor the assignment owner"},

	// The materializations directory.
	{name: "materializations 0755", setup: func(t *testing.T, f *mt.Fixture) {
		must(t, os.Chmod(filepath.Join(f.RunDir, "materializations"), 0o755))
	}, field: "assignment", reason: "materializations directory must have mode 0700"},
	{name: "materializations of another uid", root: true, setup: func(t *testing.T, f *mt.Fixture) {
		must(t, os.Chown(filepath.Join(f.RunDir, "materializations"), other, other))
	}, field: "assignment", reason: "materializations directory is owned by uid 1000"},
	{name: "materializations symlink", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSymlink(t, filepath.Join(f.RunDir, "materializations")) }, field: "assignment", reason: "symbolic link"},

	// File materializations.
	{name: "value symlink", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSymlink(t, src(f, provEnv)) }, field: srcField(provEnv), reason: "symbolic link"},
	{name: "value FIFO", setup: func(t *testing.T, f *mt.Fixture) { replaceWithFIFO(t, src(f, provEnv)) }, field: srcField(provEnv), reason: "found a FIFO"},
	{name: "value socket", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSocket(t, src(f, provEnv), 0o600) }, field: srcField(provEnv), reason: "unexpected file type"},
	{name: "value directory", setup: func(t *testing.T, f *mt.Fixture) { replaceWithDir(t, src(f, provEnv), 0o700) }, field: srcField(provEnv), reason: "found a directory"},
	{name: "value group-readable", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(src(f, provEnv), 0o640)) }, field: srcField(provEnv), reason: "owner-only"},
	{name: "value of another uid", root: true, setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chown(src(f, provEnv), other, other)) }, field: srcField(provEnv), reason: "owned by uid 1000"},
	{name: "value hard-linked outside the run", setup: func(t *testing.T, f *mt.Fixture) {
		must(t, os.Link(src(f, provEnv), filepath.Join(t.TempDir(), "alias")))
	}, field: srcField(provEnv), reason: "exactly one link"},
	{name: "value missing", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Remove(src(f, provEnv))) }, field: srcField(provEnv), reason: "does not exist"},
	{name: "value digest mismatch", setup: func(t *testing.T, f *mt.Fixture) {
		mt.WriteFile(t, src(f, provEnv), []byte("rotated-"+mt.Secret), 0o600)
	}, field: srcField(provEnv), reason: "does not match its sha256"},
	{name: "value with newline", setup: func(t *testing.T, f *mt.Fixture) {
		f.SetFile(provEnv, 0, []byte("value-"+mt.Secret+"\n"))
		f.Write()
	}, field: srcField(provEnv), reason: "content: value holds a control character"},
	{name: "value not UTF-8", setup: func(t *testing.T, f *mt.Fixture) {
		f.SetFile(provEnv, 0, []byte("value-"+mt.Secret+"\xff"))
		f.Write()
	}, field: srcField(provEnv), reason: "content: value is not valid UTF-8"},
	{name: "value too short", setup: func(t *testing.T, f *mt.Fixture) {
		f.SetFile(provEnv, 0, []byte("short"))
		f.Write()
	}, field: srcField(provEnv), reason: "8-16384 bytes"},
	{name: "value too long", setup: func(t *testing.T, f *mt.Fixture) {
		f.SetFile(provEnv, 0, []byte(strings.Repeat(mt.Secret, 16384/6+1)))
		f.Write()
	}, field: srcField(provEnv), reason: "at most 16384 bytes"},
	{name: "capability bad character", setup: func(t *testing.T, f *mt.Fixture) {
		f.SetFile(capability, 0, []byte("capability-"+mt.Secret+"-0123456789abcdef+"))
		f.Write()
	}, field: srcField(capability), reason: "content: capability may only use"},
	{name: "capability short", setup: func(t *testing.T, f *mt.Fixture) {
		f.SetFile(capability, 0, []byte("cap-"+mt.Secret))
		f.Write()
	}, field: srcField(capability), reason: "32-128 bytes"},
	{name: "project env unsorted", setup: func(t *testing.T, f *mt.Fixture) {
		f.SetFile(projectEnv, 0, []byte("B=1\nA="+mt.Secret+"\n"))
		f.Write()
	}, field: srcField(projectEnv), reason: "content: line 2: names must be unique and sorted"},
	{name: "credential group-readable", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(src(f, credential), 0o644)) }, field: srcField(credential), reason: "owner-only"},

	// Shared directories.
	{name: "shared 0700", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(src(f, shared), 0o700)) }, field: srcField(shared), reason: "mode exactly 0755, found 0700"},
	{name: "shared 0775", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(src(f, shared), 0o775)) }, field: srcField(shared), reason: "mode exactly 0755, found 0775"},
	{name: "shared is a file", setup: func(t *testing.T, f *mt.Fixture) {
		must(t, os.Remove(src(f, shared)))
		mt.WriteFile(t, src(f, shared), []byte("x"), 0o755)
	}, field: srcField(shared), reason: "must be a directory, found a regular file"},
	{name: "shared symlink", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSymlink(t, src(f, shared)) }, field: srcField(shared), reason: "symbolic link"},
	{name: "shared FIFO", setup: func(t *testing.T, f *mt.Fixture) { replaceWithFIFO(t, src(f, shared)) }, field: srcField(shared), reason: "found a FIFO"},
	{name: "shared of another uid", root: true, setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chown(src(f, shared), other, other)) }, field: srcField(shared), reason: "owned by uid 1000"},
	{name: "shared ancestor 0755", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(filepath.Dir(src(f, shared)), 0o755)) }, field: srcField(shared), reason: "intermediate directory 1 below the run directory must have mode 0700"},
	{name: "shared ancestor symlink", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSymlink(t, filepath.Dir(src(f, shared))) }, field: srcField(shared), reason: "intermediate directory 1 below the run directory: a symbolic link"},
	{name: "shared ancestor of another uid", root: true, setup: func(t *testing.T, f *mt.Fixture) {
		must(t, os.Chown(filepath.Dir(src(f, shared)), other, other))
	}, field: srcField(shared), reason: "intermediate directory 1 below the run directory is owned by uid 1000"},
	{name: "shared missing", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Remove(src(f, shared))) }, field: srcField(shared), reason: "does not exist"},

	// Tool endpoints.
	{name: "endpoint socket world-writable", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(src(f, endpoint), 0o666)) }, field: srcField(endpoint), reason: "owner-only"},
	{name: "endpoint socket group-readable", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(src(f, endpoint), 0o640)) }, field: srcField(endpoint), reason: "owner-only"},
	{name: "linked endpoint is a directory", setup: func(t *testing.T, f *mt.Fixture) { replaceWithDir(t, src(f, endpoint), 0o700) }, field: srcField(endpoint), reason: "must be a Unix socket, found a directory"},
	{name: "endpoint socket symlink", setup: func(t *testing.T, f *mt.Fixture) { replaceWithSymlink(t, src(f, endpoint)) }, field: srcField(endpoint), reason: "symbolic link"},
	{name: "endpoint socket of another uid", root: true, setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chown(src(f, endpoint), other, other)) }, field: srcField(endpoint), reason: "owned by uid 1000"},
	{name: "endpoint directory 0755", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(src(f, statusDir), 0o755)) }, field: srcField(statusDir), reason: "directory must have mode 0700"},
	{name: "endpoint FIFO", setup: func(t *testing.T, f *mt.Fixture) { replaceWithFIFO(t, src(f, statusDir)) }, field: srcField(statusDir), reason: "directory or a Unix socket, found a FIFO"},
	{name: "endpoint regular file", setup: func(t *testing.T, f *mt.Fixture) {
		must(t, os.Remove(src(f, statusDir)))
		mt.WriteFile(t, src(f, statusDir), nil, 0o600)
	}, field: srcField(statusDir), reason: "directory or a Unix socket, found a regular file"},
	{name: "endpoint ancestor 0711", setup: func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(filepath.Dir(src(f, endpoint)), 0o711)) }, field: srcField(endpoint), reason: "intermediate directory 1 below the run directory must have mode 0700"},
	{name: "endpoint socket hard-linked to another", setup: func(t *testing.T, f *mt.Fixture) {
		must(t, os.Remove(src(f, statusDir)))
		must(t, os.Link(src(f, endpoint), src(f, statusDir)))
	}, field: srcField(statusDir), reason: "is the same file as leases[4].materializations[0]"},
}

func runDiskCases(t *testing.T) {
	for _, tc := range diskCases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root {
				mt.RequireRoot(t)
			}
			f := mt.New(t, mt.Base())
			if _, err := load(f); err != nil {
				t.Fatalf("fixture refused before the change: %v", err)
			}
			if tc.setup != nil {
				tc.setup(t, f)
			}
			p := f.Path
			if tc.path != nil {
				p = tc.path(f)
			}
			_, err := leasecheck.Load(p, leasecheck.Options{ManagedRoot: f.Root, Now: now, Runtime: runtimeID()})
			assertRefusal(t, err, tc.field, tc.reason)
		})
	}
}

func TestDiskRefusals(t *testing.T) { runDiskCases(t) }

// The same cases through the openat+fstat walk kernels without openat2 use.
func TestDiskRefusalsFallback(t *testing.T) {
	secfs.SetOpenatFallbackForTest(true)
	defer secfs.SetOpenatFallbackForTest(false)
	runDiskCases(t)
}

func assertRefusal(t *testing.T, err error, field, reason string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want %s: %s", field, reason)
	}
	var ae *assignment.Error
	if !errors.As(err, &ae) || !errors.Is(err, assignment.ErrInvalid) {
		t.Fatalf("error %T %v is not an *assignment.Error", err, err)
	}
	if ae.Field != field || !strings.Contains(ae.Reason, reason) {
		t.Fatalf("got %q\nwant field %q, reason containing %q", err, field, reason)
	}
	if strings.Contains(err.Error(), mt.Secret) {
		t.Fatalf("message holds secret bytes: %q", err)
	}
}

func TestAccepted(t *testing.T) {
	docs := map[string]map[string]any{"base": mt.Base()}
	for _, name := range mt.SpecExamples {
		docs[name] = mt.Example(name)
		v3 := mt.Example(name)
		v3["version"] = "3"
		v3["workspace_consumer"] = map[string]any{"uid": 1000, "gid": 1000}
		docs[name+"-v3"] = v3
	}
	for name, doc := range docs {
		t.Run(name, func(t *testing.T) {
			f := mt.New(t, doc)
			c, err := load(f)
			if err != nil {
				t.Fatal(err)
			}
			if c.Owner != uint32(os.Geteuid()) || c.Path != f.Path || c.Assignment.RunDir != f.RunDir {
				t.Fatalf("checked = %+v", c)
			}
		})
	}
	t.Run("sticky world-writable managed root", func(t *testing.T) {
		f := mt.New(t, mt.Base())
		must(t, os.Chmod(f.Root, 0o777|os.ModeSticky))
		if _, err := load(f); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("endpoint socket mode 0700", func(t *testing.T) {
		f := mt.New(t, mt.Base())
		must(t, os.Chmod(src(f, endpoint), 0o700))
		if _, err := load(f); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("standalone endpoint socket", func(t *testing.T) {
		f := mt.New(t, mt.Base())
		replaceWithSocket(t, src(f, statusDir), 0o600)
		c, err := load(f)
		if err != nil {
			t.Fatal(err)
		}
		if c.Sources[len(c.Sources)-1].Kind != "socket" {
			t.Fatalf("kind %q", c.Sources[len(c.Sources)-1].Kind)
		}
	})
	t.Run("owned by the non-root runtime", func(t *testing.T) {
		mt.RequireRoot(t)
		f := mt.New(t, mt.Base())
		must(t, filepath.Walk(f.RunDir, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, other, other)
		}))
		rt := assignment.Identity{UID: other, GID: other}
		c, err := leasecheck.Load(f.Path, leasecheck.Options{ManagedRoot: f.Root, Now: now, Runtime: rt})
		if err != nil {
			t.Fatal(err)
		}
		if c.Owner != other {
			t.Fatalf("owner %d", c.Owner)
		}
		// A root-run branchbox refuses the same tree: neither root nor its uid.
		_, err = load(f)
		assertRefusal(t, err, "assignment", "neither root nor the runtime's uid 0")
	})
}

func TestVersion3ConsumerIsNotTheRuntime(t *testing.T) {
	doc := mt.Example("spec-model-identity")
	doc["version"] = "3"
	doc["workspace_consumer"] = map[string]any{"uid": os.Geteuid(), "gid": 4242}
	f := mt.New(t, doc)
	_, err := load(f)
	if os.Geteuid() == 0 {
		assertRefusal(t, err, "workspace_consumer.uid", "non-root")
	} else {
		assertRefusal(t, err, "workspace_consumer.uid", "runtime's own uid")
	}
}

func TestExpiredLeaseOnDisk(t *testing.T) {
	f := mt.New(t, mt.Base())
	mt.Lease(f.Doc, shared)["expires_at"] = "2001-01-01T00:00:00Z"
	f.Write()
	_, err := load(f)
	assertRefusal(t, err, "leases[3].expires_at", "expired")
}

func TestRecheck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, f *mt.Fixture)
		field  string
		reason string
	}{
		{"endpoint directory became a socket", func(t *testing.T, f *mt.Fixture) { replaceWithSocket(t, src(f, statusDir), 0o600) }, srcField(statusDir), "changed type since validation (directory, now socket)"},
		{"socket replaced", func(t *testing.T, f *mt.Fixture) { replaceWithSocket(t, src(f, endpoint), 0o600) }, srcField(endpoint), "replaced by another file"},
		{"socket mode changed", func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(src(f, endpoint), 0o700)) }, srcField(endpoint), "changed mode since validation (0600, now 0700)"},
		{"linked socket became a directory", func(t *testing.T, f *mt.Fixture) { replaceWithDir(t, src(f, endpoint), 0o700) }, srcField(endpoint), "must be a Unix socket"},
		{"shared directory owner changed", func(t *testing.T, f *mt.Fixture) {
			mt.RequireRoot(t)
			must(t, os.Chown(src(f, shared), other, other))
		}, srcField(shared), "owned by uid 1000"},
		{"value rotated", func(t *testing.T, f *mt.Fixture) {
			mt.WriteFile(t, src(f, provEnv), []byte("rotated-"+mt.Secret), 0o600)
		}, srcField(provEnv), "does not match its sha256"},
		{"run directory opened up", func(t *testing.T, f *mt.Fixture) { must(t, os.Chmod(f.RunDir, 0o755)) }, "assignment", "mode 0700"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := mt.New(t, mt.Base())
			c, err := load(f)
			must(t, err)
			must(t, c.Recheck())
			tc.change(t, f)
			assertRefusal(t, c.Recheck(), tc.field, tc.reason)
		})
	}
}

func TestReadValue(t *testing.T) {
	f := mt.New(t, mt.Base())
	c, err := load(f)
	must(t, err)
	g, err := c.Assignment.AuthorizeProvider("provider-cli", []string{"MODEL_ACCESS_TOKEN"}, now)
	must(t, err)
	v, err := c.ReadValue(g.Values[0])
	must(t, err)
	if string(v) != string(mt.Content("provider-environment", provEnv, 0)) {
		t.Fatalf("value %q", v)
	}
	// Rotated after validation: refused, with no byte of either value in
	// the message.
	mt.WriteFile(t, src(f, provEnv), []byte("rotated-"+mt.Secret+"-new"), 0o600)
	_, err = c.ReadValue(g.Values[0])
	assertRefusal(t, err, srcField(provEnv), "does not match its sha256")
	// Swapped for a symlink to a file with the signed bytes: refused.
	mt.WriteFile(t, filepath.Join(f.RunDir, "materializations", "elsewhere"), v, 0o600)
	must(t, os.Remove(src(f, provEnv)))
	must(t, os.Symlink("elsewhere", src(f, provEnv)))
	_, err = c.ReadValue(g.Values[0])
	assertRefusal(t, err, srcField(provEnv), "symbolic link")
}

func TestManagedRootOption(t *testing.T) {
	f := mt.New(t, mt.Base())
	for _, root := range []string{"relative", "/", "/a/../b"} {
		_, err := leasecheck.Load(f.Path, leasecheck.Options{ManagedRoot: root, Now: now, Runtime: runtimeID()})
		if err == nil || !strings.Contains(err.Error(), "managed root") {
			t.Errorf("root %q: %v", root, err)
		}
	}
	// The default root is the literal /run/branchbox/managed.
	_, err := leasecheck.Load(f.Path, leasecheck.Options{Now: now, Runtime: runtimeID()})
	assertRefusal(t, err, "assignment", "/run/branchbox/managed/<run-id>/")
}

// TestPinnedDigest: Load reports the SHA-256 of the bytes it checked, and
// with PinnedSHA256 refuses other bytes (ErrChanged, in the ErrInvalid
// class) before parsing them, whatever they hold.
func TestPinnedDigest(t *testing.T) {
	f := mt.New(t, mt.Base())
	data, err := os.ReadFile(f.Path)
	must(t, err)
	c, err := load(f)
	must(t, err)
	sum := sha256.Sum256(data)
	if c.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("SHA256 %q", c.SHA256)
	}
	opts := leasecheck.Options{ManagedRoot: f.Root, Now: now, Runtime: runtimeID(), PinnedSHA256: c.SHA256}
	if _, err := leasecheck.Load(f.Path, opts); err != nil {
		t.Fatalf("the pinned bytes: %v", err)
	}
	for name, other := range map[string][]byte{
		"a valid document reformatted": append(append([]byte(nil), data...), '\n'),
		"garbage":                      []byte("not json " + mt.Secret),
	} {
		mt.WriteFile(t, f.Path, other, 0o600)
		_, err := leasecheck.Load(f.Path, opts)
		if !errors.Is(err, leasecheck.ErrChanged) || strings.Contains(err.Error(), mt.Secret) {
			t.Fatalf("%s: %v", name, err)
		}
		assertRefusal(t, err, "assignment", "changed since the launch validated it")
	}
}
