package incus_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/incus"
	"agentbox/internal/backend/incus/incustest"
	"agentbox/internal/testutil/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

var testLimits = backend.Limits{Pids: 256, MemoryBytes: 512 << 20, CPUWeight: 100}

// newBackend is an Incus backend in a project of its own (images and
// profiles shared with the default project), removed with everything in
// it when the test ends.
func newBackend(t *testing.T) *incus.Backend {
	t.Helper()
	b, _ := newBackendIn(t)
	return b
}

// newBackendIn is newBackend, with the name of its project.
func newBackendIn(t *testing.T) (*incus.Backend, string) {
	t.Helper()
	project := incustest.Project(t)
	b, err := incus.New(context.Background(), incus.Options{Project: project, Pool: incustest.Pool(), Client: testbin.Jailbee(t)})
	if err != nil {
		t.Fatal(err)
	}
	return b, project
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend { return newBackend(t) },
		backendtest.Options{Limits: testLimits})
}

// TestLabelsAndNoGuestAPI: a sandbox carries its labels as user.jailbee.*
// config keys, and the guest API that would show them (a host path among
// them) inside the container is off.
func TestLabelsAndNoGuestAPI(t *testing.T) {
	b, project := newBackendIn(t)
	ctx := context.Background()
	labels := map[string]string{"role": "child", "parent": "lead", "branch": "fix/x", "repo": "/srv/secret-host-path"}
	if _, err := b.Create(ctx, backend.CreateOptions{Name: "labelled", Labels: labels}); err != nil {
		t.Fatal(err)
	}
	for k, v := range labels {
		out, err := exec.Command("incus", "config", "get", "--project", project, "labelled", "user.jailbee."+k).Output()
		if err != nil || strings.TrimSpace(string(out)) != v {
			t.Errorf("user.jailbee.%s = %q, %v; want %q", k, out, err, v)
		}
	}
	if err := b.Start(ctx, "labelled"); err != nil {
		t.Fatal(err)
	}
	r := backendtest.Exec(t, b, "labelled", backend.ExecOptions{User: "root", Argv: []string{"sh", "-c", "test -e /dev/incus/sock || test -e /dev/lxd/sock; echo $?"}})
	if strings.TrimSpace(r.Stdout) != "1" {
		t.Fatalf("the guest API socket is there: %+v", r)
	}
	if _, err := b.Create(ctx, backend.CreateOptions{Name: "bad-label", Labels: map[string]string{"managed": "false"}}); err == nil {
		t.Fatal("a label replaced the managed key")
	}
}
