package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"agentbox/internal/config"
	"agentbox/internal/grant"
	"agentbox/internal/testutil/wait"
)

func repo(t *testing.T, yaml string) *config.Repo {
	t.Helper()
	c, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const repoYAML = `
agents:
  claude:
    command: "claude --dangerously-skip-permissions"
    prompt_args: ["-p", "{prompt}"]
  scripted:
    command: "sh .jailbee/agent.sh"
    prompt_args: ["{prompt}"]
  mute:
    command: "sh idle.sh"
default_agent: scripted
`

func TestResolve(t *testing.T) {
	r := repo(t, repoYAML)
	claude := &grant.Runner{Agent: "claude", Model: "sonnet"}
	for _, tc := range []struct {
		name     string
		explicit *grant.Runner
		def      *grant.Runner
		repo     *config.Repo
		want     string // agent name, or the error text
		wantErr  bool
	}{
		{"explicit runner", claude, nil, r, "claude", false},
		{"the grant's default runner", nil, claude, r, "claude", false},
		{"explicit beats the grant", &grant.Runner{Agent: "claude"}, &grant.Runner{Agent: "claude-jb"}, r, "claude", false},
		{"the repository's default agent", nil, nil, r, "scripted", false},
		{"no agent at all", nil, nil, repo(t, ""), ErrNoAgent.Error(), true},
		{"default agent not defined", nil, nil, &config.Repo{DefaultAgent: "ghost"}, "agent `ghost` is not enabled in this repo", true},
		{"default agent without prompt_args", nil, nil, repo(t, strings.Replace(repoYAML, "default_agent: scripted", "default_agent: mute", 1)), "agent `mute` has no prompt_args, so it cannot take a prompt", true},
		{"a runner the repo cannot run is refused, never replaced", &grant.Runner{Agent: "claude-jb"}, nil, r, "claude-jb needs LiteLLM enabled in this repo", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := grant.Default()
			g.DefaultRunner = tc.def
			s, err := Resolve(tc.explicit, g, tc.repo)
			if tc.wantErr {
				if err == nil || err.Error() != tc.want {
					t.Fatalf("err = %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil || s.Name != tc.want {
				t.Fatalf("Resolve = %+v, %v; want agent %s", s, err, tc.want)
			}
		})
	}
}

// TestResolveClaudeJBWithoutEntry: a claude-jb runner with no entry of
// its own runs agents.claude's command with claude-jb as its first word,
// whichever of the two that command starts with.
func TestResolveClaudeJBWithoutEntry(t *testing.T) {
	for command, want := range map[string]string{
		"claude --x":    "claude-jb --x",
		"  claude\t--x": "claude-jb\t--x",
		"claude-jb --x": "claude-jb --x",
		"claude-jb":     "claude-jb",
		"claude":        "claude-jb",
	} {
		t.Run(command, func(t *testing.T) {
			r := repo(t, fmt.Sprintf("litellm: {enabled: true}\nagents:\n  claude:\n    command: %q\n    prompt_args: [\"{prompt}\"]\n", command))
			s, err := Resolve(&grant.Runner{Agent: grant.AgentClaudeJB}, grant.Default(), r)
			if err != nil || s.Command != want {
				t.Fatalf("Resolve = %q, %v; want %q", s.Command, err, want)
			}
		})
	}
}

func TestArgv(t *testing.T) {
	s := Spec{Name: "scripted", Command: "sh agent.sh --x", PromptArgs: []string{"-p", "{prompt}", "tail {prompt}"}, Model: "sonnet[1m]"}
	prompt := `fix "it"; $(rm -rf /) {prompt}`
	got := s.Argv(prompt)
	want := []string{"sh", "-c", `exec sh agent.sh --x "$@"`, "scripted", "--model", "sonnet[1m]", "-p", prompt, "tail " + prompt}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Argv = %q\nwant %q", got, want)
	}
	// Claude: under env with the model socket's variables, and in bypass
	// mode unless the command picks a permission mode.
	s = Spec{Name: "claude", Command: "claude --x", PromptArgs: []string{"{prompt}"}}
	got = s.Argv(prompt)
	want = []string{"env",
		"ANTHROPIC_API_KEY=" + PlaceholderKey, "ANTHROPIC_BASE_URL=http://localhost", "ANTHROPIC_UNIX_SOCKET=" + ModelSocketPath,
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL=1",
		"DISABLE_AUTOUPDATER=1", "DISABLE_ERROR_REPORTING=1", "DISABLE_TELEMETRY=1",
		"sh", "-c", `exec claude --x --dangerously-skip-permissions "$@"`, "claude", prompt}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Argv = %q\nwant %q", got, want)
	}
	for _, cmd := range []string{"claude --dangerously-skip-permissions", "claude --permission-mode acceptEdits"} {
		s.Command = cmd
		if got := s.Argv(prompt)[len(want)-3]; got != "exec "+cmd+` "$@"` {
			t.Errorf("%s: runs %q", cmd, got)
		}
	}
	// claude-jb: the claude CLI on the profile's socket, the tier's route
	// as its model.
	jb := Spec{Name: "claude", Command: "claude-jb --x", PromptArgs: []string{"{prompt}"}, Model: "sonnet", Route: "xai/grok-4",
		Runner: &grant.Runner{Agent: grant.AgentClaudeJB, Profile: "grok", Model: "sonnet"}}
	got = jb.Argv(prompt)
	if got[3] != "ANTHROPIC_UNIX_SOCKET="+ModelSocketDir+"/litellm-grok.sock" || got[len(got)-5] != `exec claude --x --dangerously-skip-permissions "$@"` ||
		!reflect.DeepEqual(got[len(got)-3:], []string{"--model", "xai/grok-4", prompt}) {
		t.Fatalf("claude-jb Argv = %q", got)
	}
	// The tmux part uses the Claude spec (named claude).
	// The tmux part: the window named after the agent, the pane's pid
	// printed, then "--" and the agent's own argv.
	for _, tc := range []struct {
		newSession bool
		want       string
	}{
		{true, "tmux new-session -d -P -F #{pane_pid} -s " + Session + " -n claude -x 200 -y 50 --"},
		{false, "tmux new-window -d -P -F #{pane_pid} -t " + Session + ": -n claude --"},
	} {
		a := StartArgv(s, "p", tc.newSession)
		n := len(a) - len(s.Argv("p"))
		if got := strings.Join(a[:n], " "); got != tc.want || !reflect.DeepEqual(a[n:], s.Argv("p")) {
			t.Fatalf("StartArgv(%v) = %q", tc.newSession, a)
		}
	}
}

func TestParsePID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"42\n", 42}, {"7", 7}, {"42\n43\n", 42},
		{"", 0}, {"1", 0}, {"0", 0}, {"-5", 0}, {"4194304", 4194304}, {"4194305", 0}, {"x", 0},
	} {
		got, err := ParsePID([]byte(tc.in))
		if (tc.want == 0) != (err != nil) || got != tc.want {
			t.Errorf("ParsePID(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestParseStat(t *testing.T) {
	line := "42 (sh) x) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 100 18446744073709551615"
	id, alive, err := ParseStat(42, []byte(line))
	if err != nil || !alive || id != (Identity{PID: 42, Start: 98765}) {
		t.Fatalf("ParseStat = %+v %v %v", id, alive, err)
	}
	if _, alive, _ := ParseStat(42, []byte(strings.Replace(line, ") S ", ") Z ", 1))); alive {
		t.Fatal("a zombie counts as alive")
	}
	for _, bad := range []string{"", "42 sh S 1", "42 (sh) S 1 2", "42 (sh) SS 1 42 42 0 -1 4 1 0 0 0 1 2 0 0 20 0 1 0 5 1 1"} {
		if _, _, err := ParseStat(42, []byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) accepted", bad)
		}
	}
}

// TestWithStatInAShell: the wrapper run by a real sh, for a command that
// prints a live pid, one that prints junk, and one that fails.
func TestWithStatInAShell(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	run := func(argv ...string) (string, int) {
		out, err := exec.Command(WithStat(argv)[0], WithStat(argv)[1:]...).Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	out, code := run("echo", self)
	pid, id, alive, seen, err := ParsePane([]byte(out))
	if code != 0 || err != nil || pid != os.Getpid() || !seen || !alive || id.PID != pid || id.Start == 0 {
		t.Fatalf("a live pid: %q exit %d -> %d %+v %v %v %v", out, code, pid, id, alive, seen, err)
	}
	out, code = run("printf", "%s\n%s\n", self, "99")
	if pid, _, _, seen, err := ParsePane([]byte(out)); code != 0 || err != nil || pid != os.Getpid() || !seen {
		t.Fatalf("two pids (two panes): %q exit %d -> %d %v %v", out, code, pid, seen, err)
	}
	out, code = run("echo", "4194304")
	if pid, _, _, seen, err := ParsePane([]byte(out)); code != 0 || err != nil || pid != 4194304 || seen {
		t.Fatalf("a pid with no process: %q exit %d -> %d %v %v", out, code, pid, seen, err)
	}
	out, code = run("echo", "junk")
	if _, _, _, _, err := ParsePane([]byte(out)); code != 0 || err == nil {
		t.Fatalf("junk: %q exit %d -> %v", out, code, err)
	}
	if out, code = run("sh", "-c", "echo 42; exit 3"); code != 3 {
		t.Fatalf("a failing command: %q exit %d, want 3", out, code)
	}
}

// FuzzParse: what a sandbox prints for its agent's pid and stat never
// panics the parsers or yields an impossible pid.
func FuzzParse(f *testing.F) {
	f.Add([]byte("42\n"))
	f.Add([]byte("42 (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 1 1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if pid, err := ParsePID(data); err == nil && (pid <= 1 || pid > maxPID) {
			t.Fatalf("pid %d", pid)
		}
		ParseStat(2, data)
		if pid, id, _, seen, err := ParsePane(data); err == nil && (pid <= 1 || pid > maxPID || seen && id.PID != pid) {
			t.Fatalf("pane %d %+v", pid, id)
		}
	})
}

// TestParsePanes: one pane per NUL-led section (what comes before the
// first is no pane's), its window name and lines cleaned (control and
// format characters, such as a right-to-left override, dropped), blank lines at
// the end dropped, at most MaxPaneLines lines (the last).
func TestParsePanes(t *testing.T) {
	long := strings.Repeat("l\n", MaxPaneLines+3) + "last\n"
	out := "stray\n\x00o\u202ene\x1b\nfi\u2066rst\u200b\x07 \n\n\nsecond\n\n\x00two\n" + long
	panes := ParsePanes([]byte(out))
	if len(panes) != 2 || panes[0].Window != "one" || panes[1].Window != "two" {
		t.Fatalf("panes %+v", panes)
	}
	if got := panes[0].Lines; !slices.Equal(got, []string{"first", "", "", "second"}) {
		t.Errorf("lines %q", got)
	}
	if got := panes[1].Lines; len(got) != MaxPaneLines || got[len(got)-1] != "last" {
		t.Errorf("a long pane kept %d lines ending %q, want %d ending last", len(got), got[len(got)-1], MaxPaneLines)
	}
}

// TestTmuxArgsReachTheCommandWhole: arguments given through tmux's
// command line (a real tmux server on a socket of the test's own) reach
// the command unchanged, whatever they end in: without TmuxArgs one
// ending in ';' loses it and what follows runs as tmux commands.
func TestTmuxArgsReachTheCommandWhole(t *testing.T) {
	home, run := tmuxHome(t)
	out := filepath.Join(home, "out")
	args := []string{"fix it;", ";", `a\;`, `b\\;`, "; c", "semi;colon", "display-message -p x;", "\\", "end"}
	script := `printf '%s\n' "$@" > "` + out + `.tmp" && mv "` + out + `.tmp" "` + out + `"`
	run(append([]string{"tmux", "-f", "/dev/null", "new-session", "-d", "--", "sh", "-c", script, "sh"}, TmuxArgs(args)...))
	var got []byte
	wait.For(t, "the command to write its arguments", func() bool {
		var err error
		got, err = os.ReadFile(out)
		return err == nil
	})
	if want := strings.Join(args, "\n") + "\n"; string(got) != want {
		t.Fatalf("the command got\n%q\nwant\n%q", got, want)
	}
}
