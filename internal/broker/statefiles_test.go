package broker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"agentbox/internal/broker"
	"agentbox/internal/wire"
)

// assertStateDirPrivate checks the state dir of a broker that ran: every
// regular file directly in it (broker.db and its -wal and -shm included,
// which must exist) is owner-only and the broker's, every directory 0700
// and the broker's, the admin socket 0600; each sandbox's socket dir is
// 0700.
func assertStateDirPrivate(t *testing.T, state string) {
	t.Helper()
	uid := os.Geteuid()
	check := func(path string, fi os.FileInfo, want os.FileMode, owner bool) {
		t.Helper()
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode()&os.ModeType != want&os.ModeType || fi.Mode().Perm()&^want.Perm() != 0 {
			t.Errorf("%s: mode %v, want %v or stricter", path, fi.Mode(), want)
		}
		if owner && int(st.Uid) != uid {
			t.Errorf("%s: owned by uid %d, want the broker's %d", path, st.Uid, uid)
		}
	}
	fi, err := os.Lstat(state)
	if err != nil {
		t.Fatal(err)
	}
	check(state, fi, os.ModeDir|0o700, true)
	entries, err := os.ReadDir(state)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		path := filepath.Join(state, e.Name())
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		seen[e.Name()] = true
		switch {
		case fi.Mode().IsRegular():
			check(path, fi, 0o600, true)
		case fi.IsDir():
			check(path, fi, os.ModeDir|0o700, true)
		case fi.Mode()&os.ModeSocket != 0:
			check(path, fi, os.ModeSocket|0o600, true)
		default:
			t.Errorf("%s: unexpected %v", path, fi.Mode())
		}
	}
	for _, name := range []string{broker.DBFile, broker.DBFile + "-wal", broker.DBFile + "-shm", broker.LockFile, broker.AdminSock, broker.SockDir, "sandboxes"} {
		if !seen[name] {
			t.Errorf("no %s in the state dir (it has %v)", name, seen)
		}
	}
	dirs, err := os.ReadDir(filepath.Join(state, broker.SockDir))
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Error("no socket dirs")
	}
	for _, d := range dirs {
		path := filepath.Join(state, broker.SockDir, d.Name())
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		// Owned by the sandbox's uid, so its agent can connect.
		check(path, fi, os.ModeDir|0o700, false)
	}
}

// TestStateFilesOwnerOnly: with a umask that hides nothing, a broker
// process that ran sandboxes and messages leaves its state dir private; a
// broker.db and WAL files an older broker left readable are made
// owner-only by the next.
func TestStateFilesOwnerOnly(t *testing.T) {
	bin, state, repo := jailbeeBin(t), shortTempDir(t), makeRepo(t)
	umask0 := []string{"sh", "-c", `umask 0 && exec "$0" "$@"`}
	p := startProcBrokerVia(t, bin, state, umask0)
	if got := procStatus(t, p.pid(), "Umask"); got != "0000" {
		t.Fatalf("the broker's umask is %s", got)
	}
	p.newSandbox(wire.NewArgs{Name: "orch", Repo: repo, Role: "orchestrator"})
	p.newSandbox(wire.NewArgs{Name: "kid", Repo: repo, Branch: "work/kid", Role: "child", Parent: "orch"})
	sendMessage(t, p.client("orch"), map[string]any{"id": "m-1", "to": "kid", "body": "hello"})
	if res, err := adminExec(t, p.adminPath(), "kid", "", "true"); err != nil || res.exit != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	assertStateDirPrivate(t, state)

	// SIGKILL leaves the WAL; an older broker made its files 0644.
	p.kill9()
	for _, name := range []string{broker.DBFile, broker.DBFile + "-wal", broker.DBFile + "-shm"} {
		if err := os.Chmod(filepath.Join(state, name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p = startProcBrokerVia(t, bin, state, umask0)
	assertStateDirPrivate(t, state)
	if got := originIDs(unread(t, p.client("kid"))); len(got) != 1 || got[0] != "m-1" {
		t.Fatalf("kid's inbox after the restart: %v", got)
	}
	sendMessage(t, p.client("orch"), map[string]any{"id": "m-2", "to": "kid", "body": "again"})
	assertStateDirPrivate(t, state)
}

// procStatus is one field of /proc/<pid>/status.
func procStatus(t testing.TB, pid int, field string) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}
