package agentprobe

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/agent"
)

// fakeHome is a home holding a session file for pid (this test process,
// a live one) and, when transcript is not nil, its transcript.
func fakeHome(t *testing.T, pid int, session string, transcript *string) string {
	t.Helper()
	home := t.TempDir()
	sessions := filepath.Join(home, ".claude", "sessions")
	if err := os.MkdirAll(sessions, 0o700); err != nil {
		t.Fatal(err)
	}
	if session != "" {
		if err := os.WriteFile(filepath.Join(sessions, strconv.Itoa(pid)+".json"), []byte(session), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if transcript != nil {
		project := filepath.Join(home, ".claude", "projects", "-workspace")
		if err := os.MkdirAll(project, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(project, "s-1.jsonl"), []byte(*transcript), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return home
}

func session(pid int, status string) string {
	return fmt.Sprintf(`{"pid":%d,"sessionId":"s-1","cwd":"/workspace","startedAt":%d,"status":%q,"kind":"interactive"}`,
		pid, time.Now().UnixMilli(), status)
}

func ptr(s string) *string { return &s }

// TestRun: the probe of a live process reads its session file and tells
// subagent history from its transcript.
func TestRun(t *testing.T) {
	pid := os.Getpid()
	for _, tc := range []struct {
		name       string
		transcript *string
		want       *bool
	}{
		{"no transcript yet", nil, new(bool)},
		{"plain transcript", ptr(`{"type":"assistant","message":{"stop_reason":"end_turn"}}` + "\n"), new(bool)},
		{"sidechain", ptr(`{"type":"user","isSidechain":true}` + "\n"), ptr2(true)},
		{"task tool", ptr(`{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Task","input":{}}]}}` + "\n"), ptr2(true)},
		{"tool definitions only", ptr(`{"type":"system","tools":[{"name":"Agent"}]}` + "\n"), new(bool)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Run(pid, fakeHome(t, pid, session(pid, "idle"), tc.transcript))
			if p.StartTicks == 0 || p.StartUnixMs == 0 || p.Session == nil || p.Session.Status != "idle" {
				t.Fatalf("probe %+v", p)
			}
			if (p.Subagents == nil) != (tc.want == nil) || (p.Subagents != nil && *p.Subagents != *tc.want) {
				t.Fatalf("subagents %v, want %v", p.Subagents, tc.want)
			}
			// The process's own start, as the broker matches it.
			id := agent.Identity{PID: pid, Start: p.StartTicks}
			if got := agent.ClaudeActivity(p, id, "/workspace"); (got == agent.Idle) != (*tc.want == false) {
				t.Fatalf("activity %s", got)
			}
		})
	}
}

func ptr2(b bool) *bool { return &b }

// TestRunRefusesWhatIsNotAFile: a symlinked or FIFO session file, or a
// transcript that is a symlink, is not read (and a FIFO does not hang the
// probe).
func TestRunRefusesWhatIsNotAFile(t *testing.T) {
	pid := os.Getpid()
	name := strconv.Itoa(pid) + ".json"

	home := fakeHome(t, pid, "", nil)
	target := filepath.Join(t.TempDir(), "elsewhere.json")
	os.WriteFile(target, []byte(session(pid, "idle")), 0o600)
	if err := os.Symlink(target, filepath.Join(home, ".claude", "sessions", name)); err != nil {
		t.Fatal(err)
	}
	if p := Run(pid, home); p.Session != nil {
		t.Fatalf("read through a symlink: %+v", p.Session)
	}

	home = fakeHome(t, pid, "", nil)
	if err := syscall.Mkfifo(filepath.Join(home, ".claude", "sessions", name), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan agent.Probe, 1)
	go func() { done <- Run(pid, home) }()
	select {
	case p := <-done:
		if p.Session != nil {
			t.Fatalf("read a FIFO: %+v", p.Session)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the probe hangs on a FIFO")
	}

	home = fakeHome(t, pid, session(pid, "idle"), nil)
	project := filepath.Join(home, ".claude", "projects", "-workspace")
	os.MkdirAll(project, 0o700)
	if err := os.Symlink("/etc/passwd", filepath.Join(project, "s-1.jsonl")); err != nil {
		t.Fatal(err)
	}
	if p := Run(pid, home); p.Session == nil || p.Subagents != nil {
		t.Fatalf("a symlinked transcript: %+v", p)
	}
}

// TestRunGoneProcess: a pid with no process reads as gone.
func TestRunGoneProcess(t *testing.T) {
	if p := Run(1<<22+1, t.TempDir()); p.StartTicks != 0 || p.Session != nil {
		t.Fatalf("probe of no process: %+v", p)
	}
}

// TestHasSubagentEntry: a sidechain entry or a call of Task/Agent is
// subagent work; the tool's definition, or its name in text, is not; the
// bounds hold at their value and fail one past it.
func TestHasSubagentEntry(t *testing.T) {
	const (
		defs     = `{"type":"system","tools":[{"name":"Agent","description":"Launch a new agent"},{"name":"Task"}]}`
		text     = `{"type":"assistant","message":{"content":[{"type":"text","text":"\"name\":\"Agent\" and \"tool_use\""}]}}`
		bash     = `{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t1","name":"Bash","input":{}}]}}`
		agentUse = `{"type":"assistant","message":{"content":[{"type":"text","text":"x"},{"type":"tool_use","id":"t2","name":"Agent","input":{}}]}}`
		taskUse  = `{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t3","name":"Task","input":{}}]}}`
		side     = `{"type":"user","isSidechain":true,"message":{"content":"sub"}}`
		partial  = `{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Agent"`
	)
	for _, tc := range []struct {
		name  string
		lines []string
		want  bool
	}{
		{"definitions and text only", []string{defs, text, bash}, false},
		{"an Agent call", []string{defs, bash, agentUse}, true},
		{"a Task call", []string{taskUse}, true},
		{"a sidechain entry", []string{defs, side}, true},
		{"a line being written", []string{defs, partial}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := strings.Join(tc.lines, "\n") + "\n"
			got, err := hasSubagentEntry(strings.NewReader(in), int64(len(in)), 1<<20)
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	plain := strings.Repeat(bash+"\n", 10)
	if _, err := hasSubagentEntry(strings.NewReader(plain), int64(len(plain)), 1<<20); err != nil {
		t.Fatalf("at the size limit: %v", err)
	}
	if _, err := hasSubagentEntry(strings.NewReader(plain), int64(len(plain))-1, 1<<20); err == nil {
		t.Fatal("one byte past the size limit was read")
	}
	if _, err := hasSubagentEntry(strings.NewReader(bash+"\n"), 1<<20, len(bash)+1); err != nil {
		t.Fatalf("a line at the line limit: %v", err)
	}
	if _, err := hasSubagentEntry(strings.NewReader(bash+"\n"), 1<<20, len(bash)-1); err == nil {
		t.Fatal("a line past the line limit was read")
	}
}

// TestHelperOutputParses: what the command prints is what the broker
// parses.
func TestHelperOutputParses(t *testing.T) {
	p := Run(os.Getpid(), fakeHome(t, os.Getpid(), session(os.Getpid(), "busy"), nil))
	out, _ := json.Marshal(p)
	got, err := agent.ParseProbe(out)
	if err != nil || got.Session == nil || got.Session.Status != "busy" || !strings.Contains(string(out), `"start_ticks"`) {
		t.Fatalf("parsed %+v, %v from %s", got, err, out)
	}
}
