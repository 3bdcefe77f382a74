package provider_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/assignment"
	mt "agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/provider"
	"agentbox/internal/secfs"
)

// other is a uid that is neither root nor the runtime's (when root).
const other = 1000

// providerTree lays out base/opt/agent/bin/provider, every directory 0755
// and the provider a 0755 script printing "good", and returns the
// provider's path.
func providerTree(t *testing.T) (base, exe string) {
	t.Helper()
	base = t.TempDir()
	bin := filepath.Join(base, "opt", "agent", "bin")
	must(t, os.MkdirAll(bin, 0o755))
	for _, d := range []string{filepath.Join(base, "opt"), filepath.Join(base, "opt", "agent"), bin} {
		must(t, os.Chmod(d, 0o755))
	}
	exe = filepath.Join(bin, "provider")
	mt.WriteFile(t, exe, []byte("#!/bin/sh\necho good\n"), 0o755)
	return base, exe
}

// authorize checks exe as the signed executable of the spec's example.
func authorize(t *testing.T, exe string) (*provider.Plan, error) {
	t.Helper()
	_, c := fixture(t, exe)
	return provider.Authorize(c, provider.Request{Executable: exe, Inherit: []string{"MODEL_ACCESS_TOKEN"}}, now)
}

func wantRefused(t *testing.T, err error, base, reason string) {
	t.Helper()
	if err == nil || !errors.Is(err, assignment.ErrInvalid) || !strings.Contains(err.Error(), reason) {
		t.Fatalf("err = %v, want a refusal %q", err, reason)
	}
	if strings.Contains(err.Error(), base) {
		t.Fatalf("the refusal names a host path: %q", err)
	}
}

// TestExecutableRefusals: the signed executable and every directory above
// it must be owned by root or the runtime and writable by no one else,
// and no symbolic link on its path is followed.
func TestExecutableRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		root   bool
		setup  func(t *testing.T, base, exe string)
		reason string
	}{
		{"executable group-writable", false, func(t *testing.T, base, exe string) { must(t, os.Chmod(exe, 0o775)) }, "is group- or other-writable (mode 0775)"},
		{"executable other-writable", false, func(t *testing.T, base, exe string) { must(t, os.Chmod(exe, 0o757)) }, "is group- or other-writable (mode 0757)"},
		{"directory above group-writable", false, func(t *testing.T, base, exe string) {
			must(t, os.Chmod(filepath.Join(base, "opt", "agent"), 0o775))
		}, "the directory 2 level(s) above it is group- or other-writable without the sticky bit (mode 0775)"},
		{"directory above world-writable", false, func(t *testing.T, base, exe string) {
			must(t, os.Chmod(filepath.Join(base, "opt"), 0o777))
		}, "the directory 3 level(s) above it is group- or other-writable without the sticky bit"},
		{"executable a symlink", false, func(t *testing.T, base, exe string) {
			must(t, os.Rename(exe, exe+"-real"))
			must(t, os.Symlink("provider-real", exe))
		}, "symbolic link"},
		{"directory above a symlink", false, func(t *testing.T, base, exe string) {
			agent := filepath.Join(base, "opt", "agent")
			must(t, os.Rename(agent, agent+"-real"))
			must(t, os.Symlink("agent-real", agent))
		}, "symbolic link"},
		{"executable of another uid", true, func(t *testing.T, base, exe string) { must(t, os.Lchown(exe, other, other)) }, "is owned by uid 1000, neither root nor the runtime's uid 0"},
		{"directory above of another uid", true, func(t *testing.T, base, exe string) {
			must(t, os.Lchown(filepath.Join(base, "opt", "agent"), other, other))
		}, "the directory 2 level(s) above it is owned by uid 1000, neither root nor the runtime's uid 0"},
		{"executable missing", false, func(t *testing.T, base, exe string) { must(t, os.Remove(exe)) }, "does not exist"},
		{"executable a directory", false, func(t *testing.T, base, exe string) {
			must(t, os.Remove(exe))
			must(t, os.Mkdir(exe, 0o755))
		}, "does not name an executable regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root {
				mt.RequireRoot(t)
			}
			base, exe := providerTree(t)
			tc.setup(t, base, exe)
			_, err := authorize(t, exe)
			wantRefused(t, err, base, tc.reason)
		})
	}
	t.Run("sticky world-writable directory accepted", func(t *testing.T) {
		base, exe := providerTree(t)
		must(t, os.Chmod(filepath.Join(base, "opt"), 0o777|os.ModeSticky))
		plan, err := authorize(t, exe)
		must(t, err)
		if out, code := run(t, plan, []string{"MODEL_ACCESS_TOKEN=x"}); code != 0 || out != "good\n" {
			t.Fatalf("code %d out %q", code, out)
		}
	})
	t.Run("both open walks", func(t *testing.T) {
		secfs.SetOpenatFallbackForTest(true)
		defer secfs.SetOpenatFallbackForTest(false)
		base, exe := providerTree(t)
		must(t, os.Rename(exe, exe+"-real"))
		must(t, os.Symlink("provider-real", exe))
		_, err := authorize(t, exe)
		wantRefused(t, err, base, "symbolic link")
	})
}

// TestAttackSymlinkedProviderNeverRunsAsRoot is the review's case: the
// signed executable /opt/agent/bin/provider, with /opt/agent belonging to
// uid 1000, which swaps the provider for a symbolic link to its own
// program. Root's start is refused and the program never runs, whether
// the swap came before the authorization or between it and the start.
func TestAttackSymlinkedProviderNeverRunsAsRoot(t *testing.T) {
	mt.RequireRoot(t)
	base, exe := providerTree(t)
	agent := filepath.Join(base, "opt", "agent")
	marker := filepath.Join(base, "attacker-ran")
	evil := filepath.Join(agent, "evil")
	mt.WriteFile(t, evil, []byte("#!/bin/sh\necho owned > "+marker+"\nenv >> "+marker+"\n"), 0o755)
	for _, p := range []string{agent, filepath.Join(agent, "bin"), evil} {
		must(t, os.Lchown(p, other, other))
	}
	swap := func() {
		must(t, os.Remove(exe))
		must(t, os.Symlink(evil, exe))
		must(t, os.Lchown(exe, other, other))
	}
	swap()
	_, err := authorize(t, exe)
	wantRefused(t, err, base, "owned by uid 1000")

	// The swap after authorization: authorize while the tree is root's,
	// hand it to uid 1000, which swaps; the start checks again.
	base2, exe2 := providerTree(t)
	plan, err := authorize(t, exe2)
	must(t, err)
	agent2 := filepath.Join(base2, "opt", "agent")
	must(t, os.Lchown(agent2, other, other))
	must(t, os.Remove(exe2))
	must(t, os.Symlink(evil, exe2))
	var out bytes.Buffer
	_, err = plan.Run(context.Background(), []string{"MODEL_ACCESS_TOKEN=" + mt.Secret}, nil, &out, &out)
	wantRefused(t, err, base2, "owned by uid 1000")
	if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) || out.Len() != 0 {
		t.Fatalf("the attacker's program ran: %v %q", err, out.String())
	}
}

// TestExecutesTheCheckedInode: the program that starts is the inode that
// was checked, even when the path names another file by the time the
// process is created.
func TestExecutesTheCheckedInode(t *testing.T) {
	_, exe := providerTree(t)
	plan, err := authorize(t, exe)
	must(t, err)
	cmd, err := plan.Command(context.Background(), []string{"MODEL_ACCESS_TOKEN=x"})
	must(t, err)
	defer func() {
		for _, f := range cmd.ExtraFiles {
			f.Close()
		}
	}()
	// Between the check and the start, the path is renamed over.
	swapped := exe + ".new"
	mt.WriteFile(t, swapped, []byte("#!/bin/sh\necho swapped\n"), 0o755)
	must(t, os.Rename(swapped, exe))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	must(t, cmd.Run())
	if out.String() != "good\n" {
		t.Fatalf("ran %q, not the checked program", out.String())
	}
}

// TestArgv0IsTheSignedPath: a binary started through its handle still
// gets the signed path as argv[0], and is the signed file.
func TestArgv0IsTheSignedPath(t *testing.T) {
	const sleep = "/usr/bin/sleep"
	if _, err := os.Lstat(sleep); err != nil {
		t.Skip("no " + sleep)
	}
	_, c := fixture(t, sleep)
	plan, err := provider.Authorize(c, provider.Request{Executable: sleep, Inherit: []string{"MODEL_ACCESS_TOKEN"}, Args: []string{"30"}}, now)
	must(t, err)
	cmd, err := plan.Command(context.Background(), []string{"MODEL_ACCESS_TOKEN=x"})
	must(t, err)
	must(t, cmd.Start())
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := "/proc/" + itoa(cmd.Process.Pid)
	var cmdline []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cmdline, err = os.ReadFile(pid + "/cmdline"); err == nil && len(cmdline) > 0 {
			break
		}
	}
	if string(cmdline) != sleep+"\x0030\x00" {
		t.Fatalf("cmdline %q", cmdline)
	}
	got, err := os.Readlink(pid + "/exe")
	must(t, err)
	if want, _ := filepath.EvalSymlinks(sleep); got != want {
		t.Fatalf("exe %q, want %q", got, want)
	}
}

func itoa(n int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}

// TestBareNameLookup: a bare name is found only in a trusted directory of
// the fixed PATH; a symbolic link there is refused, a directory that is a
// symbolic link (/bin -> usr/bin) is not searched.
func TestBareNameLookup(t *testing.T) {
	env, err := os.ReadFile("/usr/bin/env")
	must(t, err)
	tmp := t.TempDir()
	linked, real, writable := filepath.Join(tmp, "linked"), filepath.Join(tmp, "real"), filepath.Join(tmp, "writable")
	for _, d := range []string{real, writable} {
		must(t, os.Mkdir(d, 0o755))
	}
	must(t, os.Chmod(writable, 0o777))
	must(t, os.Symlink("real", linked))
	mt.WriteFile(t, filepath.Join(real, "codex"), env, 0o755)

	lookup := func(dirs ...string) error {
		defer provider.SetLookupDirsForTest(dirs)()
		_, c := fixture(t, "codex")
		plan, err := provider.Authorize(c, provider.Request{Executable: "codex", Inherit: []string{"MODEL_ACCESS_TOKEN"}}, now)
		if err == nil && plan.Path() != filepath.Join(real, "codex") {
			t.Fatalf("found %q", plan.Path())
		}
		return err
	}
	// The symlinked directory is skipped; its target is searched by name.
	must(t, lookup(linked, real))
	// A name in a directory others can write is refused, not skipped.
	mt.WriteFile(t, filepath.Join(writable, "codex"), env, 0o755)
	wantRefused(t, lookup(writable, real), tmp, "group- or other-writable without the sticky bit")
	must(t, os.Remove(filepath.Join(writable, "codex")))
	must(t, lookup(writable, real))
	// A symbolic link found first is refused.
	other := filepath.Join(tmp, "other")
	must(t, os.Mkdir(other, 0o755))
	must(t, os.Symlink(filepath.Join(real, "codex"), filepath.Join(other, "codex")))
	wantRefused(t, lookup(other, real), tmp, "is a symbolic link, and none is followed")
}
