package broker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"agentbox/internal/cli"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// addUsage records usage for a sandbox through the broker's own store,
// as its model socket will: nothing in the broker produces usage yet.
func (e *testEnv) addUsage(name string, u store.Usage, at time.Time) {
	e.t.Helper()
	sb := e.row(name)
	if err := e.b.Store().AddUsage(context.Background(), name, sb.UUID, sb.Tree(), u, at); err != nil {
		e.t.Fatal(err)
	}
}

// usage runs the admin usage op.
func (e *testEnv) usage(name string) (wire.UsageResult, error) {
	e.t.Helper()
	var res wire.UsageResult
	err := e.admin("usage", wire.UsageArgs{Name: name}, &res)
	return res, err
}

// jb runs a host command in-process against the env's broker and returns
// its stdout.
func (e *testEnv) jb(args ...string) string {
	e.t.Helper()
	var out, errb bytes.Buffer
	code := cli.Run(context.Background(), "jailbee", append(args, "--state", e.state), cli.Deps{
		Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
	})
	if code != 0 {
		e.t.Fatalf("jailbee %v: exit %d: %s", args, code, errb.String())
	}
	return out.String()
}

// usageNames is each row as name/tree, "+d" when destroyed.
func usageNames(rows []wire.UsageRow) string {
	var out []string
	for _, r := range rows {
		s := r.Name + "/" + r.Tree
		if r.Destroyed {
			s += "+d"
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// TestAdminUsage: the usage op lists every sandbox's totals, destroyed
// ones and a reused name included, with each tree's total; NAME narrows
// to a sandbox and, for an orchestrator, its tree; ls carries each live
// sandbox's tokens; the host commands print it; all of it survives a
// broker restart.
func TestAdminUsage(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("lead")
	e.child("kid", "lead")
	e.child("old", "lead")
	e.orchestrator("solo")
	e.orchestrator("idle")
	t0 := time.Now().Add(-time.Minute)
	e.addUsage("lead", store.Usage{Requests: 2, InputTokens: 1000, OutputTokens: 200, CacheReadInputTokens: 3000, CacheCreationInputTokens: 40}, t0)
	e.addUsage("kid", store.Usage{Requests: 1, InputTokens: 10000, OutputTokens: 2345}, t0)
	e.addUsage("kid", store.Usage{Requests: 1, InputTokens: 1, OutputTokens: 1, CacheReadInputTokens: 7}, t0.Add(time.Second))
	e.addUsage("old", store.Usage{Requests: 1, InputTokens: 5, OutputTokens: 5}, t0)
	e.addUsage("solo", store.Usage{Requests: 4, InputTokens: 2_000_000, OutputTokens: 100_000}, t0)
	if err := e.admin("destroy", wire.DestroyArgs{Name: "old", Force: true}, nil); err != nil {
		t.Fatal(err)
	}
	e.child("old", "lead")
	e.addUsage("old", store.Usage{Requests: 1, InputTokens: 50, OutputTokens: 50}, t0.Add(2*time.Second))

	leadTotal := wire.TreeUsage{Tree: "lead", Usage: wire.Usage{Requests: 6, InputTokens: 11056, OutputTokens: 2601, CacheReadInputTokens: 3007, CacheCreationInputTokens: 40}}
	soloTotal := wire.TreeUsage{Tree: "solo", Usage: wire.Usage{Requests: 4, InputTokens: 2_000_000, OutputTokens: 100_000}}
	check := func(t *testing.T, e *testEnv) {
		for _, tc := range []struct {
			name  string
			rows  string
			trees []wire.TreeUsage
		}{
			{"", "kid/lead lead/lead old/lead+d old/lead solo/solo", []wire.TreeUsage{leadTotal, soloTotal}},
			{"lead", "kid/lead lead/lead old/lead+d old/lead", []wire.TreeUsage{leadTotal}},
			// A child: its rows, and its tree's whole total.
			{"kid", "kid/lead", []wire.TreeUsage{leadTotal}},
			{"old", "old/lead+d old/lead", []wire.TreeUsage{leadTotal}},
			{"solo", "solo/solo", []wire.TreeUsage{soloTotal}},
			// A sandbox with no usage: no rows, no error.
			{"idle", "", []wire.TreeUsage{}},
		} {
			res, err := e.usage(tc.name)
			if err != nil {
				t.Fatalf("usage %q: %v", tc.name, err)
			}
			if got := usageNames(res.Rows); got != tc.rows {
				t.Errorf("usage %q: rows %s, want %s", tc.name, got, tc.rows)
			}
			if len(res.Trees) != len(tc.trees) || (len(tc.trees) > 0 && res.Trees[0] != tc.trees[0]) {
				t.Errorf("usage %q: trees %+v, want %+v", tc.name, res.Trees, tc.trees)
			}
		}
		res, _ := e.usage("kid")
		if r := res.Rows[0]; r.UUID != e.info("kid").UUID || r.Usage != (wire.Usage{Requests: 2, InputTokens: 10001, OutputTokens: 2346, CacheReadInputTokens: 7}) ||
			!r.Updated.Equal(t0.Add(time.Second).Truncate(time.Millisecond)) {
			t.Errorf("kid's row: %+v", r)
		}
		_, err := e.usage("nope")
		wantWireError(t, "usage of a missing sandbox", err, wire.CodeNotFound, "no sandbox named nope")

		for name, want := range map[string]int64{"lead": 1200, "kid": 12347, "old": 100, "solo": 2_100_000, "idle": 0} {
			if got := e.info(name).Tokens; got != want {
				t.Errorf("ls: %s has %d tokens, want %d", name, got, want)
			}
		}

		// What the user sees.
		table := e.jb("usage")
		for _, line := range []string{
			"NAME             TREE  REQUESTS  INPUT    OUTPUT  CACHE READ  CACHE WRITE",
			"kid              lead  2         10001    2346    7           0",
			"old (destroyed)  lead  1         5        5       0           0",
			"old              lead  1         50       50      0           0",
			"TOTAL            lead  6         11056    2601    3007        40",
			"TOTAL            solo  4         2000000  100000  0           0",
		} {
			if !strings.Contains(table, line+"\n") {
				t.Errorf("jailbee usage lacks %q:\n%s", line, table)
			}
		}
		var rows []map[string]any
		if err := json.Unmarshal([]byte(e.jb("usage", "kid", "--json")), &rows); err != nil || len(rows) != 1 {
			t.Fatalf("jailbee usage kid --json: %v %v", rows, err)
		}
		for k, v := range map[string]any{"name": "kid", "tree": "lead", "requests": 2.0, "input_tokens": 10001.0, "output_tokens": 2346.0,
			"cache_read_input_tokens": 7.0, "cache_creation_input_tokens": 0.0, "destroyed": false} {
			if rows[0][k] != v {
				t.Errorf("jailbee usage kid --json: %s is %v, want %v", k, rows[0][k], v)
			}
		}
		ls := e.jb("ls")
		for name, col := range map[string]string{"lead": "1.2k", "kid": "12.3k", "old": "100", "solo": "2.1M", "idle": "-"} {
			if got := lsColumn(t, ls, name, "TOKENS"); got != col {
				t.Errorf("jailbee ls: %s's TOKENS is %q, want %q\n%s", name, got, col, ls)
			}
		}
	}
	check(t, e)
	e.restart()
	t.Run("after a restart", func(t *testing.T) { check(t, e.withT(t)) })

	// Bad arguments are refused.
	err := e.admin("usage", map[string]any{"name": "lead", "tree": "x"}, nil)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeBadRequest {
		t.Fatalf("usage with an unknown field: %v", err)
	}
}

// lsColumn is the value in column col of name's row of an ls table.
func lsColumn(t testing.TB, table, name, col string) string {
	t.Helper()
	lines := strings.Split(table, "\n")
	at := strings.Index(lines[0], col)
	if at < 0 {
		t.Fatalf("ls has no %s column:\n%s", col, table)
	}
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, name+" ") && len(l) > at {
			return strings.Fields(l[at:])[0]
		}
	}
	t.Fatalf("ls has no row %s:\n%s", name, table)
	return ""
}
