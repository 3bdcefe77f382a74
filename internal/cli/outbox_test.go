package cli_test

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

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

// TestJSONOutputEscapesTerminalControls: --json prints what a sandbox
// wrote (here a proposal's body): C1 controls, format characters and bytes
// that are not UTF-8 come out as \u escapes, nothing a terminal acts on,
// and the JSON says the same (a byte that is not UTF-8 reads as U+FFFD,
// as it would anyway).
func TestJSONOutputEscapesTerminalControls(t *testing.T) {
	raw := "{\"body\":\"a\u009d0;t\u009c b\u202ec \U000e0001 d\x9b2J\"}"
	j := wire.OutboxJournal{Sandbox: "lead", Outbox: "issue", Name: "a.json", Ref: "pub-1", State: "done", Proposal: json.RawMessage(raw)}
	f := newFakeAdmin(t, func(adminRequest) *wire.Response {
		return &wire.Response{V: wire.Version, OK: true, Result: mustJSON(t, j)}
	})
	t.Setenv(cli.StateDirEnv, f.state)
	var out, errb bytes.Buffer
	if code := runWith(t, strings.NewReader(""), &out, &errb, "outbox", "show", "lead/issue/a.json", "--json"); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !utf8.Valid(out.Bytes()) || strings.ContainsFunc(out.String(), func(r rune) bool {
		return r >= 0x80 && r < 0xa0 || unicode.Is(unicode.Cf, r) || r == utf8.RuneError
	}) {
		t.Fatalf("--json printed a terminal control: %q", out.String())
	}
	var got wire.OutboxJournal
	var p struct{ Body string }
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || json.Unmarshal(got.Proposal, &p) != nil ||
		p.Body != "a\u009d0;t\u009c b\u202ec \U000e0001 d\ufffd2J" {
		t.Fatalf("--json printed %q: %v %q", out.String(), err, p.Body)
	}
}

// mustJSON is v's JSON, kept byte for byte (json.Marshal would make
// invalid UTF-8 in a RawMessage valid).
func mustJSON(t *testing.T, v wire.OutboxJournal) json.RawMessage {
	t.Helper()
	proposal := v.Proposal
	v.Proposal = json.RawMessage(`"PROPOSAL"`)
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Replace(data, []byte(`"PROPOSAL"`), proposal, 1)
}

// TestOutboxShowIsPrintable: an action's detail is the forge's message
// and its URL the forge's answer; show prints them with every character
// a terminal acts on shown as a space.
func TestOutboxShowIsPrintable(t *testing.T) {
	j := wire.OutboxJournal{Sandbox: "lead", Outbox: "issue", Name: "a.json", Ref: "pub-1", State: "blocked",
		Actions: []wire.OutboxAction{{Kind: "create", State: "uncertain", URL: "https://x/\x1b[2J", Detail: "forge: \x1b]0;t\x07 HTTP\u202e 502\nx"}}}
	f := newFakeAdmin(t, func(adminRequest) *wire.Response { return okReply(j) })
	t.Setenv(cli.StateDirEnv, f.state)
	var out, errb bytes.Buffer
	if code := runWith(t, strings.NewReader(""), &out, &errb, "outbox", "show", "lead/issue/a.json"); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := "lead/issue/a.json: blocked (manifest pub-1)\n  1. create: uncertain https://x/ [2J (forge:  ]0;t  HTTP  502 x)\n"
	if out.String() != want {
		t.Errorf("printed %q, want %q", out.String(), want)
	}
}
