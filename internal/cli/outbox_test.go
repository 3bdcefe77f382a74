package cli_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"agentbox/internal/cli"
	"agentbox/internal/wire"
)

// TestOutboxCommands: what `jailbee outbox ls|show|resolve` send and print,
// and the resolve forms refused before anything is sent.
func TestOutboxCommands(t *testing.T) {
	j := wire.OutboxJournal{Sandbox: "lead", Outbox: "issue", Name: "a.json", Ref: "pub-1", State: "blocked", Updated: 0,
		Actions: []wire.OutboxAction{{Kind: "create", State: "applied", URL: "https://x/issues/3", Number: 3}, {Kind: "close", State: "uncertain", Detail: "forge: close issue: HTTP 502"}}}
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
		if r.Op == "outbox-ls" {
			return okReply(wire.OutboxList{Proposals: []wire.OutboxJournal{j}})
		}
		return okReply(j)
	})
	t.Setenv(cli.StateDirEnv, f.state)
	for _, tc := range []struct {
		args     []string
		op, sent string
		out      string
	}{
		{[]string{"outbox", "ls"}, "outbox-ls", "", "PROPOSAL           STATE    MANIFEST  APPLIED  UPDATED\nlead/issue/a.json  blocked  pub-1     1/2      1970-01-01T00:00:00Z\n"},
		{[]string{"outbox", "show", "lead/issue/a.json"}, "outbox-show", `{"key":"lead/issue/a.json"}`,
			"lead/issue/a.json: blocked (manifest pub-1)\n  1. create: applied #3 https://x/issues/3\n  2. close: uncertain (forge: close issue: HTTP 502)\n"},
		{[]string{"outbox", "resolve", "lead/issue/a.json", "--applied", "--url", "https://x/issues/3"}, "outbox-resolve",
			`{"key":"lead/issue/a.json","applied":true,"url":"https://x/issues/3"}`, "resolved lead/issue/a.json: publishing continues (manifest pub-1)\n"},
		{[]string{"outbox", "resolve", "lead/issue/a.json", "--retry"}, "outbox-resolve", `{"key":"lead/issue/a.json","retry":true}`,
			"resolved lead/issue/a.json: publishing continues (manifest pub-1)\n"},
	} {
		before := len(f.requests())
		var out, errb bytes.Buffer
		code := runWith(t, strings.NewReader(""), &out, &errb, tc.args...)
		reqs := f.requests()[before:]
		if code != 0 || out.String() != tc.out || errb.Len() != 0 {
			t.Errorf("%v: exit %d stdout %q stderr %q, want %q", tc.args, code, out.String(), errb.String(), tc.out)
		}
		if len(reqs) != 1 || reqs[0].Op != tc.op || string(reqs[0].Args) != tc.sent && !(tc.sent == "" && len(reqs[0].Args) == 0) {
			t.Errorf("%v sent %v, want one %s %s", tc.args, reqs, tc.op, tc.sent)
		}
	}
	for _, args := range [][]string{
		{"outbox", "resolve", "k"},
		{"outbox", "resolve", "k", "--applied"},
		{"outbox", "resolve", "k", "--retry", "--url", "https://x"},
		{"outbox", "resolve", "k", "--applied", "--retry", "--url", "https://x"},
	} {
		before := len(f.requests())
		if code := runWith(t, strings.NewReader(""), io.Discard, io.Discard, args...); code != 2 || len(f.requests()) != before {
			t.Errorf("%v: exit %d, %d requests sent", args, code, len(f.requests())-before)
		}
	}
}
