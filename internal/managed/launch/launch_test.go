package launch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/compose"
	"agentbox/internal/managed/dockertest"
	"agentbox/internal/managed/engine"
	"agentbox/internal/managed/launch"
	"agentbox/internal/managed/leasecheck"
	"agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/provider"
)

const probe = managedtest.Probe

// setup is one launch's world: a repository, an assignment laid out on
// disk, and a state root.
type setup struct {
	t        testing.TB
	repo     string
	revision string
	fixture  *managedtest.Fixture
	doc      map[string]any
	cfg      launch.Config
	eng      *engine.Engine
	proxyH   uint16
}

func newSetup(t testing.TB, files map[string]string) *setup {
	t.Helper()
	return newSetupWith(t, files, nil)
}

// newSetupWith is newSetup with edit applied to the document before it
// is laid out.
func newSetupWith(t testing.TB, files map[string]string, edit func(map[string]any)) *setup {
	t.Helper()
	managedtest.RequireRoot(t)
	dockertest.Require(t)
	svc := dockertest.ImageID(t, dockertest.ServiceImageTag)
	proxy := dockertest.ImageID(t, dockertest.ProxyImageTag)
	s := &setup{t: t}
	s.repo = filepath.Join(t.TempDir(), "repo")
	s.revision = managedtest.MakeRepo(t, s.repo, files)
	s.proxyH = freePort(t)
	doc := managedtest.LaunchDoc(s.repo, s.revision, managedtest.Images{Service: svc, Proxy: proxy, ProxyPort: s.proxyH})
	if edit != nil {
		edit(doc)
	}
	s.doc = doc
	s.fixture = managedtest.New(t, doc)
	now := time.Now()
	s.cfg = launch.Config{
		StateRoot: filepath.Join(t.TempDir(), "state"),
		Runtime:   assignment.Identity{UID: 0, GID: 0},
		Checks:    leasecheck.Options{ManagedRoot: s.fixture.Root, Now: now, Runtime: assignment.Identity{}},
		Log:       testLog{t},
	}
	eng, err := engine.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	s.eng = eng
	t.Cleanup(s.teardownAll)
	return s
}

// teardownAll tears down every feature the test left, whatever it
// asserted: containers and volumes outlive the test binary.
func (s *setup) teardownAll() {
	entries, _ := os.ReadDir(filepath.Join(s.cfg.StateRoot, "features"))
	for _, e := range entries {
		if r, err := launch.Teardown(context.Background(), s.cfg, e.Name()); err != nil || !r.Verified {
			s.t.Errorf("cleanup: teardown of %s: %+v %v", e.Name(), r, err)
		}
	}
}

func defaultFiles() map[string]string { return managedtest.LaunchFiles() }

func (s *setup) start(name string) (*launch.Summary, error) {
	s.t.Helper()
	return launch.Start(context.Background(), s.cfg, launch.Request{Name: name, Repo: s.repo, Manifest: s.fixture.Path})
}

// project is the Compose project a launch of name gets.
func (s *setup) project(name string) string {
	wt := filepath.Join(s.cfg.StateRoot, "features", name, name)
	return compose.ProjectName(s.fixture.Doc["run_id"].(string), s.fixture.Path, wt)
}

// owned lists what the engine holds of the launch's project.
func (s *setup) owned(project string) engine.Owned {
	s.t.Helper()
	o, err := s.eng.Owned(context.Background(), project, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	return o
}

func TestLaunchLifecycle(t *testing.T) {
	since := time.Now()
	s := newSetup(t, defaultFiles())
	sum, err := s.start("alpha")
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	cid := sum.Runtime.ContainerID
	if starts := startEvents(engineEvents(t, sum.ComposeProjectName, since)); len(starts) == 0 {
		t.Errorf("the engine recorded no start of the launch's containers")
	}
	if sum.Runtime.ContainerUser != "1000:1000" || sum.Runtime.WorkspaceFolder != "/workspaces/alpha" ||
		sum.Runtime.InGuest.ProjectDocker != "disabled" || sum.Runtime.InGuest.TaskBranch != "task/demo" {
		t.Fatalf("summary: %+v", sum.Runtime)
	}
	if !strings.HasPrefix(sum.ComposeProjectName, "branchbox-") {
		t.Fatalf("project %q", sum.ComposeProjectName)
	}

	// Inside: the consumer, a seccomp filter, AF_VSOCK denied, the
	// worktree writable and group-shared, the connector not started.
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"id", "-u"}, "1000"},
		// The main process too, although the image's default user is root.
		{[]string{"sh", "-c", "grep ^Uid: /proc/1/status"}, "Uid:\t1000\t1000\t1000\t1000"},
		// No set-user-ID or set-group-ID bit can be set on any file.
		{[]string{"sh", "-c", "touch s && chmod u+s s 2>/dev/null || chmod g+s . 2>/dev/null || echo no-setid"}, "no-setid"},
		{[]string{"sh", "-c", "touch x && chmod 0755 x && stat -c %a x"}, "755"},
		{[]string{probe, "seccomp"}, "2"},
		{[]string{probe, "vsock"}, "vsock: denied"},
		{[]string{"sh", "-c", "echo hi > new-file && stat -c %a:%u new-file"}, "660:1000"},
		{[]string{"cat", "README"}, "a test repository"},
		{[]string{"sh", "-c", "test -e /data || echo no-host-volume"}, "no-host-volume"},
		// A private cgroup namespace: the container's cgroups are its root.
		{[]string{"sh", "-c", `test "$(grep -c -v ':/$' /proc/1/cgroup)" = 0 && echo private-cgroupns`}, "private-cgroupns"},
		// Git's metadata is reachable, as the consumer, from the worktree.
		{[]string{"sh", "-c", `cat "$(sed -n 's/^gitdir: //p' .git)/HEAD"`}, "ref: refs/heads/task/demo"},
		{[]string{"sh", "-c", "touch ../main/.git/objects/probe-write && echo objects-writable"}, "objects-writable"},
		{[]string{"sh", "-c", "touch ../main/.git/config 2>/dev/null || echo config-read-only"}, "config-read-only"},
	} {
		out, code := execIn(t, s, "alpha", tc.argv...)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%q: exit %d, output %q, want %q", tc.argv, code, out, tc.want)
		}
	}
	if out, code := execIn(t, s, "alpha", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exit status: %d %q", code, out)
	}
	if names := dockertest.Docker(t, "ps", "-a", "--filter", "label=com.docker.compose.project="+sum.ComposeProjectName, "--format", "{{.Names}}"); names != sum.ComposeProjectName+"-app-1" {
		t.Errorf("only the primary runs, got %q", names)
	}

	// The spool is its exact named volume.
	spool := compose.SpoolVolumeName("run-1", "delivery_requests")
	if got := dockertest.Docker(t, "volume", "inspect", "--format", "{{.Name}}", spool); got != spool {
		t.Errorf("spool volume %q", got)
	}

	// The provider's whole environment is the signed set.
	t.Setenv("MODEL_ACCESS_TOKEN", "model-"+managedtest.Secret)
	var stdout, stderr bytes.Buffer
	code, err := launch.ExecProvider(context.Background(), s.cfg, "alpha",
		provider.Request{Executable: probe, Inherit: []string{"MODEL_ACCESS_TOKEN"}, Args: []string{"env"}},
		os.Environ(), strings.NewReader(""), &stdout, &stderr)
	if err != nil || code != 0 {
		t.Fatalf("exec-provider: %v %d %s", err, code, stderr.String())
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		name, _, _ := strings.Cut(line, "=")
		names = append(names, name)
	}
	if want := []string{"MODEL_ACCESS_TOKEN", "PATH", "SOURCE_DELIVERY_TOKEN"}; !slices.Equal(names, want) {
		t.Fatalf("provider environment names %q, want %q", names, want)
	}
	if !strings.Contains(stdout.String(), "PATH="+provider.SafePATH+"\n") || !strings.Contains(stdout.String(), "MODEL_ACCESS_TOKEN=model-"+managedtest.Secret) {
		t.Fatalf("provider environment values: %q", stdout.String())
	}
	// A provider the lease does not name is refused.
	if _, err := launch.ExecProvider(context.Background(), s.cfg, "alpha",
		provider.Request{Executable: "/bin/sh", Inherit: []string{"MODEL_ACCESS_TOKEN"}}, os.Environ(), nil, &stdout, &stderr); err == nil {
		t.Fatal("exec-provider of an unsigned executable")
	}

	// The port proxy: loopback only, and it reaches the primary.
	dockertest.Docker(t, "exec", "-d", "-u", "1000", cid, probe, "serve", "8080")
	if got := dialRead(t, s.proxyH); got != "agentbox-probe\n" {
		t.Errorf("through the proxy: %q", got)
	}
	if bind := dockertest.Docker(t, "port", fmt.Sprintf("%s-proxy-%d", sum.ComposeProjectName, s.proxyH)); !strings.HasPrefix(bind, "8080/tcp -> 127.0.0.1:") {
		t.Errorf("the proxy's port binding: %q", bind)
	}

	st, err := launch.GetStatus(context.Background(), s.cfg, "alpha")
	if err != nil || st.Phase != launch.PhaseRunning || st.ContainerState != "running" || st.Proxies != 1 {
		t.Fatalf("status: %+v %v", st, err)
	}

	r, err := launch.Teardown(context.Background(), s.cfg, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if !r.ResidueFree || !r.Verified || len(r.Residue) != 0 {
		t.Fatalf("receipt: %+v", r)
	}
	if o := s.owned(sum.ComposeProjectName); !o.Empty() {
		t.Fatalf("left on the engine: %+v", o)
	}
	for _, src := range []string{s.fixture.Source(1, 0), s.fixture.Source(3, 0), s.fixture.Source(5, 0)} {
		if _, err := os.Lstat(src); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a materialization survived teardown: %v", err)
		}
	}
	if _, err := os.Lstat(filepath.Join(s.cfg.StateRoot, "features", "alpha")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the feature's directory survived teardown: %v", err)
	}
	if out, err := managedtest.Git(s.repo, "rev-parse", "refs/heads/task/demo"); err != nil || out != s.revision {
		t.Errorf("the task branch is kept: %q %v", out, err)
	}

	// The same assignment again, from a fresh repository snapshot (the
	// delegated one is refused, as the next test shows) and the run laid
	// out again by the orchestrator: same project, nothing in the way.
	s.fixture.Relay()
	if _, err := s.start("alpha"); !isCode(err, launch.CodeRepository) {
		t.Fatalf("a start on the delegated repository: %v", err)
	}
	if err := os.RemoveAll(s.repo); err != nil {
		t.Fatal(err)
	}
	if rev := managedtest.MakeRepo(t, s.repo, defaultFiles()); rev != s.revision {
		t.Fatalf("the snapshot's revision changed: %s", rev)
	}
	again, err := s.start("alpha")
	if err != nil {
		t.Fatalf("second start: %v", err)
	}
	if again.ComposeProjectName != sum.ComposeProjectName {
		t.Fatalf("project %s, then %s", sum.ComposeProjectName, again.ComposeProjectName)
	}
	if r, err := launch.Teardown(context.Background(), s.cfg, "alpha"); err != nil || !r.ResidueFree {
		t.Fatalf("second teardown: %+v %v", r, err)
	}
}

// TestHostileComposeRefusedBeforeAnyContainer: each fixture is refused
// by the checks, before the engine creates anything, and the failed
// launch leaves nothing.
func TestHostileComposeRefusedBeforeAnyContainer(t *testing.T) {
	app := "services:\n  app:\n    image: x\n"
	for _, tc := range []struct {
		name, compose, want string
		ghost               bool // service_images also binds "ghost"
		db                  bool // service_images also binds "db"
	}{
		{name: "include", compose: "include:\n  - other.yaml\n" + app, want: "compose.yaml: include: not allowed"},
		{name: "extends", compose: app + "  db:\n    extends:\n      service: app\n", want: "compose.yaml: services.db.extends: not allowed"},
		{name: "privileged", compose: app + "    privileged: true\n", want: `compose.yaml: services.app.privileged: not allowed`},
		{name: "host-network", compose: app + "    network_mode: host\n", want: `compose.yaml: services.app.network_mode: not allowed`},
		// The review's hostile db: root, capabilities that read and write
		// the host's disks and kernel, every device, started by the
		// primary's dependency.
		{name: "hostile-db", compose: app + "    depends_on: [db]\n  db:\n    image: y\n    user: \"0\"\n" +
			"    cap_add: [DAC_READ_SEARCH, SYS_MODULE, SYS_RAWIO]\n    device_cgroup_rules: [\"b *:* rwm\", \"c *:* rwm\"]\n",
			want: `compose.yaml: services.db.cap_add: not allowed`, db: true},
		{name: "hostile-db-devices-only", compose: app + "    depends_on: [db]\n  db:\n    image: y\n    device_cgroup_rules: [\"c 1:11 rwm\"]\n",
			want: `compose.yaml: services.db.device_cgroup_rules: not allowed`, db: true},
		{name: "db-in-the-primary-pid-namespace", compose: app + "  db:\n    image: y\n    pid: service:app\n",
			want: `compose.yaml: services.db.pid: not allowed`, db: true},
		{name: "depends-on-a-connector", compose: app + "    depends_on: [tunnel]\n  tunnel:\n    image: z\n    privileged: true\n",
			want: `compose.yaml: services.app.depends_on.tunnel: "tunnel" is not a bound service`},
		{name: "docker-socket", compose: app + "    volumes:\n      - /var/run/docker.sock:/var/run/docker.sock\n", want: "compose.yaml: services.app.volumes[0]: a container-engine socket (docker.sock)"},
		{name: "interpolation", compose: app + "    command: [\"echo\", \"${SECRET}\"]\n", want: "compose.yaml: services.app.command[1]: interpolation"},
		{name: "valueless-env", compose: app + "    environment:\n      - HOME\n", want: `compose.yaml: services.app.environment[0]: a valueless entry "HOME"`},
		{name: "unbound-service", compose: app + "  worker:\n    image: y\n", want: `"worker"`},
		{name: "extra-image", compose: app, want: `"ghost"`, ghost: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			since := time.Now()
			files := defaultFiles()
			files["compose.yaml"] = tc.compose
			s := newSetupWith(t, files, func(doc map[string]any) {
				imgs := map[string]any{"app": doc["service_images"].(map[string]any)["app"]}
				if tc.ghost {
					imgs["ghost"] = imgs["app"]
				}
				if tc.db {
					imgs["db"] = imgs["app"]
				}
				doc["service_images"] = imgs
			})
			_, err := s.start("hostile")
			if !isCode(err, launch.CodeCompose) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("start: %v, want a compose refusal naming %s", err, tc.want)
			}
			var se *launch.StartError
			if !errors.As(err, &se) || !se.Teardown.ResidueFree {
				t.Fatalf("the failed launch's teardown: %+v", se)
			}
			if o := s.owned(s.project("hostile")); !o.Empty() {
				t.Fatalf("the engine holds %+v", o)
			}
			if ev := engineEvents(t, s.project("hostile"), since); ev != "" {
				t.Fatalf("the engine saw containers of the refused launch: %s", ev)
			}
			if out, _ := managedtest.Git(s.repo, "branch", "--list", "task/demo"); out != "" {
				t.Fatalf("the branch of a launch refused before delegation is removed: %q", out)
			}
			r, err := launch.Teardown(context.Background(), s.cfg, "hostile")
			if err != nil || !r.ResidueFree {
				t.Fatalf("teardown after the failure: %+v %v", r, err)
			}
		})
	}
}

// TestBindSlippedInFailsInspection: a writable bind under the managed
// namespace added to the facade after it was generated (the attacker's
// change between generation and the engine) is caught by the final
// inspection, before anything runs in the container, and the launch is
// torn down without residue.
func TestBindSlippedInFailsInspection(t *testing.T) {
	s := newSetup(t, defaultFiles())
	evil := t.TempDir()
	s.cfg.BeforeUp = func(inputs string) error {
		p := filepath.Join(inputs, "facade.yaml")
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		extra := fmt.Sprintf("            - type: bind\n              source: %q\n              target: \"/run/branchbox/leases/shared/evil\"\n", evil)
		data = bytes.Replace(data, []byte("        volumes: !override\n"), []byte("        volumes: !override\n"+extra), 1)
		if !bytes.Contains(data, []byte("evil")) {
			return fmt.Errorf("the test could not find the primary's volumes in the facade:\n%s", data)
		}
		return os.WriteFile(p, data, 0o600)
	}
	_, err := s.start("slipped")
	if !isCode(err, launch.CodeInspection) || !strings.Contains(err.Error(), "managed-mount") {
		t.Fatalf("start: %v, want the final inspection's managed-mount refusal", err)
	}
	if strings.Contains(err.Error(), evil) {
		t.Fatalf("the refusal echoes a host path: %v", err)
	}
	var se *launch.StartError
	if !errors.As(err, &se) || !se.Teardown.ResidueFree {
		t.Fatalf("teardown: %+v", se)
	}
	if o := s.owned(s.project("slipped")); !o.Empty() {
		t.Fatalf("the engine holds %+v", o)
	}
}

// TestTamperedFacadeNeverRuns plays an attacker who rewrites the facade
// after it was generated (BeforeUp): the primary as root, with a device
// rule for the host's /dev/kmsg and a start command that leaves a trace
// in a host directory. The containers are created but inspected before
// start: the launch is refused, the engine's own events show that no
// container of the project ever started, and the trace never appears.
func TestTamperedFacadeNeverRuns(t *testing.T) {
	for _, tc := range []struct{ name, edit, rule string }{
		{"root primary", `        user: "0"` + "\n", "user"},
		{"device rule", `        user: "1000:1000"` + "\n" + `        device_cgroup_rules: ["c 1:11 rwm"]` + "\n", "device"},
		{"added capability", `        user: "1000:1000"` + "\n" + `        cap_add: !override ["SYS_ADMIN"]` + "\n", "capability"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			since := time.Now()
			s := newSetup(t, defaultFiles())
			trace := t.TempDir()
			s.cfg.BeforeUp = func(inputs string) error {
				p := filepath.Join(inputs, "facade.yaml")
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				cmd := fmt.Sprintf("        command: [\"sh\", \"-c\", \"echo ran > /trace/ran; sleep infinity\"]\n"+
					"        volumes: !override\n            - type: bind\n              source: %q\n              target: /trace\n", trace)
				edited := bytes.Replace(data, []byte(`        user: "1000:1000"`+"\n"), []byte(tc.edit+cmd), 1)
				edited = bytes.Replace(edited, []byte("        cap_add: !override []\n"), nil, 1)
				edited = bytes.Replace(edited, []byte("        volumes: !override\n"), []byte("        x-old-volumes:\n"), 1)
				if bytes.Equal(edited, data) {
					return fmt.Errorf("the test could not edit the facade:\n%s", data)
				}
				return os.WriteFile(p, edited, 0o600)
			}
			_, err := s.start("tampered")
			if !isCode(err, launch.CodeInspection) || !strings.Contains(err.Error(), ": "+tc.rule+": ") {
				t.Fatalf("start: %v, want the inspection's %s refusal", err, tc.rule)
			}
			events := engineEvents(t, s.project("tampered"), since)
			if !strings.Contains(events, "create ") {
				t.Fatalf("the engine recorded no create of the project (is the check vacuous?): %q", events)
			}
			if starts := startEvents(events); len(starts) > 0 {
				t.Fatalf("a container of the refused launch started: %q", starts)
			}
			if _, err := os.Stat(filepath.Join(trace, "ran")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the tampered start command ran: %v", err)
			}
			var se *launch.StartError
			if !errors.As(err, &se) || !se.Teardown.ResidueFree {
				t.Fatalf("teardown: %+v", se)
			}
		})
	}
}

// TestRootPrimaryRunsAsConsumer: a primary the repository runs as root
// (by `user: "0"`, or by the image's default as the lifecycle test's)
// runs as the workspace consumer: its main process, and the engine's
// record of it.
func TestRootPrimaryRunsAsConsumer(t *testing.T) {
	files := defaultFiles()
	files["compose.yaml"] = strings.Replace(managedtest.ComposeYAML, "    command: [\"sleep\", \"infinity\"]\n",
		"    command: [\"sleep\", \"infinity\"]\n    user: \"0\"\n", 1)
	s := newSetup(t, files)
	sum, err := s.start("rooted")
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if out, _ := execIn(t, s, "rooted", "sh", "-c", "grep ^Uid: /proc/1/status"); out != "Uid:\t1000\t1000\t1000\t1000" {
		t.Errorf("the main process: %q", out)
	}
	if u := dockertest.Docker(t, "inspect", "--format", "{{.Config.User}}", sum.Runtime.ContainerID); u != "1000:1000" {
		t.Errorf("the engine's record: user %q", u)
	}
}

// TestTeardownReportsPlantedGitExecutables: what a consumer (or anything
// else) planted in the repository's shared Git metadata during a launch,
// a set-user-ID file, a core.fsmonitor and a hook, is residue in the
// teardown's receipt, named, and left for the operator.
func TestTeardownReportsPlantedGitExecutables(t *testing.T) {
	s := newSetup(t, defaultFiles())
	if _, err := s.start("planted"); err != nil {
		t.Fatalf("start: %v", err)
	}
	// The consumer cannot set the bit, even on its own file in the
	// delegated objects directory.
	if out, code := execIn(t, s, "planted", "sh", "-c", "cp /bin/sh ../main/.git/objects/sh && chmod 4755 ../main/.git/objects/sh"); code == 0 {
		t.Fatalf("the consumer made a set-user-ID file in the shared metadata: %q", out)
	}
	gitDir := filepath.Join(s.repo, ".git")
	evil := filepath.Join(gitDir, "objects", "evil")
	if err := os.WriteFile(evil, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(evil, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(gitDir, "config"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "[core]\n\tfsmonitor = /tmp/planted\n")
	f.Close()
	if err := os.WriteFile(filepath.Join(gitDir, "hooks", "post-checkout"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	r, err := launch.Teardown(context.Background(), s.cfg, "planted")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, res := range r.Residue {
		got[res.Kind] = res.Identifiers
	}
	if r.ResidueFree || !slices.Contains(got[launch.KindSetID], ".git/objects/evil") {
		t.Fatalf("receipt %+v, want the set-user-ID file as residue", r)
	}
	for _, want := range []string{"config", "config: core.fsmonitor", "hooks/post-checkout"} {
		if !slices.Contains(got[launch.KindGitExecutable], want) {
			t.Errorf("receipt %+v, want %q among the changed Git executables", r, want)
		}
	}
	if _, err := os.Lstat(evil); err != nil {
		t.Errorf("the planted file is the operator's to look at: %v", err)
	}
}

// TestAttackTeardownReportsGitRedirects: the consumer, in its container,
// names a host repository in the shared metadata's
// objects/info/alternates, links a ref to that repository's branch (the
// link dangles in the container, not on the host) and puts FIFOs as a
// ref and as a pack index. Host Git run later in the repository
// (the operator's fetch from a fresh clone) would copy the host
// repository's history in, or block for good. The receipt must name each
// as residue, not call the teardown residue-free.
func TestAttackTeardownReportsGitRedirects(t *testing.T) {
	s := newSetup(t, defaultFiles())
	if _, err := s.start("redirect"); err != nil {
		t.Fatalf("start: %v", err)
	}
	private := filepath.Join(t.TempDir(), "private")
	if _, err := managedtest.Git("", "init", "-q", "-b", "main", private); err != nil {
		t.Fatal(err)
	}
	plant := "echo " + private + "/.git/objects > ../main/.git/objects/info/alternates" +
		" && ln -s " + private + "/.git/refs/heads/main ../main/.git/refs/heads/stolen" +
		" && mkfifo ../main/.git/refs/tags/hang ../main/.git/objects/pack/pack-0.idx"
	if out, code := execIn(t, s, "redirect", "sh", "-c", plant); code != 0 {
		t.Fatalf("the consumer's plant: %d %q", code, out)
	}
	r, err := launch.Teardown(context.Background(), s.cfg, "redirect")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, res := range r.Residue {
		got[res.Kind] = res.Identifiers
	}
	want := []string{".git/objects/info/alternates", ".git/objects/pack/pack-0.idx (fifo)", ".git/refs/heads/stolen (symlink)", ".git/refs/tags/hang (fifo)"}
	if r.ResidueFree || !slices.Equal(got[launch.KindGitRedirect], want) {
		t.Fatalf("receipt %+v, want %s residue %q", r, launch.KindGitRedirect, want)
	}
	if _, err := os.Lstat(filepath.Join(s.repo, ".git", "refs", "heads", "stolen")); err != nil {
		t.Errorf("the planted link is the operator's to look at: %v", err)
	}
}

func TestLaunchRefusals(t *testing.T) {
	t.Run("branch-exists", func(t *testing.T) {
		s := newSetup(t, defaultFiles())
		if _, err := managedtest.Git(s.repo, "branch", "task/demo"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.start("b"); !isCode(err, launch.CodeBranchExists) || !strings.Contains(err.Error(), "branch_exists") {
			t.Fatalf("start: %v", err)
		}
		if _, err := os.Lstat(filepath.Join(s.cfg.StateRoot, "features", "b")); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("a refused start left a feature directory")
		}
	})
	t.Run("image-missing", func(t *testing.T) {
		s := newSetupWith(t, defaultFiles(), func(doc map[string]any) {
			doc["service_images"].(map[string]any)["db"] = "sha256:" + strings.Repeat("ab", 32)
		})
		_, err := s.start("m")
		if !isCode(err, launch.CodeImage) || !strings.Contains(err.Error(), `service_images["db"]`) {
			t.Fatalf("start: %v", err)
		}
		if o := s.owned(s.project("m")); !o.Empty() {
			t.Fatalf("the engine holds %+v", o)
		}
	})
	t.Run("root-user", func(t *testing.T) {
		files := defaultFiles()
		files[".devcontainer/devcontainer.json"] = strings.Replace(managedtest.DevcontainerJSON, `"dev"`, `"root"`, 1)
		s := newSetup(t, files)
		_, err := s.start("r")
		if !isCode(err, launch.CodeUser) || !strings.Contains(err.Error(), "devcontainer: .devcontainer/devcontainer.json: remoteUser: the container user is root") {
			t.Fatalf("start: %v", err)
		}
		if o := s.owned(s.project("r")); !o.Empty() {
			t.Fatalf("the engine holds %+v", o)
		}
	})
	t.Run("another-user", func(t *testing.T) {
		files := defaultFiles()
		files[".devcontainer/devcontainer.json"] = strings.Replace(managedtest.DevcontainerJSON, `"dev"`, `"nobody"`, 1)
		s := newSetup(t, files)
		_, err := s.start("n")
		if !isCode(err, launch.CodeUser) || !strings.Contains(err.Error(), `devcontainer: .devcontainer/devcontainer.json: remoteUser: "nobody" has uid 65534`) {
			t.Fatalf("start: %v", err)
		}
		if o := s.owned(s.project("n")); !o.Empty() {
			t.Fatalf("the engine holds %+v", o)
		}
	})
	t.Run("omitted-primary", func(t *testing.T) {
		s := newSetupWith(t, defaultFiles(), func(doc map[string]any) {
			doc["workspace_folder"] = "/workspaces/o"
			doc["omitted_services"] = []any{"app"}
		})
		if _, err := s.start("o"); !isCode(err, launch.CodeCompose) || !strings.Contains(err.Error(), `assignment: omitted_services[0]: "app" is the primary service`) {
			t.Fatalf("start: %v", err)
		}
	})
	t.Run("version-2", func(t *testing.T) {
		s := newSetupWith(t, defaultFiles(), func(doc map[string]any) {
			doc["version"] = "2"
			delete(doc, "workspace_consumer")
		})
		if _, err := s.start("v"); !isCode(err, launch.CodeAssignment) {
			t.Fatalf("start: %v", err)
		}
	})
	t.Run("group-writable-git", func(t *testing.T) {
		s := newSetup(t, defaultFiles())
		if err := os.Chmod(filepath.Join(s.repo, ".git", "refs"), 0o775); err != nil {
			t.Fatal(err)
		}
		if _, err := s.start("g"); !isCode(err, launch.CodeRepository) {
			t.Fatalf("start: %v", err)
		}
	})
}
