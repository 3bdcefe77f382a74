package local_test

import (
	"errors"
	"os"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
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
