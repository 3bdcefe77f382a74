package example

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/leasecheck"
	"agentbox/internal/managed/runlayout"
)

var now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func self() assignment.Identity {
	return assignment.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
}

// TestDocumentValidForAnyRuntime: the document of every version passes
// every document rule whatever the runtime's uid and gid, including the
// ones the example's consumer would otherwise collide with.
func TestDocumentValidForAnyRuntime(t *testing.T) {
	for _, rt := range []assignment.Identity{
		{UID: 0, GID: 0}, {UID: FirstConsumerID, GID: FirstConsumerID},
		{UID: FirstConsumerID, GID: FirstConsumerID + 1}, {UID: FirstConsumerID + 1, GID: FirstConsumerID},
		{UID: 4242, GID: 4243}, self(),
	} {
		id := ConsumerID(rt)
		if id == 0 || id == rt.UID || id == rt.GID {
			t.Fatalf("consumer %d for runtime %+v", id, rt)
		}
		for _, v := range Versions {
			p := PathsFor("/srv/try", v)
			doc, err := Document(p, v, now, rt)
			if err != nil {
				t.Fatal(err)
			}
			data, err := runlayout.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			a, err := assignment.Parse(data, assignment.Options{Now: now, ManagedRoot: p.ManagedRoot, Runtime: &rt})
			if err != nil {
				t.Fatalf("v%s runtime %+v: %v", v, rt, err)
			}
			if a.RunDir != p.RunDir {
				t.Fatalf("run dir %s, want %s", a.RunDir, p.RunDir)
			}
			if err := a.RequireManagedLaunch(rt); err == nil {
				t.Fatalf("v%s: a launch would accept the example, which has no preloaded images", v)
			}
			// Still live just before the expiry, not at it.
			if _, err := assignment.Parse(data, assignment.Options{Now: now.Add(LeaseLifetime - time.Second), ManagedRoot: p.ManagedRoot, Runtime: &rt}); err != nil {
				t.Fatalf("v%s before expiry: %v", v, err)
			}
		}
	}
	if _, err := Document(PathsFor("/srv/try", "4"), "4", now, self()); err == nil {
		t.Fatal("version 4 accepted")
	}
}

// TestDefaultRoot: DIR /run/branchbox makes the default managed root, and
// the printed steps need no BRANCHBOX_MANAGED_ROOT.
func TestDefaultRoot(t *testing.T) {
	r := &Result{Paths: PathsFor("/run/branchbox", DefaultVersion), Version: DefaultVersion}
	if r.ManagedRoot != assignment.DefaultManagedRoot {
		t.Fatalf("managed root %s", r.ManagedRoot)
	}
	for _, s := range r.NextSteps() {
		if strings.Contains(s.Command, leasecheck.ManagedRootEnv) {
			t.Fatalf("step sets the default root: %s", s.Command)
		}
	}
	r = &Result{Paths: PathsFor("/srv/try", DefaultVersion), Version: DefaultVersion}
	for _, s := range r.NextSteps() {
		if !strings.Contains(s.Command, leasecheck.ManagedRootEnv+"=/srv/try/managed ") {
			t.Fatalf("step misses the root: %s", s.Command)
		}
	}
}

// TestMaxDirBytes: a DIR of MaxDirBytes makes a valid document, one more
// byte breaks the executable rule (version 1 names no executable).
func TestMaxDirBytes(t *testing.T) {
	if MaxDirBytes != 107 {
		t.Fatalf("MaxDirBytes = %d; docs/branchbox.md says 107", MaxDirBytes)
	}
	parse := func(dir, v string) error {
		p := PathsFor(dir, v)
		doc, err := Document(p, v, now, self())
		if err != nil {
			return err
		}
		data, err := runlayout.Marshal(doc)
		if err != nil {
			return err
		}
		rt := self()
		_, err = assignment.Parse(data, assignment.Options{Now: now, ManagedRoot: p.ManagedRoot, Runtime: &rt})
		return err
	}
	dir := "/" + strings.Repeat("d", MaxDirBytes-1)
	if err := parse(dir, DefaultVersion); err != nil {
		t.Fatalf("at the bound: %v", err)
	}
	if err := parse(dir+"d", DefaultVersion); err == nil || !strings.Contains(err.Error(), "leases[0].executable") {
		t.Fatalf("past the bound: %v", err)
	}
	if err := parse(dir+"d", assignment.Version1); err != nil {
		t.Fatalf("version 1 past the bound: %v", err)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"/tmp/try/managed": "/tmp/try/managed",
		"/tmp/it's":        `'/tmp/it'\''s'`,
		"/tmp/$HOME":       "'/tmp/$HOME'",
		"/tmp/a;b":         "'/tmp/a;b'",
		"":                 "''",
	} {
		if got := ShellQuote(in); got != want {
			t.Errorf("ShellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestWriteRemovesWhatItCreated: when the final check fails, every entry
// Write created is removed again; an existing DIR stays, empty.
func TestWriteRemovesWhatItCreated(t *testing.T) {
	defer func(old func(string, leasecheck.Options) (*leasecheck.Checked, error)) { check = old }(check)
	check = func(string, leasecheck.Options) (*leasecheck.Checked, error) {
		return nil, errors.New("planted failure")
	}
	base := t.TempDir()
	existing := filepath.Join(base, "existing")
	if err := os.Mkdir(existing, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(base, "new"), existing} {
		_, err := Write(Options{Dir: dir, Version: DefaultVersion, Now: now, Runtime: self()})
		if err == nil || !strings.Contains(err.Error(), "planted failure") {
			t.Fatalf("%s: %v", dir, err)
		}
	}
	entries, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "existing" {
		t.Fatalf("left behind: %v", entries)
	}
	if left, _ := os.ReadDir(existing); len(left) != 0 {
		t.Fatalf("left in the existing DIR: %v", left)
	}
}

func TestWriteNeedsAbsoluteDir(t *testing.T) {
	for _, dir := range []string{"relative", "/"} {
		if _, err := Write(Options{Dir: dir, Version: DefaultVersion, Now: now, Runtime: self()}); err == nil {
			t.Errorf("%q accepted", dir)
		}
	}
}
