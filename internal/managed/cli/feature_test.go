package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"agentbox/internal/managed/cli"
	"agentbox/internal/managed/dockertest"
	mt "agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/policy"
)

// TestFeatureUsageAndRefusals: what is refused before the engine is
// asked, with the documented exit statuses.
func TestFeatureUsageAndRefusals(t *testing.T) {
	state := "BRANCHBOX_STATE_DIR=" + filepath.Join(t.TempDir(), "state")
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout+stderr
	}{
		{[]string{"feature"}, cli.ExitUsage, "subcommand is required"},
		{[]string{"feature", "teardown", "x"}, cli.ExitRefused, "requires --force"},
		{[]string{"feature", "teardown", "x", "--force"}, cli.ExitRefused, `no feature "x"`},
		{[]string{"feature", "teardown", "x", "--force", "--json"}, cli.ExitRefused, `"code": "not_found"`},
		{[]string{"feature", "status", "x", "--json"}, cli.ExitRefused, `"code": "not_found"`},
		{[]string{"feature", "exec", "x", "--", "true"}, cli.ExitRefused, `no feature "x"`},
		// The command without "--", as docker exec takes it; flags after NAME
		// are exec's own, the command's are the command's.
		{[]string{"feature", "exec", "x", "true"}, cli.ExitRefused, `no feature "x"`},
		{[]string{"feature", "exec", "x", "ls", "-la", "--json"}, cli.ExitRefused, `no feature "x"`},
		{[]string{"feature", "exec", "x", "--json", "true"}, cli.ExitRefused, `"code": "not_found"`},
		{[]string{"feature", "exec", "--json", "x", "true"}, cli.ExitRefused, `"code": "not_found"`},
		{[]string{"feature", "exec", "x"}, cli.ExitUsage, "the command"},
		{[]string{"feature", "exec", "x", "--"}, cli.ExitUsage, "the command"},
		{[]string{"feature", "exec", "x", "--bogus", "true"}, cli.ExitUsage, "bogus"},
		{[]string{"feature", "start", "x", "--repo", "/r", "--runtime", "local", "--runtime-manifest", "/m"}, cli.ExitUsage, "--runtime must be in-guest"},
		{[]string{"feature", "start", "x", "--repo", "/r", "--runtime", "in-guest"}, cli.ExitUsage, "runtime-manifest"},
		// A path that is not absolute and clean is a refusal, as managed
		// validate's: exit 2 is for commands, flags and argument counts.
		{[]string{"feature", "start", "x", "--repo", "/r", "--runtime", "in-guest", "--runtime-manifest", "rel/a.json"}, cli.ExitRefused, "absolute"},
		{[]string{"feature", "start", "x", "--repo", "/r", "--runtime", "in-guest", "--runtime-manifest", "/m/../a.json", "--json"}, cli.ExitRefused, `"code": "assignment"`},
		{[]string{"feature", "start", "x", "--repo", "/r", "--runtime", "in-guest", "--runtime-manifest", "/m//a.json"}, cli.ExitRefused, "clean"},
		{[]string{"feature", "start", "bad/name", "--repo", "/r", "--runtime", "in-guest", "--runtime-manifest", "/m"}, cli.ExitUsage, "feature name"},
		{[]string{"feature", "start", "main", "--repo", "/r", "--runtime", "in-guest", "--runtime-manifest", "/m"}, cli.ExitUsage, "reserved"},
		{[]string{"feature", "exec-provider", "x"}, cli.ExitUsage, "provider"},
		// --wait-seconds: the bound itself passes to the feature lookup, one past it is usage.
		{[]string{"feature", "dispatch-tool", "x", "--lease", "l", "--request-id", "r", "--wait-seconds", "300"}, cli.ExitRefused, `no feature "x"`},
		{[]string{"feature", "dispatch-tool", "x", "--lease", "l", "--request-id", "r", "--wait-seconds", "301"}, cli.ExitUsage, "--wait-seconds"},
	} {
		r := runCLI(t, []string{state}, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stdout+r.stderr, tc.want) {
			t.Errorf("%q: exit %d, want %d with %q:\n%s%s", tc.args, r.code, tc.code, tc.want, r.stdout, r.stderr)
		}
	}
}

// TestFeatureList: ls lists what the state directory holds, sorted, in
// status's vocabulary; a directory without a record is not a feature, a
// record that cannot be read is listed as damaged.
func TestFeatureList(t *testing.T) {
	root := filepath.Join(t.TempDir(), "state")
	state := "BRANCHBOX_STATE_DIR=" + root
	if r := runCLI(t, []string{state}, "feature", "ls", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("no state directory: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	features := filepath.Join(root, "features")
	for name, record := range map[string]string{
		"zeta":  `{"version":1,"name":"zeta","phase":"failed","error":"compose: refused","task_branch":"branchbox/zeta","compose_project":"p-zeta"}`,
		"alpha": `{"version":1,"name":"alpha","phase":"starting","task_branch":"branchbox/alpha","published_ports":[{"host":18080,"runtime":80}]}`,
		"bad":   `{not json`,
		"empty": "",
	} {
		if err := os.MkdirAll(filepath.Join(features, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if record != "" {
			if err := os.WriteFile(filepath.Join(features, name, "launch.json"), []byte(record), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := runCLI(t, []string{state}, "feature", "ls", "--json")
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || r.code != 0 {
		t.Fatalf("ls --json: exit %d %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	var got []string
	for _, s := range list {
		got = append(got, fmt.Sprint(s["name"], " ", s["phase"], " ", s["branch"], " ", s["published_ports"]))
	}
	want := []string{"alpha starting branchbox/alpha [map[host:18080 runtime:80]]", "bad damaged  []", "zeta failed branchbox/zeta []"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ls --json:\n got %q\nwant %q\n%s", got, want, r.stdout)
	}
	r = runCLI(t, []string{state}, "feature", "ls")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "NAME PHASE CONTAINER PORTS BRANCH" ||
		strings.Join(strings.Fields(lines[1]), " ") != "alpha starting - 127.0.0.1:18080->80 branchbox/alpha" {
		t.Fatalf("ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestFeatureStartRepoMismatchIsARefusal: a --repo that is a main
// checkout, but not the assignment's repository.path, is a repository
// refusal (exit 1), not a usage error.
func TestFeatureStartRepoMismatchIsARefusal(t *testing.T) {
	mt.RequireRoot(t)
	assigned := filepath.Join(t.TempDir(), "repo")
	other := filepath.Join(t.TempDir(), "other")
	if err := os.MkdirAll(filepath.Join(other, ".git"), 0o700); err != nil {
		t.Fatal(err)
	}
	f := mt.New(t, mt.LaunchDoc(assigned, strings.Repeat("a", 40), mt.Images{
		Service: "sha256:" + mt.Digest, Proxy: "sha256:" + mt.Digest, ProxyPort: 18080}))
	args := []string{"feature", "start", "x", "--repo", other, "--runtime", "in-guest", "--runtime-manifest", f.Path}
	env := []string{f.Env(), "BRANCHBOX_STATE_DIR=" + t.TempDir()}
	r := runCLI(t, env, append(args, "--json")...)
	var out struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != cli.ExitRefused {
		t.Fatalf("exit %d: %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if out.Error.Code != "repository" || out.Error.Message != "--repo is not the assignment's repository.path" {
		t.Fatalf("error %+v", out.Error)
	}
	if r := runCLI(t, env, args...); r.code != cli.ExitRefused || !strings.Contains(r.stderr, "repository.path") {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestFeatureStartRefusesVersion2: a version 2 assignment is refused
// with the assignment's rule, as JSON.
func TestFeatureStartRefusesVersion2(t *testing.T) {
	f := mt.New(t, mt.Example("spec-model-identity"))
	r := runCLI(t, []string{f.Env(), "BRANCHBOX_STATE_DIR=" + t.TempDir()},
		"feature", "start", "v2", "--repo", t.TempDir(), "--runtime", "in-guest", "--runtime-manifest", f.Path, "--json")
	var out struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != cli.ExitRefused {
		t.Fatalf("exit %d: %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if out.Error.Code != "assignment" || !strings.Contains(out.Error.Message, `version "3"`) {
		t.Fatalf("error %+v", out.Error)
	}
	noSecrets(t, f, r)
}

// cliRequests is TestFeatureCLIEndToEnd's tool-request lease.
const cliRequests = "cli_requests"

// TestFeatureCLIEndToEnd drives the whole lifecycle through the command
// line on the real engine: the JSON shapes a user and an orchestrator
// read.
func TestFeatureCLIEndToEnd(t *testing.T) {
	mt.RequireRoot(t)
	dockertest.Require(t)
	repo := filepath.Join(t.TempDir(), "repo")
	rev := mt.MakeRepo(t, repo, mt.LaunchFiles())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	doc := mt.LaunchDoc(repo, rev, mt.Images{
		Service: dockertest.ImageID(t, dockertest.ServiceImageTag), Proxy: dockertest.ImageID(t, dockertest.ProxyImageTag), ProxyPort: port})
	// The assignment's own folder, and db left out: it needs no image.
	doc["workspace_folder"] = "/workspaces/cli-folder"
	doc["omitted_services"] = []any{"db"}
	delete(doc["service_images"].(map[string]any), "db")
	// A shell provider, so one can run while the consumer looks at it.
	mt.Lease(doc, 0)["executable"] = "/bin/sh"
	// A tool-request lease id of this test's own: the spool volume is
	// named after the run and the lease, and the launch package's tests,
	// which go test may run at the same time on the same engine, use
	// delivery_requests of run-1.
	for _, l := range doc["leases"].([]any) {
		if l := l.(map[string]any); l["lease_id"] == "delivery_requests" {
			l["lease_id"] = cliRequests
		}
	}
	f := mt.New(t, doc)
	// The trusted endpoint on the assignment's socket (the fixture's is
	// stale): it answers every request with {"ok":true} and a string
	// holding a C1 control (a CSI) and a bidi override, which JSON allows
	// raw and a terminal acts on.
	mt.ServeEndpoint(t, f.Source(4, 0), func(context.Context, []byte) ([]byte, error) {
		return []byte("{\"ok\":true,\"echo\":\"\u009b2J\u202e\"}"), nil
	})
	env := []string{f.Env(), "BRANCHBOX_STATE_DIR=" + filepath.Join(t.TempDir(), "state"), "MODEL_ACCESS_TOKEN=token-" + mt.Secret}

	r := runCLI(t, env, "feature", "start", "cli", "--repo", repo, "--runtime", "in-guest", "--runtime-manifest", f.Path, "--json")
	if r.code != 0 {
		t.Fatalf("start: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Cleanup(func() { runCLI(t, env, "feature", "teardown", "cli", "--force") })
	var sum map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
		t.Fatal(err)
	}
	rt := sum["runtime"].(map[string]any)
	ig := rt["in_guest"].(map[string]any)
	if rt["provider"] != "in-guest" || rt["runtime_id"] != "outer-1" || rt["container_user"] != "1000:1000" || rt["workspace_folder"] != "/workspaces/cli-folder" ||
		ig["run_id"] != "run-1" || ig["tunnel_placement"] != "outer" || ig["project_docker"] != "disabled" ||
		ig["repository_revision"] != rev || len(ig["leases"].([]any)) != 10 {
		t.Fatalf("summary: %s", r.stdout)
	}
	noSecrets(t, f, r)
	// A notice on stderr for each key of the repository's Compose file the
	// facade replaces; db is omitted, so nothing of its is.
	for _, key := range []string{"build", "environment", "image", "ports", "volumes"} {
		if !strings.Contains(r.stderr, "branchbox: notice: compose: compose.yaml: services.app."+key+": replaced by the managed launch: ") {
			t.Errorf("no notice for services.app.%s:\n%s", key, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "services.db.") {
		t.Errorf("a notice for the omitted db:\n%s", r.stderr)
	}

	r = runCLI(t, env, "feature", "exec", "cli", "--json", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil || r.code != 0 {
		t.Fatalf("exec --json: exit %d %v\n%s", r.code, err, r.stdout)
	}
	if raw["exit_code"] != 3.0 || raw["stdout"] != "out\n" || raw["stderr"] != "err\n" {
		t.Fatalf("exec --json: %s", r.stdout)
	}
	// Each stream is kept up to 1 MiB: at the limit and one past it.
	for _, n := range []int{1 << 20, 1<<20 + 1} {
		r = runCLI(t, env, "feature", "exec", "cli", "--json", "--", "sh", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a", n))
		var res struct{ Stdout string }
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 {
			t.Fatalf("exec --json of %d bytes: exit %d %v", n, r.code, err)
		}
		if len(res.Stdout) != 1<<20 || strings.Trim(res.Stdout, "a") != "" {
			t.Fatalf("exec --json of %d bytes kept %d", n, len(res.Stdout))
		}
	}
	if r = runCLI(t, env, "feature", "exec", "cli", "sh", "-c", "exit 5"); r.code != 5 {
		t.Fatalf("exec (no --) passes the status through: %d", r.code)
	}

	provider := []string{"feature", "exec-provider", "cli", "--provider", "/bin/sh", "--inherit-env", "MODEL_ACCESS_TOKEN", "--", "-c"}
	r = runCLI(t, env, append(provider, "exec "+mt.Probe+" env")...)
	if r.code != 0 || !strings.Contains(r.stdout, "MODEL_ACCESS_TOKEN=token-") || strings.Contains(r.stdout, "HOME=") {
		t.Fatalf("exec-provider: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = runCLI(t, env, "feature", "exec-provider", "cli", "--provider", "/bin/sh", "--", "-c", "true"); r.code != cli.ExitRefused {
		t.Fatalf("exec-provider without the signed inherited name: exit %d", r.code)
	}
	providerEnvironmentIsPrivate(t, env, provider)

	// dispatch-tool: nothing pending is 75 and retryable; a request the
	// consumer spools is dispatched; a wait past 300 s is a usage error.
	r = runCLI(t, env, "feature", "dispatch-tool", "cli", "--lease", cliRequests, "--request-id", "none", "--json")
	if r.code != cli.ExitNotPending || strings.Join(strings.Fields(r.stdout), " ") !=
		`{ "status": "not-pending", "retryable": true, "lease_id": "cli_requests", "request_id": "none" }` {
		t.Fatalf("not pending: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = runCLI(t, env, "feature", "dispatch-tool", "cli", "--lease", cliRequests, "--request-id", "x", "--wait-seconds", "301"); r.code != cli.ExitUsage {
		t.Fatalf("--wait-seconds 301: exit %d", r.code)
	}
	spool := "/run/branchbox/leases/tool-requests/delivery"
	r = runCLI(t, env, "feature", "exec", "cli", "--", "sh", "-c", "cd "+spool+` && umask 077 && printf '{"version":"1","run_id":"run-1","lease_id":"cli_requests","consumer":"coding-agent","request_id":"q1","capability":"%s","payload":{"q":1}}' "$(cat .capability)" > requests/.q1 && mv requests/.q1 requests/q1.json`)
	if r.code != 0 {
		t.Fatalf("spool a request: exit %d %s", r.code, r.stderr)
	}
	r = runCLI(t, env, "feature", "dispatch-tool", "cli", "--lease", cliRequests, "--request-id", "q1", "--wait-seconds", "5", "--json")
	var disp struct {
		Status    string `json:"status"`
		Retryable bool   `json:"retryable"`
		Result    struct {
			Response map[string]any `json:"response"`
			Replayed bool           `json:"replayed"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &disp); err != nil || r.code != 0 || disp.Status != "dispatched" || disp.Retryable ||
		disp.Result.Response["ok"] != true || disp.Result.Replayed || !strings.Contains(r.stdout, `"request_id": "q1"`) {
		t.Fatalf("dispatch: exit %d %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	noSecrets(t, f, r)
	// The endpoint's bytes reach the operator's terminal escaped, with
	// --json and without (the same request, replayed from the ledger).
	if strings.ContainsAny(r.stdout, "\u009b\u202e") || !strings.Contains(r.stdout, `"echo": "\u009b2J\u202e"`) {
		t.Fatalf("dispatch --json printed the response unescaped:\n%q", r.stdout)
	}
	r = runCLI(t, env, "feature", "dispatch-tool", "cli", "--lease", cliRequests, "--request-id", "q1")
	if r.code != 0 || strings.ContainsAny(r.stdout, "\u009b\u202e") || !strings.Contains(r.stdout, `"echo":"\u009b2J\u202e"`) ||
		!strings.Contains(r.stdout, "replayed from the ledger") {
		t.Fatalf("dispatch: exit %d, printed the response unescaped:\n%q", r.code, r.stdout)
	}

	r = runCLI(t, env, "feature", "status", "cli", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"phase": "running"`) || !strings.Contains(r.stdout, `"container_state": "running"`) {
		t.Fatalf("status: exit %d\n%s", r.code, r.stdout)
	}

	r = runCLI(t, env, "feature", "ls", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"name": "cli"`) || !strings.Contains(r.stdout, `"container_state": "running"`) {
		t.Fatalf("ls: exit %d\n%s", r.code, r.stdout)
	}

	r = runCLI(t, env, "feature", "teardown", "cli", "--force", "--json")
	var td struct {
		Name     string `json:"name"`
		Teardown struct {
			Provider    string `json:"provider"`
			Verified    bool   `json:"verified"`
			ResidueFree bool   `json:"residue_free"`
			Residue     []any  `json:"residue"`
		} `json:"runtime_teardown"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &td); err != nil || r.code != 0 {
		t.Fatalf("teardown: exit %d %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if td.Name != "cli" || td.Teardown.Provider != "in-guest" || !td.Teardown.Verified || !td.Teardown.ResidueFree || td.Teardown.Residue == nil || len(td.Teardown.Residue) != 0 {
		t.Fatalf("receipt: %s", r.stdout)
	}
	if r = runCLI(t, env, "feature", "status", "cli"); r.code != cli.ExitRefused {
		t.Fatalf("status after teardown: exit %d", r.code)
	}
}

// providerEnvironmentIsPrivate is the /proc/*/environ attack on a running
// provider: a consumer process started by `feature exec` reads every
// process's environment in a loop while the provider and its child run.
// It must see the provider (so it looked) and be refused its environment.
// The provider runs as the consumer's uid in a group of its own, with core
// dumps off.
func providerEnvironmentIsPrivate(t *testing.T, env, provider []string) {
	t.Helper()
	// "$m-marker" keeps the watcher's own command line from matching.
	watch := `m=hold; while [ ! -e /tmp/watch.stop ]; do
	for p in /proc/[0-9]*; do
		tr '\0' '\n' < $p/environ 2>/dev/null | grep '_TOKEN=' >> /tmp/watch.leak
		if grep -q "$m-marker" $p/cmdline 2>/dev/null; then
			echo seen >> /tmp/watch.seen
			cat $p/environ 2>&1 >/dev/null | grep -q 'Permission denied' && echo denied >> /tmp/watch.denied
		fi
	done
done`
	if r := runCLI(t, env, "feature", "exec", "cli", "--", "sh", "-c",
		"rm -f /tmp/watch.*; : > /tmp/watch.leak; nohup sh -c \"$0\" >/dev/null 2>&1 &", watch); r.code != 0 {
		t.Fatalf("start the watcher: exit %d %s", r.code, r.stderr)
	}
	// Core dumps are off for every process of the container, hard limit
	// too: the provider's shell turns its own off only once it runs, and
	// the consumer may kill it before (docker exec takes the container's
	// limits; the engine's may allow dumps).
	if r := runCLI(t, env, "feature", "exec", "cli", "--", "sh", "-c", "ulimit -c; ulimit -Hc"); r.code != 0 || r.stdout != "0\n0\n" {
		t.Fatalf("the consumer's core dump limits: exit %d %q, want 0 and 0\n%s", r.code, r.stdout, r.stderr)
	}
	r := runCLI(t, env, append(provider, `ulimit -c; ulimit -Hc; id -u; id -g; sleep 3 & wait`, "hold-marker")...)
	if want := fmt.Sprintf("0\n0\n1000\n%d\n", policy.ProviderGID(1000, 0)); r.code != 0 || r.stdout != want {
		t.Fatalf("provider: exit %d stdout %q, want %q\n%s", r.code, r.stdout, want, r.stderr)
	}
	r = runCLI(t, env, "feature", "exec", "cli", "--", "sh", "-c",
		"touch /tmp/watch.stop; sleep 1; echo leak; cat /tmp/watch.leak; echo seen; sort -u /tmp/watch.seen; echo denied; sort -u /tmp/watch.denied")
	if want := "leak\nseen\nseen\ndenied\ndenied\n"; r.code != 0 || r.stdout != want {
		t.Fatalf("the watcher's record:\n%s%s\nwant:\n%s", r.stdout, r.stderr, want)
	}
}
