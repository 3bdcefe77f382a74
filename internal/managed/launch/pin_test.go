package launch_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"agentbox/internal/managed/launch"
	"agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/provider"
)

// TestAssignmentSwap: after `feature start`, the
// document at the manifest path is replaced by valid ones (a provider
// lease widened to /bin/sh; a version 2 downgrade). exec-provider and
// dispatch-tool refuse with assignment_changed, start nothing and relay
// nothing; the original bytes put back work again; a record without the
// digest (an older branchbox's) is refused and still torn down. Needs
// root and the Docker engine (dockertest.Require).
func TestAssignmentSwap(t *testing.T) {
	s := newSetup(t, defaultFiles())
	ep := startEndpoint(t, s.fixture.Source(4, 0))
	sum, err := s.start("pinned")
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	cid := sum.Runtime.ContainerID
	original, err := os.ReadFile(s.fixture.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MODEL_ACCESS_TOKEN", "model-"+managedtest.Secret)
	execProvider := func(exe string, args ...string) (int, string, error) {
		var out bytes.Buffer
		code, err := launch.ExecProvider(context.Background(), s.cfg, "pinned",
			provider.Request{Executable: exe, Inherit: []string{"MODEL_ACCESS_TOKEN"}, Args: args},
			os.Environ(), strings.NewReader(""), &out, &out)
		return code, out.String(), err
	}
	write := func(edit func(doc map[string]any)) {
		doc := managedtest.Clone(s.fixture.Doc)
		edit(doc)
		managedtest.WriteFile(t, s.fixture.Path, managedtest.Marshal(doc), 0o600)
	}

	// A provider lease widened to a shell after the start.
	write(func(doc map[string]any) { managedtest.Lease(doc, 0)["executable"] = "/bin/sh" })
	if code, out, err := execProvider("/bin/sh", "-c", "echo ran"); !isCode(err, launch.CodeAssignmentChanged) || out != "" {
		t.Fatalf("exec-provider under a widened assignment: %d %q %v", code, out, err)
	}
	// A version 2 downgrade (no workspace consumer, no images).
	write(func(doc map[string]any) {
		doc["version"] = "2"
		for _, k := range []string{"workspace_consumer", "service_images", "port_proxy_image", "published_ports"} {
			delete(doc, k)
		}
	})
	if code, out, err := execProvider(probe, "env"); !isCode(err, launch.CodeAssignmentChanged) || out != "" {
		t.Fatalf("exec-provider under a downgraded assignment: %d %q %v", code, out, err)
	}
	spoolRequest(t, cid, "r1", `{"n":1}`)
	if _, err := launch.DispatchTool(context.Background(), s.cfg, "pinned", "delivery_requests", "r1", 0); !isCode(err, launch.CodeAssignmentChanged) {
		t.Fatalf("dispatch-tool under a downgraded assignment: %v", err)
	}
	if ep.count("r1") != 0 {
		t.Fatal("the endpoint saw a request under a replaced assignment")
	}

	// The bytes the start validated: both work.
	managedtest.WriteFile(t, s.fixture.Path, original, 0o600)
	if code, out, err := execProvider(probe, "env"); err != nil || code != 0 || !strings.Contains(out, "MODEL_ACCESS_TOKEN=") {
		t.Fatalf("exec-provider under the started assignment: %d %q %v", code, out, err)
	}
	if res, err := launch.DispatchTool(context.Background(), s.cfg, "pinned", "delivery_requests", "r1", 0); err != nil || string(res.Response.Payload) != `{"done":"r1"}` {
		t.Fatalf("dispatch-tool under the started assignment: %+v %v", res, err)
	}

	// A record an older branchbox wrote, without the digest: refused.
	path := launch.RecordPath(s.cfg.StateRoot, "pinned")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.Contains(line, `"assignment_sha256"`) {
			kept = append(kept, line)
		}
	}
	managedtest.WriteFile(t, path, []byte(strings.Join(kept, "\n")), 0o600)
	if code, out, err := execProvider(probe, "env"); !isCode(err, launch.CodeAssignmentChanged) || out != "" {
		t.Fatalf("exec-provider from a record without the digest: %d %q %v", code, out, err)
	}
	if r, err := launch.Teardown(context.Background(), s.cfg, "pinned"); err != nil || !r.ResidueFree {
		t.Fatalf("teardown of a record without the digest: %+v %v", r, err)
	}
}
