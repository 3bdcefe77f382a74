package cli_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/cli"
	mt "agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/provider"
)

var now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs the command tree in-process with the fixture's managed root.
func runCLI(t *testing.T, environ []string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Main(args, cli.Env{
		Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
		Environ: environ,
		Now:     func() time.Time { return now },
		Runtime: assignment.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())},
	})
	return result{code, out.String(), errb.String()}
}

// noSecrets: no output holds a planted secret, a file digest or a source
// path.
func noSecrets(t *testing.T, f *mt.Fixture, r result) {
	t.Helper()
	all := r.stdout + r.stderr
	if strings.Contains(all, mt.Secret) || strings.Contains(all, "/materializations/") {
		t.Fatalf("output leaks a secret or source path:\n%s", all)
	}
	if f != nil {
		leases, _ := f.Doc["leases"].([]any)
		for i := range leases {
			for _, m := range mt.Lease(f.Doc, i)["materializations"].([]any) {
				if d, ok := m.(map[string]any)["sha256"].(string); ok && strings.Contains(all, d) {
					t.Fatalf("output holds a file digest:\n%s", all)
				}
			}
		}
	}
}

func v3(doc map[string]any) map[string]any {
	doc["version"] = "3"
	doc["workspace_consumer"] = map[string]any{"uid": 1000, "gid": 1000}
	return doc
}

func TestValidateSpecExamples(t *testing.T) {
	for _, name := range mt.SpecExamples {
		for _, version := range []string{"2", "3"} {
			t.Run(name+"/v"+version, func(t *testing.T) {
				doc := mt.Example(name)
				if version == "3" {
					v3(doc)
				}
				f := mt.New(t, doc)
				env := []string{f.Env()}
				r := runCLI(t, env, "managed", "validate", f.Path)
				if r.code != cli.ExitOK {
					t.Fatalf("exit %d: %s", r.code, r.stderr)
				}
				if !strings.Contains(r.stdout, "valid: version \""+version+"\" assignment for run run-id") {
					t.Fatalf("summary:\n%s", r.stdout)
				}
				leases, _ := doc["leases"].([]any)
				for _, l := range leases {
					if id := l.(map[string]any)["lease_id"].(string); !strings.Contains(r.stdout, id) {
						t.Errorf("summary misses lease %s", id)
					}
				}
				noSecrets(t, f, r)

				r = runCLI(t, env, "managed", "validate", "--json", f.Path)
				if r.code != cli.ExitOK {
					t.Fatalf("--json exit %d: %s", r.code, r.stderr)
				}
				var out struct {
					Valid          bool   `json:"valid"`
					AssignmentPath string `json:"assignment_path"`
					Version        string `json:"version"`
					Leases         []struct {
						LeaseID, State string
						Live           bool
					} `json:"leases"`
					ManagedLaunch struct {
						Ready   bool
						Refusal string
					} `json:"managed_launch"`
				}
				if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
					t.Fatal(err)
				}
				if !out.Valid || out.Version != version || out.AssignmentPath != f.Path || len(out.Leases) != len(leases) {
					t.Fatalf("json = %+v", out)
				}
				for _, l := range out.Leases {
					if l.State == "" || !l.Live {
						t.Errorf("lease %+v", l)
					}
				}
				wantReady := version == "3" && name == "spec-service-images"
				if out.ManagedLaunch.Ready != wantReady {
					t.Errorf("managed launch = %+v", out.ManagedLaunch)
				}
				noSecrets(t, f, r)
			})
		}
	}
}

func TestValidateStates(t *testing.T) {
	f := mt.New(t, mt.Example("spec-tool-request"))
	r := runCLI(t, []string{f.Env()}, "managed", "validate", f.Path)
	for _, want := range []string{
		"shared_exchange [shared-directory] state primary-read-only-directory, live",
		"delivery_endpoint [tool-endpoint] state trusted-relay-endpoint, live",
		"delivery_requests [tool-request] state consumer-request-spool, live",
		"endpoint delivery_endpoint, spool /run/branchbox/leases/tool-requests/delivery, consumer uid 1000",
		"replay exact-digest-replay-v1",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("summary misses %q:\n%s", want, r.stdout)
		}
	}
}

func TestValidateRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		doc    func() map[string]any
		disk   func(t *testing.T, f *mt.Fixture)
		field  string
		reason string
	}{
		{name: "unknown field", doc: func() map[string]any {
			d := mt.Example("spec-model-identity")
			mt.Lease(d, 1)["value"] = "inline-" + mt.Secret
			return d
		}, field: "leases[1]", reason: "unknown field"},
		{name: "unsupported version", doc: func() map[string]any { d := mt.Example("spec-model-identity"); d["version"] = "9"; return d }, field: "version", reason: "unsupported version"},
		{name: "tag-only image", doc: func() map[string]any {
			d := mt.Example("spec-service-images")
			d["service_images"].(map[string]any)["app"] = "registry.example/team/app:latest"
			return d
		}, field: "service_images.app", reason: "tag-only"},
		{name: "proxy image missing", doc: func() map[string]any {
			d := mt.Example("spec-service-images")
			delete(d, "port_proxy_image")
			return d
		}, field: "port_proxy_image", reason: "is required"},
		{name: "inherited loader variable", doc: func() map[string]any {
			d := mt.Example("spec-model-identity")
			mt.Lease(d, 0)["inherited_environment"] = []any{"LD_PRELOAD"}
			return d
		}, field: "leases[0].inherited_environment[0]", reason: "loader"},
		{name: "v3 without consumer", doc: func() map[string]any { d := mt.Example("spec-model-identity"); d["version"] = "3"; return d }, field: "workspace_consumer", reason: "required"},
		{name: "endpoint target outside namespace", doc: func() map[string]any {
			d := mt.Example("spec-tool-request")
			mt.Mat(d, 1, 0)["target_path"] = "/run/branchbox/leases/shared/delivery.sock"
			return d
		}, field: "leases[1].materializations[0].target_path", reason: "tool-endpoints"},
		{name: "bad replay policy", doc: func() map[string]any {
			d := mt.Example("spec-tool-request")
			mt.Lease(d, 2)["replay_policy"] = "always"
			return d
		}, field: "leases[2].replay_policy", reason: "exact-digest-replay-v1"},
		{name: "value digest mismatch", doc: func() map[string]any { return mt.Example("spec-model-identity") }, disk: func(t *testing.T, f *mt.Fixture) {
			mt.WriteFile(t, f.Source(1, 0), []byte("changed-"+mt.Secret), 0o600)
		}, field: "leases[1].materializations[0].source_path", reason: "sha256"},
		{name: "shared directory mode", doc: func() map[string]any { return mt.Example("spec-tool-request") }, disk: func(t *testing.T, f *mt.Fixture) {
			if err := os.Chmod(f.Source(0, 0), 0o700); err != nil {
				t.Fatal(err)
			}
		}, field: "leases[0].materializations[0].source_path", reason: "0755"},
		{name: "assignment mode", doc: func() map[string]any { return mt.Example("spec-tool-request") }, disk: func(t *testing.T, f *mt.Fixture) {
			if err := os.Chmod(f.Path, 0o644); err != nil {
				t.Fatal(err)
			}
		}, field: "assignment", reason: "owner-only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := mt.New(t, tc.doc())
			if tc.disk != nil {
				tc.disk(t, f)
			}
			r := runCLI(t, []string{f.Env()}, "managed", "validate", f.Path)
			want := "branchbox: refused: " + tc.field + ": "
			if r.code != cli.ExitRefused || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, tc.reason) {
				t.Fatalf("exit %d stderr %q, want %q ... %q", r.code, r.stderr, want, tc.reason)
			}
			noSecrets(t, f, r)
			r = runCLI(t, []string{f.Env()}, "managed", "validate", "--json", f.Path)
			var out struct {
				Valid         bool
				Field, Reason string
			}
			if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != cli.ExitRefused {
				t.Fatalf("--json exit %d: %v %q", r.code, err, r.stdout)
			}
			if out.Valid || out.Field != tc.field || !strings.Contains(out.Reason, tc.reason) || r.stderr != "" {
				t.Fatalf("--json = %+v stderr %q", out, r.stderr)
			}
			noSecrets(t, f, r)
		})
	}
}

func TestValidateRequireLaunch(t *testing.T) {
	f := mt.New(t, mt.Example("spec-service-images"))
	r := runCLI(t, []string{f.Env()}, "managed", "validate", "--require-launch", f.Path)
	if r.code != cli.ExitRefused || !strings.Contains(r.stderr, `version: a managed launch needs a version "3"`) {
		t.Fatalf("v2: exit %d %q", r.code, r.stderr)
	}
	f = mt.New(t, v3(mt.Example("spec-model-identity")))
	r = runCLI(t, []string{f.Env()}, "managed", "validate", "--require-launch", f.Path)
	if r.code != cli.ExitRefused || !strings.Contains(r.stderr, "service_images: a managed launch needs preloaded images") {
		t.Fatalf("v3 without images: exit %d %q", r.code, r.stderr)
	}
	f = mt.New(t, v3(mt.Example("spec-service-images")))
	if r = runCLI(t, []string{f.Env()}, "managed", "validate", "--require-launch", f.Path); r.code != cli.ExitOK {
		t.Fatalf("v3 with images: exit %d %q", r.code, r.stderr)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"managed"},
		{"managed", "bogus"},
		{"managed", "validate"},
		{"managed", "validate", "a", "b"},
		{"managed", "validate", "--no-such-flag", "/x"},
		{"managed", "exec-provider", "--provider", "p"},
		{"managed", "exec-provider", "--assignment", "/x"},
		{"managed", "exec-provider", "--assignment", "/x", "--provider", "p", "stray"},
		{"managed", "exec-provider", "--assignment", "/x", "--provider", "p", "stray", "--", "arg"},
		{"runtime-capabilities", "extra"},
	} {
		r := runCLI(t, nil, args...)
		if r.code != cli.ExitUsage || !strings.Contains(r.stderr, "--help") {
			t.Errorf("%q: exit %d stderr %q", args, r.code, r.stderr)
		}
	}
	for _, args := range [][]string{{"--help"}, {"managed", "--help"}, {"managed", "validate", "--help"}, {"managed", "exec-provider", "--help"}} {
		r := runCLI(t, nil, args...)
		if r.code != cli.ExitOK || !strings.Contains(r.stdout, "Exit status") && args[0] != "managed" {
			t.Errorf("%q: exit %d", args, r.code)
		}
	}
}

func TestRuntimeCapabilities(t *testing.T) {
	r := runCLI(t, nil, "runtime-capabilities")
	var caps map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &caps); err != nil || r.code != 0 {
		t.Fatalf("exit %d: %v", r.code, err)
	}
	if caps["schema_version"] != 1.0 || caps["managed_workspace_contract_v1"] != true || caps["preloaded_compose_sanitization_v1"] != true {
		t.Fatalf("capabilities %v", caps)
	}
}

func execFixture(t *testing.T, exe string) *mt.Fixture {
	doc := mt.Example("spec-model-identity")
	mt.Lease(doc, 0)["executable"] = exe
	return mt.New(t, doc)
}

func TestExecProvider(t *testing.T) {
	f := execFixture(t, "/usr/bin/env")
	caller := []string{f.Env(), "PATH=/tmp/evil", "HOME=/root", "MODEL_ACCESS_TOKEN=caller-" + mt.Secret, "UNRELATED=x"}
	r := runCLI(t, caller, "managed", "exec-provider", "--assignment", f.Path, "--provider", "/usr/bin/env", "--inherit-env", "MODEL_ACCESS_TOKEN")
	if r.code != cli.ExitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	got := strings.Split(strings.TrimSpace(r.stdout), "\n")
	slices.Sort(got)
	want := []string{"MODEL_ACCESS_TOKEN=caller-" + mt.Secret, "PATH=" + provider.SafePATH, "SOURCE_DELIVERY_TOKEN=" + string(mt.Content("provider-environment", 1, 0))}
	if !slices.Equal(got, want) {
		t.Fatalf("child env %q, want %q", got, want)
	}

	// Refusals exit 1 and start nothing.
	r = runCLI(t, caller, "managed", "exec-provider", "--assignment", f.Path, "--provider", "/usr/bin/env")
	if r.code != cli.ExitRefused || r.stdout != "" || !strings.Contains(r.stderr, "inherit-env: the inherited names differ") {
		t.Fatalf("missing --inherit-env: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, caller, "managed", "exec-provider", "--assignment", f.Path, "--provider", "env", "--inherit-env", "MODEL_ACCESS_TOKEN")
	if r.code != cli.ExitRefused || r.stdout != "" || !strings.Contains(r.stderr, "provider: no model-identity lease binds this executable") {
		t.Fatalf("other executable: exit %d %q", r.code, r.stderr)
	}
	mt.WriteFile(t, f.Source(1, 0), []byte("rotated-"+mt.Secret+"-x"), 0o600)
	r = runCLI(t, caller, "managed", "exec-provider", "--assignment", f.Path, "--provider", "/usr/bin/env", "--inherit-env", "MODEL_ACCESS_TOKEN")
	if r.code != cli.ExitRefused || r.stdout != "" || strings.Contains(r.stderr, mt.Secret) {
		t.Fatalf("rotated value: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestExecProviderExitStatus(t *testing.T) {
	script := filepath.Join(t.TempDir(), "provider")
	mt.WriteFile(t, script, []byte("#!/bin/sh\necho \"args:$*\"\nexit \"$1\"\n"), 0o700)
	f := execFixture(t, script)
	caller := []string{f.Env(), "MODEL_ACCESS_TOKEN=x"}
	base := []string{"managed", "exec-provider", "--assignment", f.Path, "--provider", script, "--inherit-env", "MODEL_ACCESS_TOKEN", "--"}
	r := runCLI(t, caller, append(base, "0", "--not-a-flag")...)
	if r.code != 0 || r.stdout != "args:0 --not-a-flag\n" {
		t.Fatalf("exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, caller, append(base, "7")...)
	if r.code != cli.ExitRefused || !strings.Contains(r.stderr, "the provider exited with status 7") {
		t.Fatalf("exit %d stderr %q", r.code, r.stderr)
	}
}

// TestAttackExecProviderSymlinkSwap: the signed executable
// /opt/agent/bin/provider where /opt/agent belongs to uid 1000, which
// replaces the provider with a symbolic link to its own program; root's
// `managed exec-provider` refuses (exit 1) and that program never runs.
func TestAttackExecProviderSymlinkSwap(t *testing.T) {
	mt.RequireRoot(t)
	base := t.TempDir()
	agent := filepath.Join(base, "opt", "agent")
	bin := filepath.Join(agent, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, evil, marker := filepath.Join(bin, "provider"), filepath.Join(agent, "evil"), filepath.Join(base, "attacker-ran")
	mt.WriteFile(t, evil, []byte("#!/bin/sh\nenv > "+marker+"\n"), 0o755)
	for _, d := range []string{filepath.Join(base, "opt"), agent, bin} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(evil, exe); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{agent, bin, evil, exe} {
		if err := os.Lchown(p, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	f := execFixture(t, exe)
	caller := []string{f.Env(), "MODEL_ACCESS_TOKEN=caller-" + mt.Secret}
	r := runCLI(t, caller, "managed", "exec-provider", "--assignment", f.Path, "--provider", exe, "--inherit-env", "MODEL_ACCESS_TOKEN")
	if r.code != cli.ExitRefused || r.stdout != "" || !strings.Contains(r.stderr, "owned by uid 1000, neither root nor the runtime's uid 0") {
		t.Fatalf("exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stderr, base) {
		t.Fatalf("the refusal names a host path: %q", r.stderr)
	}
	noSecrets(t, f, r)
	if _, err := os.Lstat(marker); !os.IsNotExist(err) {
		t.Fatalf("the attacker's program ran as root: %v", err)
	}
}

// TestBinary builds branchbox and checks the exit statuses and the exact
// provider environment through the real executable.
func TestBinary(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go toolchain in PATH")
	}
	bin := filepath.Join(t.TempDir(), "branchbox")
	build := exec.Command(gobin, "build", "-o", bin, "agentbox/cmd/branchbox")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	f := execFixture(t, "/usr/bin/env")
	run := func(env []string, args ...string) result {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return result{code, out.String(), errb.String()}
	}
	env := []string{f.Env(), "MODEL_ACCESS_TOKEN=binary-" + mt.Secret, "HOME=/root", "PATH=/usr/bin:/bin"}
	if r := run(env, "managed", "validate", f.Path); r.code != 0 || !strings.Contains(r.stdout, "valid:") {
		t.Fatalf("validate: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run(env, "managed", "validate", f.Path+"x"); r.code != 1 {
		t.Fatalf("missing assignment: %d %q", r.code, r.stderr)
	}
	if r := run(env, "managed", "validate"); r.code != 2 {
		t.Fatalf("usage: %d", r.code)
	}
	if r := run(env, "runtime-capabilities"); r.code != 0 || !strings.Contains(r.stdout, `"schema_version": 1`) {
		t.Fatalf("capabilities: %d %q", r.code, r.stdout)
	}
	r := run(env, "managed", "exec-provider", "--assignment", f.Path, "--provider", "/usr/bin/env", "--inherit-env", "MODEL_ACCESS_TOKEN")
	got := strings.Split(strings.TrimSpace(r.stdout), "\n")
	slices.Sort(got)
	want := []string{"MODEL_ACCESS_TOKEN=binary-" + mt.Secret, "PATH=" + provider.SafePATH, "SOURCE_DELIVERY_TOKEN=" + string(mt.Content("provider-environment", 1, 0))}
	if r.code != 0 || !slices.Equal(got, want) {
		t.Fatalf("exec-provider: %d env %q want %q stderr %q", r.code, got, want, r.stderr)
	}

	// The example's printed steps, exactly as printed, through the binary:
	// the kernel starts the example provider from its #! line.
	dir := filepath.Join(t.TempDir(), "try")
	r = run([]string{"PATH=/usr/bin:/bin"}, "managed", "example", "--json", dir)
	var ex exampleJSON
	if err := json.Unmarshal([]byte(r.stdout), &ex); err != nil || r.code != 0 || len(ex.NextSteps) != 2 {
		t.Fatalf("example: %d %v %q %q", r.code, err, r.stdout, r.stderr)
	}
	for _, step := range ex.NextSteps {
		words := strings.Fields(step.Command)
		var environ []string
		for assignmentWord.MatchString(words[0]) {
			environ, words = append(environ, words[0]), words[1:]
		}
		if r = run(environ, words[1:]...); r.code != 0 {
			t.Fatalf("%s: %d %q %q", step.Command, r.code, r.stdout, r.stderr)
		}
	}
	if !strings.Contains(r.stdout, "\n  EXAMPLE_DELIVERY_TOKEN\n  EXAMPLE_MODEL_TOKEN\n  PATH\n") || strings.Contains(r.stdout, "example-delivery-value") {
		t.Fatalf("example provider output %q", r.stdout)
	}
}
