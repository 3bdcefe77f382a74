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
	var asked string
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		var a wire.NameArgs
		json.Unmarshal(r.Args, &a)
		asked = r.Op + " " + a.Name
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
	if out.String() != want || asked != "ps kid" {
		t.Errorf("ps (asked %q):\n%s\nwant\n%s", asked, out.String(), want)
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
