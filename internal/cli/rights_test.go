package cli_test

import (
	"bytes"
	"strings"
	"testing"

	"agentbox/internal/cli"
	"agentbox/internal/wire"
)

// TestRightsTableAndFlags: `jailbee rights` shows each right with its owner
// and expiry ("(no expiry)" for none), prints the broker's notes on stderr,
// and sends the add and remove flags as the op's arguments.
func TestRightsTableAndFlags(t *testing.T) {
	reply := wire.RightsResult{
		Rights: []wire.RightInfo{
			{Kind: "loose", Owner: "orchestration", ExpiresAt: "2026-12-01T23:00:00Z"},
			{Kind: "mount", Item: "data", Owner: "hand"},
		},
		Notes: []string{"egress pypi.org was not held"},
	}
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response { return okReply(reply) })
	t.Setenv(cli.StateDirEnv, f.state)
	var out, errb bytes.Buffer
	code := runWith(t, strings.NewReader(""), &out, &errb, "rights", "kid", "--add-mount", "data", "--loose", "--remove-egress", "pypi.org")
	if code != 0 {
		t.Fatalf("rights: exit %d %s", code, errb.String())
	}
	want := "" +
		"KIND   ITEM  OWNER          EXPIRES\n" +
		"loose  -     orchestration  2026-12-01T23:00:00Z\n" +
		"mount  data  hand           (no expiry)\n"
	if out.String() != want || errb.String() != "egress pypi.org was not held\n" {
		t.Errorf("rights:\n%s\nstderr %q\nwant\n%s", out.String(), errb.String(), want)
	}
	reqs := f.requests()
	if len(reqs) != 1 || reqs[0].Op != "rights" ||
		string(reqs[0].Args) != `{"name":"kid","add":{"mounts":["data"],"loose":true},"remove":{"egress":["pypi.org"]}}` {
		t.Errorf("rights sent %v", reqs)
	}
}
