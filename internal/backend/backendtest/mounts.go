package backendtest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/testutil/wait"
)

// HostDir makes a host directory for named mounts holding hello ("hi"),
// writable to every uid (a sandbox writes as its own unprivileged uid).
func HostDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "hello"), "hi\n")
	return dir
}

// attach attaches m to the running sandbox name and detaches it when the
// test ends.
func (s *suite) attach(name string, m backend.HostMount) {
	s.t.Helper()
	if err := s.b.AttachMount(s.t.Context(), name, m); err != nil {
		s.t.Fatalf("AttachMount(%s, %s): %v", name, m.Name, err)
	}
	s.t.Cleanup(func() { s.b.DetachMount(s.t.Context(), name, m.Device()) })
}

// testHostMountReadWrite: a read-write mount is the host directory, both
// ways; a read-only one of the same directory refuses writes; a detached
// mount is gone and the same name attaches again.
func testHostMountReadWrite(s *suite) {
	t, b := s.t, s.b
	name := s.started("hostmount")
	dir := HostDir(t)
	rw := backend.HostMount{Name: "data", Source: dir}
	// The longest name: its device name is longer still.
	ro := backend.HostMount{Name: "data.ro_" + strings.Repeat("x", 56), Source: dir, ReadOnly: true}
	s.attach(name, rw)
	s.attach(name, ro)
	if got := Sh(t, b, name, "cat "+rw.Path()+"/hello "+ro.Path()+"/hello"); got != "hi\nhi" {
		t.Fatalf("the mounts hold %q", got)
	}
	Sh(t, b, name, "echo from-inside > "+rw.Path()+"/new")
	if data, err := os.ReadFile(filepath.Join(dir, "new")); err != nil || string(data) != "from-inside\n" {
		t.Fatalf("the host sees %q, %v", data, err)
	}
	writeFile(t, filepath.Join(dir, "later"), "host\n")
	if got := Sh(t, b, name, "cat "+ro.Path()+"/later"); got != "host" {
		t.Fatalf("the read-only mount shows %q", got)
	}
	r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "echo x > " + ro.Path() + "/hello"}})
	if r.Code == 0 || !strings.Contains(r.Stderr, "Read-only file system") {
		t.Fatalf("a write to the read-only mount: exit %d, %q", r.Code, r.Stderr)
	}
	if err := b.AttachMount(t.Context(), name, rw); err == nil {
		t.Fatal("a name attached twice was accepted")
	}
	for _, m := range []backend.HostMount{rw, ro} {
		if err := b.DetachMount(t.Context(), name, m.Device()); err != nil {
			t.Fatal(err)
		}
		if err := b.DetachMount(t.Context(), name, m.Device()); err != nil {
			t.Fatalf("detaching twice: %v", err)
		}
		if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "cat " + m.Path() + "/hello"}}); r.Code == 0 {
			t.Fatalf("%s still shows the host directory after the detach", m.Path())
		}
	}
	if data, err := os.ReadFile(filepath.Join(dir, "hello")); err != nil || string(data) != "hi\n" {
		t.Fatalf("the host directory after the detach: %q, %v", data, err)
	}
	s.attach(name, rw)
	if got := Sh(t, b, name, "cat "+rw.Path()+"/new"); got != "from-inside" {
		t.Fatalf("attached again: %q", got)
	}
}

// testHostMountDetachWhileReading: processes reading the mount, with
// their working directory and an open file in it, do not keep reading
// the host directory after the detach.
func testHostMountDetachWhileReading(s *suite) {
	t, b := s.t, s.b
	name := s.started("mountread")
	m := backend.HostMount{Name: "feed", Source: HostDir(t), ReadOnly: true}
	s.attach(name, m)
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var out strings.Builder
		code, err := b.Exec(t.Context(), name, backend.ExecOptions{Argv: []string{"sh", "-c",
			"cd " + m.Path() + " && exec 3<hello && touch /tmp/reading && while cat hello >/dev/null && cat <&3 >/dev/null; do sleep 0.05; done; echo stopped; ls"},
			Stdout: &out})
		if err == nil && strings.Contains(out.String(), "hello") {
			err = errors.New("the reader still lists the detached mount: " + out.String())
		}
		done <- result{code, err}
	}()
	wait.For(t, "the reader", func() bool {
		return Exec(t, b, name, backend.ExecOptions{Argv: []string{"test", "-e", "/tmp/reading"}}).Code == 0
	})
	if err := b.DetachMount(t.Context(), name, m.Device()); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.code == 0 {
			t.Fatalf("the reader ended with %d, %v", r.code, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader still reads the detached mount")
	}
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"sh", "-c", "cat " + m.Path() + "/hello"}}); r.Code == 0 {
		t.Fatal("the detached mount is still in the sandbox's view")
	}
	if got := Sh(t, b, name, "echo alive"); got != "alive" {
		t.Fatalf("the sandbox after the detach: %q", got)
	}
}

// testHostMountSymlinks: a host path through a symlink is refused; the
// agent cannot replace a mount point to redirect a mount.
func testHostMountSymlinks(s *suite) {
	t, b := s.t, s.b
	name := s.started("mountlink")
	dir := HostDir(t)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{link, link + "/.", filepath.Join(link, "..", filepath.Base(dir)), "relative", "/"} {
		m := backend.HostMount{Name: "sneaky", Source: src}
		err := b.AttachMount(t.Context(), name, m)
		if err == nil {
			b.DetachMount(t.Context(), name, m.Device())
			t.Fatalf("AttachMount from %q was accepted", src)
		}
		if strings.Contains(err.Error(), dir) || strings.Contains(err.Error(), link) {
			t.Fatalf("the error names a host path: %v", err)
		}
	}
	if r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"test", "-e", backend.HostMountDir + "/sneaky/hello"}}); r.Code == 0 {
		t.Fatal("a refused mount is in the sandbox")
	}
	m := backend.HostMount{Name: "target", Source: dir}
	// Before and after the attach, the agent tries to put its own
	// directory or a symlink where the mount goes.
	redirect := "mkdir -p " + backend.HostMountDir + " 2>/dev/null; ln -s /home/agent " + m.Path() + " 2>/dev/null; mv " + m.Path() + " " + m.Path() + ".old 2>/dev/null; ln -sfn /home/agent " + m.Path() + " 2>/dev/null; true"
	Sh(t, b, name, redirect)
	s.attach(name, m)
	Sh(t, b, name, redirect)
	if got := Sh(t, b, name, "cat "+m.Path()+"/hello; test -L "+m.Path()+" && echo link; ls /home/agent"); got != "hi" {
		t.Fatalf("after the agent's redirects the mount shows %q", got)
	}
}

// testHostMountDestroy: destroying a sandbox with a read-write mount
// attached leaves the host directory and its files alone.
func testHostMountDestroy(s *suite) {
	t, b := s.t, s.b
	name := s.started("mountdestroy")
	dir := HostDir(t)
	m := backend.HostMount{Name: "keep", Source: dir}
	if err := b.AttachMount(t.Context(), name, m); err != nil {
		t.Fatal(err)
	}
	Sh(t, b, name, "mkdir "+m.Path()+"/sub && echo x > "+m.Path()+"/sub/f && chmod 0500 "+m.Path()+"/sub")
	if err := b.Destroy(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"hello", "sub/f"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("after Destroy the host directory lost %s: %v", f, err)
		}
	}
}
