package agent

import (
	"fmt"
	"strings"
	"testing"
)

// TestClaudeActivity: only the prompted process's own, fresh status file
// counts; idle counts only with no subagent history; anything else is
// unknown.
func TestClaudeActivity(t *testing.T) {
	no, yes := false, true
	id := Identity{PID: 42, Start: 5000}
	const procStartMs = 1_700_000_000_000
	probe := func(status string, change func(*Probe)) Probe {
		p := Probe{StartTicks: 5000, StartUnixMs: procStartMs, Subagents: &no,
			Session: &ClaudeSession{PID: 42, SessionID: "s", Cwd: "/workspace", StartedAt: procStartMs + 300, Status: status}}
		if change != nil {
			change(&p)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		p    Probe
		want Activity
	}{
		{"idle", probe("idle", nil), Idle},
		{"waiting", probe("waiting", nil), Waiting},
		{"busy", probe("busy", nil), Busy},
		{"shell or other state", probe("shell", nil), Unknown},
		{"idle after subagents", probe("idle", func(p *Probe) { p.Subagents = &yes }), Unknown},
		{"idle, history unknown", probe("idle", func(p *Probe) { p.Subagents = nil }), Unknown},
		{"waiting after subagents", probe("waiting", func(p *Probe) { p.Subagents = &yes }), Waiting},
		{"process gone", probe("idle", func(p *Probe) { p.StartTicks = 0 }), Unknown},
		{"pid recycled", probe("idle", func(p *Probe) { p.StartTicks = 5001 }), Unknown},
		{"no status file", probe("idle", func(p *Probe) { p.Session = nil }), Unknown},
		{"another process's file", probe("idle", func(p *Probe) { p.Session.PID = 43 }), Unknown},
		{"another directory's session", probe("idle", func(p *Probe) { p.Session.Cwd = "/tmp" }), Unknown},
		{"stale file (an earlier process)", probe("idle", func(p *Probe) { p.Session.StartedAt = procStartMs - startSlackMs - 1 }), Unknown},
		{"started at the slack's edge", probe("idle", func(p *Probe) { p.Session.StartedAt = procStartMs - startSlackMs }), Idle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ClaudeActivity(tc.p, id, "/workspace"); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// FuzzParseProbe: whatever a sandbox prints, parsing and judging it
// neither panics nor calls a foreign or stale file idle.
func FuzzParseProbe(f *testing.F) {
	f.Add([]byte(`{"start_ticks":5000,"start_unix_ms":1000,"session":{"pid":42,"cwd":"/workspace","startedAt":2000,"status":"idle"},"subagents":false}`))
	f.Add([]byte(`{"session":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, out []byte) {
		p, err := ParseProbe(out)
		if err != nil {
			return
		}
		id := Identity{PID: 42, Start: 5000}
		a := ClaudeActivity(p, id, "/workspace")
		if a.Counts() && (p.Session == nil || p.Session.PID != 42 || p.StartTicks != 5000 || p.Session.Cwd != "/workspace") {
			t.Fatalf("%s from %s", a, out)
		}
	})
}

// TestPaneTail: the last PaneTailLines non-empty lines, control
// characters (escape sequences' ESC) dropped, at most PaneTailBytes.
func TestPaneTail(t *testing.T) {
	var lines []string
	for i := range PaneTailLines + 5 {
		lines = append(lines, fmt.Sprintf("line %d\x1b[31m", i), "   ")
	}
	got := PaneTail([]byte(strings.Join(lines, "\n") + "\nend\x00\xff"))
	want := []string{}
	for i := 6; i < PaneTailLines+5; i++ {
		want = append(want, fmt.Sprintf("line %d[31m", i))
	}
	want = append(want, "end\uFFFD")
	if got != strings.Join(want, "\n") {
		t.Fatalf("got %q", got)
	}
	atMax := strings.Repeat("a", PaneTailBytes)
	if got := PaneTail([]byte(atMax)); got != atMax {
		t.Fatalf("a tail of %d bytes was cut to %d", PaneTailBytes, len(got))
	}
	if got := PaneTail([]byte("b" + atMax)); got != atMax {
		t.Fatalf("one byte past the bound: %d bytes", len(got))
	}
}
