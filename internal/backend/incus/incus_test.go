package incus_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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
	return openIn(t, project, nil), project
}

// openIn is a backend on project with agents on its sandboxes' PATH.
func openIn(t *testing.T, project string, agents map[string]string) *incus.Backend {
	t.Helper()
	b, err := incus.New(context.Background(), incus.Options{Project: project, Pool: incustest.Pool(), Client: testbin.Jailbee(t), AgentBinaries: agents})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend { return newBackend(t) },
		backendtest.Options{Limits: testLimits, WithAgents: func(t *testing.T, agents map[string]string) backend.Backend {
			return openIn(t, incustest.Project(t), agents)
		}})
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

// TestChangedBehindTheBackend: Exec skips its own look at a container
// it last saw running, so a container stopped, deleted or replaced with
// Incus's own tools since must still give the right error, not a command
// status; and a name taken outside jailbee is refused at Create.
func TestChangedBehindTheBackend(t *testing.T) {
	b, project := newBackendIn(t)
	ctx := context.Background()
	incusDo := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("incus", append([]string{"--project", project}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("incus %v: %v: %s", args, err, out)
		}
	}
	exit0 := backend.ExecOptions{Argv: []string{"true"}}
	for _, name := range []string{"a", "b", "c"} {
		if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
		if code, err := b.Exec(ctx, name, exit0); err != nil || code != 0 {
			t.Fatalf("exec in %s: %d %v", name, code, err)
		}
	}
	incusDo("stop", "--force", "a")
	if _, err := b.Exec(ctx, "a", exit0); !errors.Is(err, backend.ErrNotRunning) {
		t.Errorf("exec in a container stopped outside: %v, want ErrNotRunning", err)
	}
	incusDo("delete", "--force", "b")
	if _, err := b.Exec(ctx, "b", exit0); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("exec in a container deleted outside: %v, want ErrNotFound", err)
	}
	// c replaced by a container jailbee did not make, under its name.
	incusDo("delete", "--force", "c")
	incusDo("init", incus.DefaultImage, "c", "-q")
	incusDo("start", "c")
	if _, err := b.Create(ctx, backend.CreateOptions{Name: "c"}); !errors.Is(err, backend.ErrExists) {
		t.Errorf("create over a name taken outside: %v, want ErrExists", err)
	}
	if _, err := b.List(ctx); err != nil {
		t.Fatal(err)
	}
	// Once listed (each broker round lists; until then a command could run
	// in the stranger, which only someone with Incus's own rights could
	// have put there), the stranger is known for what it is.
	if _, err := b.Exec(ctx, "c", exit0); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("exec in a stranger after a List: %v, want ErrNotFound", err)
	}
}

// TestCreateWithoutTheImage: a missing image says the one step to take.
func TestCreateWithoutTheImage(t *testing.T) {
	project := incustest.Project(t)
	b, err := incus.New(context.Background(), incus.Options{Project: project, Image: "jailbee-missing-image"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Create(context.Background(), backend.CreateOptions{Name: "x"})
	if err == nil || err.Error() != `no image "jailbee-missing-image" in Incus: run 'jailbee image build' once` {
		t.Fatalf("create without the image: %v", err)
	}
}

// TestReattachSameDirKeepsTheSocket: a restarted broker attaches the
// directory a sandbox already has; the socket never leaves the container
// (a client connecting then must find it).
func TestReattachSameDirKeepsTheSocket(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	if _, err := b.Create(ctx, backend.CreateOptions{Name: "s"}); err != nil {
		t.Fatal(err)
	}
	dir := backendtest.SocketDir(t, "hello\n")
	if err := b.AttachSocket(ctx, "s", backend.OrchestrationSocket, dir); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	// A watcher inside notes any moment the socket is missing.
	backendtest.Exec(t, b, "s", backend.ExecOptions{Argv: []string{"sh", "-c",
		`nohup sh -c 'while :; do test -S /run/jailbee/orchestration/broker.sock || echo gone >> /tmp/watch; done' >/dev/null 2>&1 &`}})
	for range 3 {
		if err := b.AttachSocket(ctx, "s", backend.OrchestrationSocket, dir); err != nil {
			t.Fatal(err)
		}
	}
	r := backendtest.Exec(t, b, "s", backend.ExecOptions{Argv: []string{"sh", "-c",
		"cat /tmp/watch 2>/dev/null | wc -l; test -S /run/jailbee/orchestration/broker.sock && echo there"}})
	if r.Stdout != "0\nthere\n" {
		t.Fatalf("the socket went missing while the same directory was attached again (times seen missing, then whether it is back): %q", r.Stdout)
	}
}

// TestAgentDevicesFollowTheBroker: a sandbox made before the broker had
// an agent, or with another version of it, runs the broker's current
// binary from its next start; one whose broker has the agent no more
// loses the device (whose source may be gone).
func TestAgentDevicesFollowTheBroker(t *testing.T) {
	project := incustest.Project(t)
	ctx := context.Background()
	dir := t.TempDir()
	bins := map[string]string{}
	for _, v := range []string{"1", "2"} {
		bins[v] = filepath.Join(dir, "fakeagent-"+v)
		if err := os.WriteFile(bins[v], []byte("#!/bin/sh\necho version "+v+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := func(b *incus.Backend) string {
		t.Helper()
		r := backendtest.Exec(t, b, "s", backend.ExecOptions{Argv: []string{"sh", "-c", "fakeagent 2>/dev/null || echo none"}})
		return strings.TrimSpace(r.Stdout)
	}
	restart := func(b *incus.Backend) {
		t.Helper()
		if err := b.Stop(ctx, "s"); err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx, "s"); err != nil {
			t.Fatal(err)
		}
	}
	old := openIn(t, project, nil)
	if _, err := old.Create(ctx, backend.CreateOptions{Name: "s"}); err != nil {
		t.Fatal(err)
	}
	if err := old.Start(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if got := run(old); got != "none" {
		t.Fatalf("without agents: %q", got)
	}
	for _, v := range []string{"1", "2"} {
		b := openIn(t, project, map[string]string{"fakeagent": bins[v]})
		b.List(ctx) // as a broker's first round: the container is known
		restart(b)
		if got := run(b); got != "version "+v {
			t.Fatalf("after a start by a broker with version %s: %q", v, got)
		}
	}
	if err := os.Remove(bins["2"]); err != nil {
		t.Fatal(err)
	}
	restart(old)
	if got := run(old); got != "none" {
		t.Fatalf("after a start by a broker without the agent: %q", got)
	}
	out, err := exec.Command("incus", "config", "device", "list", "--project", project, "s").Output()
	if err != nil || strings.Contains(string(out), "jailbee-agent-") {
		t.Fatalf("devices after the agent went: %q, %v", out, err)
	}
}

// TestNoProfileReachesASandbox: a project whose default profile holds
// more than a root disk (here a host directory; on a host set up with
// `incus admin init`, a NIC on the NAT bridge, which would give root
// inside the network). A new sandbox takes only the profile's root pool;
// one made the old way, with the profile, loses it at its next start and
// keeps its root disk.
func TestNoProfileReachesASandbox(t *testing.T) {
	incustest.Project(t) // skips without Incus
	project := "jbtest-prof-" + strings.ToLower(rand.Text()[:8])
	incusDo := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("incus", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("incus %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	incusDo("project", "create", project, "-c", "features.images=false", "-c", "features.profiles=true")
	t.Cleanup(func() {
		for _, name := range []string{"fresh", "old"} {
			exec.Command("incus", "delete", "--project", project, "--force", name).Run()
		}
		if out, err := exec.Command("incus", "project", "delete", project).CombinedOutput(); err != nil {
			t.Errorf("delete project %s: %v: %s", project, err, out)
		}
	})
	pool := incustest.Pool()
	if pool == "" {
		pool = "default"
	}
	shared := t.TempDir()
	if err := os.WriteFile(filepath.Join(shared, "marker"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(shared, 0o755)
	incusDo("profile", "device", "add", "--project", project, "default", "root", "disk", "path=/", "pool="+pool)
	incusDo("profile", "device", "add", "--project", project, "default", "from-profile", "disk", "source="+shared, "path=/mnt/from-profile")
	b, err := incus.New(context.Background(), incus.Options{Project: project, Client: testbin.Jailbee(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	check := func(name string) {
		t.Helper()
		if err := b.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
		r := backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"sh", "-c", "test -e /mnt/from-profile/marker; echo $?"}})
		if strings.TrimSpace(r.Stdout) != "1" {
			t.Errorf("%s sees the profile's device: %+v", name, r)
		}
		if got := incusDo("query", "/1.0/instances/"+name+"?project="+project); !strings.Contains(got, `"profiles": []`) {
			t.Errorf("%s has profiles:\n%s", name, got)
		}
	}
	if _, err := b.Create(ctx, backend.CreateOptions{Name: "fresh"}); err != nil {
		t.Fatal(err)
	}
	check("fresh")
	// A sandbox as jailbee made them before: the profile, and its root
	// disk from it. A new broker (a new backend) starts it.
	if _, err := b.Create(ctx, backend.CreateOptions{Name: "old"}); err != nil {
		t.Fatal(err)
	}
	incusDo("profile", "assign", "--project", project, "old", "default")
	incusDo("config", "device", "remove", "--project", project, "old", "root")
	b, err = incus.New(ctx, incus.Options{Project: project, Client: testbin.Jailbee(t)})
	if err != nil {
		t.Fatal(err)
	}
	check("old")
	if got := incusDo("config", "device", "get", "--project", project, "old", "root", "pool"); strings.TrimSpace(got) != pool {
		t.Errorf("old's root disk is in pool %q, want %q", got, pool)
	}
}
