package cli_test

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"agentbox/internal/cli"
	"agentbox/internal/wire"
)

// usageReply is a broker's answer to "usage": tree lead with its
// orchestrator, a child and a destroyed child of the same name; tree solo.
func usageReply() wire.UsageResult {
	at := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	return wire.UsageResult{
		Rows: []wire.UsageRow{
			{Name: "fix-12", UUID: "u2", Tree: "lead", Usage: wire.Usage{Requests: 3, InputTokens: 1200, OutputTokens: 340, CacheReadInputTokens: 50000, CacheCreationInputTokens: 800}, Updated: at},
			{Name: "fix-12", UUID: "u0", Tree: "lead", Usage: wire.Usage{Requests: 1, InputTokens: 10, OutputTokens: 20, CacheReadInputTokens: 30, CacheCreationInputTokens: 40}, Destroyed: true, Updated: at},
			{Name: "lead", UUID: "u1", Tree: "lead", Usage: wire.Usage{Requests: 7, InputTokens: 9000, OutputTokens: 2100}, Updated: at},
			{Name: "solo", UUID: "u3", Tree: "solo", Usage: wire.Usage{Requests: 1, InputTokens: 5, OutputTokens: 6}, Updated: at},
		},
		Trees: []wire.TreeUsage{
			{Tree: "lead", Usage: wire.Usage{Requests: 11, InputTokens: 10210, OutputTokens: 2460, CacheReadInputTokens: 50030, CacheCreationInputTokens: 840}},
			{Tree: "solo", Usage: wire.Usage{Requests: 1, InputTokens: 5, OutputTokens: 6}},
		},
	}
}

// TestUsageTableAndJSON: the table has a row per sandbox (a destroyed one
// marked) and a TOTAL line per tree as the broker summed it; --json is
// the rows with the API's field names; NAME is sent as the op's name.
func TestUsageTableAndJSON(t *testing.T) {
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response { return okReply(usageReply()) })
	t.Setenv(cli.StateDirEnv, f.state)
	var out, errb bytes.Buffer
	if code := runWith(t, strings.NewReader(""), &out, &errb, "usage"); code != 0 {
		t.Fatalf("usage: exit %d %s", code, errb.String())
	}
	want := "" +
		"NAME                TREE  REQUESTS  INPUT  OUTPUT  CACHE READ  CACHE WRITE\n" +
		"fix-12              lead  3         1200   340     50000       800\n" +
		"fix-12 (destroyed)  lead  1         10     20      30          40\n" +
		"lead                lead  7         9000   2100    0           0\n" +
		"solo                solo  1         5      6       0           0\n" +
		"TOTAL               lead  11        10210  2460    50030       840\n" +
		"TOTAL               solo  1         5      6       0           0\n"
	if out.String() != want {
		t.Errorf("usage:\n%s\nwant\n%s", out.String(), want)
	}

	out.Reset()
	if code := runWith(t, strings.NewReader(""), &out, io.Discard, "usage", "lead", "--json"); code != 0 {
		t.Fatalf("usage --json: exit %d", code)
	}
	var got []map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("usage --json: %v\n%s", err, out.String())
	}
	wantFields := map[string]any{"name": "fix-12", "uuid": "u2", "tree": "lead", "requests": 3.0, "input_tokens": 1200.0,
		"output_tokens": 340.0, "cache_read_input_tokens": 50000.0, "cache_creation_input_tokens": 800.0,
		"destroyed": false, "updated": "2025-06-01T12:00:00Z"}
	if len(got) != 4 || len(got[0]) != len(wantFields) || got[1]["destroyed"] != true || got[3]["name"] != "solo" {
		t.Fatalf("usage --json: %s", out.String())
	}
	for k, v := range wantFields {
		if got[0][k] != v {
			t.Errorf("usage --json: %s is %v, want %v", k, got[0][k], v)
		}
	}

	reqs := f.requests()
	if len(reqs) != 2 || reqs[0].Op != "usage" || string(reqs[0].Args) != "{}" || string(reqs[1].Args) != `{"name":"lead"}` {
		t.Errorf("usage sent %v", reqs)
	}
}

// TestUsageNothingRecorded: no usage yet is the header alone, and [] in
// JSON.
func TestUsageNothingRecorded(t *testing.T) {
	f := newFakeAdmin(t, func(r adminRequest) *wire.Response { return okReply(wire.UsageResult{}) })
	t.Setenv(cli.StateDirEnv, f.state)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"usage"}, "NAME  TREE  REQUESTS  INPUT  OUTPUT  CACHE READ  CACHE WRITE\n"},
		{[]string{"usage", "--json"}, "[]\n"},
	} {
		var out bytes.Buffer
		if code := runWith(t, strings.NewReader(""), &out, io.Discard, tc.args...); code != 0 || out.String() != tc.want {
			t.Errorf("%v: exit %d %q, want %q", tc.args, code, out.String(), tc.want)
		}
	}
}

// TestLsTokensColumn: TOKENS is input plus output tokens as the broker
// sent them, humanised; none is "-".
func TestLsTokensColumn(t *testing.T) {
	for _, tc := range []struct {
		tokens int64
		want   string
	}{
		{0, "-"},
		{7, "7"},
		{999, "999"},
		{1000, "1.0k"},
		{12345, "12.3k"},
		{999949, "999.9k"},
		{999950, "1.0M"},
		{4123456, "4.1M"},
		{2_500_000_000, "2.5G"},
		{7_000_000_000_000_000, "7000.0T"},
	} {
		f := newFakeAdmin(t, func(r adminRequest) *wire.Response {
			return okReply([]wire.SandboxInfo{{Name: "lead", Role: "orchestrator", State: "running", Running: true, Branch: "main", UUID: "u1", Tokens: tc.tokens}})
		})
		var out bytes.Buffer
		if code := runWith(t, strings.NewReader(""), &out, io.Discard, "ls", "--state", f.state); code != 0 {
			t.Fatalf("ls: exit %d", code)
		}
		lines := strings.Split(out.String(), "\n")
		header, row := strings.Fields(lines[0]), strings.Fields(lines[1])
		if len(header) != 9 || header[6] != "TOKENS" || len(row) != 8 || row[6] != tc.want {
			t.Errorf("%d tokens: ls\n%s\nwant TOKENS %s", tc.tokens, out.String(), tc.want)
		}
	}
}
