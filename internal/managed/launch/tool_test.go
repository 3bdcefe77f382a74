package launch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"agentbox/internal/crashpoint"
	"agentbox/internal/managed/compose"
	"agentbox/internal/managed/dockertest"
	"agentbox/internal/managed/endpoint"
	"agentbox/internal/managed/launch"
	"agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/provider"
)

// spoolTarget is the Base document's tool-request spool in the container.
const spoolTarget = "/run/branchbox/leases/tool-requests/delivery"

// toolEndpoint is a trusted endpoint on the assignment's socket that
// counts the frames it answers, per request id.
type toolEndpoint struct {
	mu   sync.Mutex
	seen map[string]int
}

func startEndpoint(t testing.TB, socket string) *toolEndpoint {
	t.Helper()
	ep := &toolEndpoint{seen: map[string]int{}}
	managedtest.ServeEndpoint(t, socket, func(_ context.Context, frame []byte) ([]byte, error) {
		ids, err := endpoint.FrameIDs(frame)
		if err != nil {
			return nil, err
		}
		ep.mu.Lock()
		ep.seen[ids.RequestID]++
		ep.mu.Unlock()
		return []byte(`{"done":"` + ids.RequestID + `"}`), nil
	})
	return ep
}

func (ep *toolEndpoint) count(id string) int {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.seen[id]
}

// wantResponse is the consumer's response file for id from that endpoint.
func wantResponse(id string) string {
	return fmt.Sprintf(`{"version":"1","run_id":"run-1","lease_id":"delivery_requests","consumer":"coding-agent","request_id":%q,"payload":{"done":%q}}`+"\n", id, id)
}

// spoolRequest writes request id as the consumer does, inside the
// container: the capability read from the spool, a temporary file of
// mode 0600, renamed into place.
func spoolRequest(t testing.TB, cid, id, payload string) {
	t.Helper()
	script := fmt.Sprintf(`set -e; cd %s; umask 077
printf '{"version":"1","run_id":"run-1","lease_id":"delivery_requests","consumer":"coding-agent","request_id":"%%s","capability":"%%s","payload":%%s}' %q "$(cat .capability)" %q > requests/.%s.tmp
mv requests/.%s.tmp requests/%s.json`, spoolTarget, id, payload, id, id, id)
	dockertest.Docker(t, "exec", "-u", "1000", cid, "sh", "-c", script)
}

func TestDispatchToolLive(t *testing.T) {
	s := newSetup(t, defaultFiles())
	ep := startEndpoint(t, s.fixture.Source(4, 0))
	sum, err := s.start("tools")
	if err != nil {
		t.Fatal(err)
	}
	cid := sum.Runtime.ContainerID
	// The spool as the consumer sees it.
	got := dockertest.Docker(t, "exec", "-u", "1000", cid, "sh", "-c",
		"cd "+spoolTarget+" && stat -c '%n %a %u %g %F' . .binding.json .capability requests responses .processing")
	want := ". 755 0 0 directory\n.binding.json 444 0 0 regular file\n.capability 444 0 0 regular file\n" +
		"requests 700 1000 1000 directory\nresponses 755 0 0 directory\n.processing 700 0 0 directory"
	if got != want {
		t.Fatalf("the spool:\n%s\nwant:\n%s", got, want)
	}
	for _, probe := range []string{"ls .processing", "touch responses/x", "touch .capability", "rm .binding.json"} {
		if out, code := execIn(t, s, "tools", "sh", "-c", "cd "+spoolTarget+" && "+probe); code == 0 {
			t.Errorf("the consumer could %s: %s", probe, out)
		}
	}
	var binding map[string]any
	if err := json.Unmarshal([]byte(dockertest.Docker(t, "exec", "-u", "1000", cid, "cat", spoolTarget+"/.binding.json")), &binding); err != nil ||
		binding["request_directory"] != spoolTarget+"/requests" || binding["replay_policy"] != "exact-digest-replay-v1" || binding["max_pending_requests"] != 16.0 {
		t.Fatalf("binding: %v %v", binding, err)
	}

	spoolRequest(t, cid, "r1", `{"n":1}`)
	res, err := launch.DispatchTool(context.Background(), s.cfg, "tools", "delivery_requests", "r1", 0)
	if err != nil || res.Cached || string(res.Response.Payload) != `{"done":"r1"}` {
		t.Fatalf("dispatch: %+v %v", res, err)
	}
	if got := dockertest.Docker(t, "exec", "-u", "1000", cid, "cat", spoolTarget+"/responses/r1.json"); got+"\n" != wantResponse("r1") {
		t.Fatalf("the consumer reads %q", got)
	}
	if _, err := launch.DispatchTool(context.Background(), s.cfg, "tools", "delivery_requests", "r2", 0); !isCode(err, launch.CodeNotPending) {
		t.Fatalf("nothing spooled: %v", err)
	}
	// Hostile requests from inside: terminal, never sent.
	dockertest.Docker(t, "exec", "-u", "1000", cid, "ln", "-s", "/etc/passwd", spoolTarget+"/requests/r3.json")
	if _, err := launch.DispatchTool(context.Background(), s.cfg, "tools", "delivery_requests", "r3", 0); !isCode(err, launch.CodeDispatch) {
		t.Fatalf("a symlinked request: %v", err)
	}
	dockertest.Docker(t, "exec", "-u", "1000", cid, "rm", spoolTarget+"/requests/r3.json")
	dockertest.Docker(t, "exec", "-u", "1000", cid, "sh", "-c", "cd "+spoolTarget+
		` && printf '{"version":"1","run_id":"run-1","lease_id":"delivery_requests","consumer":"coding-agent","request_id":"r4","capability":"forged-capability-0123456789abcdef","payload":{}}' > requests/r4.json && chmod 600 requests/r4.json`)
	_, err = launch.DispatchTool(context.Background(), s.cfg, "tools", "delivery_requests", "r4", 0)
	if !isCode(err, launch.CodeDispatch) || !strings.Contains(err.Error(), "capability") {
		t.Fatalf("a forged capability: %v", err)
	}
	if ep.count("r3")+ep.count("r4") != 0 {
		t.Fatal("the endpoint saw a refused request")
	}

	r, err := launch.Teardown(context.Background(), s.cfg, "tools")
	if err != nil || !r.ResidueFree {
		t.Fatalf("teardown: %+v %v", r, err)
	}
	spool := compose.SpoolVolumeName("run-1", "delivery_requests")
	if out, err := exec.Command("docker", "volume", "inspect", spool).CombinedOutput(); err == nil {
		t.Fatalf("the spool volume survived teardown: %s", out)
	}
}

// TestDispatchCrashMatrix kills dispatch-tool (SIGKILL) at every step and
// runs it again: under the signed policy the consumer always gets the
// same bytes and the endpoint sees a request again only when the kill
// came before its response was recorded; without the policy a claim
// whose relay may have run stays blocked.
func TestDispatchCrashMatrix(t *testing.T) {
	points := []string{crashpoint.DispatchStaged, crashpoint.DispatchClaimAppended, crashpoint.DispatchClaimed,
		crashpoint.DispatchRelayed, crashpoint.DispatchRecordAppended, crashpoint.DispatchRecorded, crashpoint.DispatchResponded}
	for _, tc := range []struct {
		name   string
		signed bool
		// per point: the rerun's exit status and the endpoint's count
		rerun map[string][2]int
	}{
		{"signed", true, map[string][2]int{
			crashpoint.DispatchStaged: {0, 1}, crashpoint.DispatchClaimAppended: {0, 1}, crashpoint.DispatchClaimed: {0, 1},
			crashpoint.DispatchRelayed: {0, 2}, crashpoint.DispatchRecordAppended: {0, 1},
			crashpoint.DispatchRecorded: {0, 1}, crashpoint.DispatchResponded: {0, 1}}},
		{"unsigned", false, map[string][2]int{
			crashpoint.DispatchStaged: {0, 1}, crashpoint.DispatchClaimAppended: {1, 0}, crashpoint.DispatchClaimed: {1, 0},
			crashpoint.DispatchRelayed: {1, 1}, crashpoint.DispatchRecordAppended: {0, 1},
			crashpoint.DispatchRecorded: {0, 1}, crashpoint.DispatchResponded: {0, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetupWith(t, defaultFiles(), func(doc map[string]any) {
				if !tc.signed {
					delete(doc["leases"].([]any)[5].(map[string]any), "replay_policy")
				}
			})
			ep := startEndpoint(t, s.fixture.Source(4, 0))
			sum, err := s.start("crash")
			if err != nil {
				t.Fatal(err)
			}
			cid := sum.Runtime.ContainerID
			run := func(id, point string) (int, string) {
				cmd := exec.Command(branchboxBinary(t), "feature", "dispatch-tool", "crash", "--lease", "delivery_requests",
					"--request-id", id, "--json")
				cmd.Env = []string{"PATH=" + provider.SafePATH, s.fixture.Env(), "BRANCHBOX_STATE_DIR=" + s.cfg.StateRoot}
				if point != "" {
					cmd.Env = append(cmd.Env, crashpoint.EnvVar+"="+point)
				}
				out, err := cmd.Output()
				var ee *exec.ExitError
				switch {
				case err == nil:
					return 0, string(out)
				case errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL:
					return -9, string(out)
				case errors.As(err, &ee):
					return ee.ExitCode(), string(out)
				}
				t.Fatal(err)
				return 0, ""
			}
			for _, point := range points {
				id := "c-" + strings.TrimPrefix(point, "dispatch-")
				spoolRequest(t, cid, id, `{"step":"`+point+`"}`)
				if code, out := run(id, point); code != -9 {
					t.Fatalf("%s: not killed: %d %s", point, code, out)
				}
				code, out := run(id, "")
				want := tc.rerun[point]
				if code != want[0] || ep.count(id) != want[1] {
					t.Fatalf("%s: rerun exit %d (want %d), endpoint saw %d (want %d)\n%s", point, code, want[0], ep.count(id), want[1], out)
				}
				if code == 0 {
					got := dockertest.Docker(t, "exec", "-u", "1000", cid, "cat", spoolTarget+"/responses/"+id+".json")
					if got+"\n" != wantResponse(id) || !strings.Contains(out, `"status": "dispatched"`) {
						t.Fatalf("%s: the consumer reads %q\n%s", point, got, out)
					}
					// Nothing of it left behind: no staged request, no
					// temporary response.
					if left := dockertest.Docker(t, "exec", "-u", "0", cid, "ls", "-A", spoolTarget+"/.processing"); strings.Contains(left, id) {
						t.Fatalf("%s: .processing/ holds %q", point, left)
					}
					// Once more: from the ledger, the endpoint untouched.
					if code, out := run(id, ""); code != 0 || !strings.Contains(out, `"replayed": true`) || ep.count(id) != want[1] {
						t.Fatalf("%s: replay exit %d, endpoint %d\n%s", point, code, ep.count(id), out)
					}
				} else if !strings.Contains(out, `"retryable": false`) || !strings.Contains(out, "blocked") {
					t.Fatalf("%s: the blocked claim's report: %s", point, out)
				}
			}
			if r, err := launch.Teardown(context.Background(), s.cfg, "crash"); err != nil || !r.ResidueFree {
				t.Fatalf("teardown: %+v %v", r, err)
			}
			if _, err := os.Stat(s.cfg.StateRoot + "/features/crash"); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("the ledger survived teardown")
			}
		})
	}
}
