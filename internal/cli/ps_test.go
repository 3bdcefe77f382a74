package cli_test

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"agentbox/internal/cli"
	"agentbox/internal/wire"
)

// TestPsTableAndJSON: jailbee ps sends NAME to the broker's ps op and
// shows each service's state: pid, exit code or signal, not started.
func TestPsTableAndJSON(t *testing.T) {
	code := 3
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		return okReply(wire.PsResult{Services: []wire.ServiceInfo{
			{Name: "aux", State: "not started"},
			{Name: "db", Selected: true, State: "running", PID: 42},
			{Name: "web", Selected: true, State: "exited", ExitCode: &code},
			{Name: "worker", Selected: true, State: "exited"},
		}})
	})
	t.Setenv(cli.StateDirEnv, f.state)
	var out, errb bytes.Buffer
	if code := runWith(t, strings.NewReader(""), &out, &errb, "ps", "kid"); code != 0 {
		t.Fatalf("ps: exit %d %s", code, errb.String())
	}
	want := "" +
		"SERVICE  SELECTED  STATE\n" +
		"aux      no        not started\n" +
		"db       yes       running (pid 42)\n" +
		"web      yes       exited (code 3)\n" +
		"worker   yes       exited (signal)\n"
	var a wire.NameArgs
	if reqs := f.requests(); len(reqs) != 1 || reqs[0].Op != "ps" || json.Unmarshal(reqs[0].Args, &a) != nil || a.Name != "kid" {
		t.Errorf("ps asked the broker %+v, want ps of kid", reqs)
	}
	if out.String() != want {
		t.Errorf("ps:\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	if code := runWith(t, strings.NewReader(""), &out, io.Discard, "ps", "kid", "--json"); code != 0 {
		t.Fatalf("ps --json: exit %d", code)
	}
	var got []map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got) != 4 {
		t.Fatalf("ps --json: %v\n%s", err, out.String())
	}
	if w := got[2]; len(w) != 4 || w["name"] != "web" || w["selected"] != true || w["state"] != "exited" || w["exit_code"] != 3.0 {
		t.Errorf("ps --json, web: %v", w)
	}
}
