package incus_test

import (
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"strings"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/incus"
	"agentbox/internal/testutil/testbin"
)

// RequireEnv set to 1 (as .ci/run sets it) makes a missing Incus or image
// a failure instead of a skip.
const RequireEnv = "JAILBEE_TEST_INCUS"

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
	ctx := context.Background()
	if _, err := incus.New(ctx, incus.Options{}); err != nil {
		need(t, err)
	}
	project := "jbtest-" + strings.ToLower(rand.Text()[:10])
	if out, err := exec.Command("incus", "project", "create", project, "-c", "features.images=false", "-c", "features.profiles=false").CombinedOutput(); err != nil {
		t.Fatalf("incus project create: %v: %s", err, out)
	}
	t.Cleanup(func() { removeProject(t, project) })
	b, err := incus.New(ctx, incus.Options{Project: project, Client: testbin.Jailbee(t)})
	if err != nil {
		t.Fatal(err)
	}
	if !b.HasImage(ctx) {
		need(t, errNoImage)
	}
	return b, project
}

var errNoImage = errorString("the jailbee image is missing: run 'jailbee image build'")

type errorString string

func (e errorString) Error() string { return string(e) }

// need skips the test, or fails it when .ci/run asked for Incus.
func need(t *testing.T, err error) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("Incus was asked for (%s=1): %v", RequireEnv, err)
	}
	t.Skipf("no Incus here (%v); set %s=1 to make this a failure", err, RequireEnv)
}

// removeProject deletes every instance of project, then the project.
func removeProject(t *testing.T, project string) {
	out, err := exec.Command("incus", "list", "--project", project, "-f", "csv", "-c", "n").Output()
	if err != nil {
		t.Errorf("list project %s: %v", project, err)
	}
	for _, name := range strings.Fields(string(out)) {
		exec.Command("incus", "delete", "--project", project, "--force", name).Run()
	}
	if out, err := exec.Command("incus", "project", "delete", project).CombinedOutput(); err != nil {
		t.Errorf("delete project %s: %v: %s", project, err, out)
	}
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
