package local_test

import (
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/testutil/wait"
)

// TestHostMountLastsUntilStop: a named mount needs a running sandbox and
// ends with its unit; after a restart the name attaches again.
func TestHostMountLastsUntilStop(t *testing.T) {
	f := newFixture(t)
	x := f.create("mountstop", testLimits)
	m := backend.HostMount{Name: "d", Source: backendtest.HostDir(t), ReadOnly: true}
	if err := f.b.AttachMount(t.Context(), x.name, m); !errors.Is(err, backend.ErrNotRunning) {
		t.Fatalf("AttachMount to a stopped sandbox: %v, want ErrNotRunning", err)
	}
	if err := f.b.Start(t.Context(), x.name); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := f.b.AttachMount(t.Context(), x.name, m); err != nil {
			t.Fatal(err)
		}
		if got := backendtest.Sh(t, f.b, x.name, "cat "+m.Path()+"/hello"); got != "hi" {
			t.Fatalf("the mount holds %q", got)
		}
		if err := f.b.Stop(t.Context(), x.name); err != nil {
			t.Fatal(err)
		}
		if err := f.b.Start(t.Context(), x.name); err != nil {
			t.Fatal(err)
		}
		if got := backendtest.Sh(t, f.b, x.name, "ls -A "+backend.HostMountDir); got != "" {
			t.Fatalf("after a restart %s holds %q", backend.HostMountDir, got)
		}
	}
}

// TestHostMountLeavesBrokerAlone: attaching and detaching enter the
// sandbox's mount namespace on a thread of their own; the broker's own
// mount table (its main thread's, /proc/self) never changes.
func TestHostMountLeavesBrokerAlone(t *testing.T) {
	f := newFixture(t)
	x := f.start("mountself", testLimits)
	before, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	m := backend.HostMount{Name: "d", Source: backendtest.HostDir(t)}
	for range 20 {
		if err := f.b.AttachMount(t.Context(), x.name, m); err != nil {
			t.Fatal(err)
		}
		if err := f.b.DetachMount(t.Context(), x.name, m.Device()); err != nil {
			t.Fatal(err)
		}
		if after, err := os.ReadFile("/proc/self/mountinfo"); err != nil || string(after) != string(before) {
			t.Fatalf("the broker's mount table changed (%v)", err)
		}
	}
}

// TestHostMountDetachThreadCwd: a thread with a working directory of its
// own (unshare CLONE_FS) inside the mount, the process's leader elsewhere,
// does not keep reading it after the detach.
func TestHostMountDetachThreadCwd(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on the host (the sandbox runs the host's)")
	}
	f := newFixture(t)
	x := f.start("mountthread", testLimits)
	m := backend.HostMount{Name: "d", Source: backendtest.HostDir(t), ReadOnly: true}
	if err := f.b.AttachMount(t.Context(), x.name, m); err != nil {
		t.Fatal(err)
	}
	script := `
import ctypes, os, threading, time
def reader():
    if ctypes.CDLL(None, use_errno=True).unshare(0x200) != 0:  # CLONE_FS
        raise SystemExit("unshare failed")
    os.chdir("` + m.Path() + `")
    open("/tmp/reading", "w").close()
    while True:
        open("hello").read()
        time.sleep(0.05)
t = threading.Thread(target=reader, daemon=True)
t.start()
t.join()
`
	done := make(chan int, 1)
	go func() {
		code, _ := f.b.Exec(t.Context(), x.name, backend.ExecOptions{Argv: []string{"python3", "-c", script}, Dir: "/tmp"})
		done <- code
	}()
	wait.For(t, "the reader", func() bool {
		return backendtest.Exec(t, f.b, x.name, backend.ExecOptions{Argv: []string{"test", "-e", "/tmp/reading"}}).Code == 0
	})
	if err := f.b.DetachMount(t.Context(), x.name, m.Device()); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code == 0 {
			t.Fatal("the reader ended well")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a thread still reads the detached mount")
	}
}
