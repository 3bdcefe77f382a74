// Package agent knows a child's agent: which one a spawn starts (the
// runner resolution), the command that starts it in the sandbox's tmux
// session, and how its identity (pid and start time inside the sandbox)
// is read back. It is pure: the broker runs the commands it builds inside
// the sandbox and hands the output back.
package agent

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"agentbox/internal/config"
	"agentbox/internal/grant"
)

// Session is the tmux session of a sandbox's agents; each agent is a
// window named after it.
const Session = "jailbee"

// PromptPlaceholder in an agent's prompt_args expands to the prompt text.
const PromptPlaceholder = "{prompt}"

// Spec is the agent a spawn starts.
type Spec struct {
	Name       string   // the agents.<name> entry: the tmux window's name
	Command    string   // run with sh -c inside the sandbox
	PromptArgs []string // appended as arguments, {prompt} expanded
	// Model is the runner's model tier ("" for the agent's own default),
	// passed as --model to a claude command.
	Model string
	// Route is, for a claude-jb runner with a profile and a model, the
	// LiteLLM route the profile gives that tier: passed as --model in its
	// place.
	Route string
	// Runner is the runner that chose it (nil: the repository's default
	// agent).
	Runner *grant.Runner
}

// ErrNoAgent: neither the spawn, the grant nor the repository names an
// agent to start.
var ErrNoAgent = errors.New("no agent to start: name a runner (--agent), or set default_agent in the repository's .jailbee/config.yaml")

// Resolve picks a spawn's agent: the explicit runner, else the effective
// grant's default runner, else the repository's default agent. A runner
// the repository cannot run is refused with the reason (CheckRunner),
// never replaced by another.
func Resolve(explicit *grant.Runner, effective grant.Grant, repo *config.Repo) (Spec, error) {
	r := explicit
	if r == nil {
		r = effective.DefaultRunner
	}
	if r != nil {
		if err := repo.CheckRunner(*r); err != nil {
			return Spec{}, err
		}
		name := r.Agent
		a, ok := repo.Agents[name]
		if !ok && r.Agent == grant.AgentClaudeJB {
			// claude-jb without an entry of its own runs agents.claude's
			// command, its first word made claude-jb (CheckRunner: it is
			// claude or claude-jb already).
			name = grant.AgentClaude
			a = repo.Agents[name]
			if cmd := strings.TrimSpace(a.Command); !strings.HasPrefix(cmd, grant.AgentClaudeJB) {
				a.Command = grant.AgentClaudeJB + strings.TrimPrefix(cmd, grant.AgentClaude)
			}
		}
		s := Spec{Name: name, Command: a.Command, PromptArgs: a.PromptArgs, Model: r.Model, Runner: r}
		if r.Agent == grant.AgentClaudeJB && r.Profile != "" && r.Model != "" {
			s.Route = repo.LiteLLM.Profiles[r.Profile].Tiers[grant.BaseTier(r.Model)]
		}
		return s, nil
	}
	name := repo.DefaultAgent
	if name == "" {
		return Spec{}, ErrNoAgent
	}
	a, ok := repo.Agents[name]
	if !ok || !a.IsEnabled() {
		return Spec{}, fmt.Errorf("agent `%s` is not enabled in this repo", name)
	}
	if len(a.PromptArgs) == 0 {
		return Spec{}, fmt.Errorf("agent `%s` has no prompt_args, so it cannot take a prompt", name)
	}
	return Spec{Name: name, Command: a.Command, PromptArgs: a.PromptArgs}, nil
}

// Argv is the agent's command line for a prompt: `sh -c 'exec COMMAND
// "$@"'` with the prompt arguments, so the prompt is an argument, never
// shell text, and the agent replaces the shell (its pid is the pane's).
// A Claude agent runs under `env` with its model socket's variables (env
// execs too, so the pid stays the pane's).
func (s Spec) Argv(prompt string) []string {
	args := make([]string, 0, len(s.PromptArgs)+2)
	switch {
	case s.Route != "":
		args = append(args, "--model", s.Route)
	case s.Model != "":
		args = append(args, "--model", s.Model)
	}
	for _, a := range s.PromptArgs {
		args = append(args, strings.ReplaceAll(a, PromptPlaceholder, prompt))
	}
	argv := append([]string{"sh", "-c", "exec " + s.command() + ` "$@"`, s.Name}, args...)
	if env := s.env(); len(env) > 0 {
		argv = append(append([]string{"env"}, env...), argv...)
	}
	return argv
}

// StartArgv starts the agent in a detached tmux session's window named
// after it (a new session when there is none yet, else a new window).
func StartArgv(s Spec, prompt string, newSession bool) []string {
	cmd := TmuxArgs(s.Argv(prompt))
	// -P -F: tmux prints the new pane's pid (what PaneArgv prints), which
	// spares the first observation a command.
	if newSession {
		return append([]string{"tmux", "new-session", "-d", "-P", "-F", "#{pane_pid}", "-s", Session, "-n", s.Name, "-x", "200", "-y", "50", "--"}, cmd...)
	}
	return append([]string{"tmux", "new-window", "-d", "-P", "-F", "#{pane_pid}", "-t", Session + ":", "-n", s.Name, "--"}, cmd...)
}

// TmuxArgs escapes args for tmux's command line, which reads an argument
// ending in ';' as the end of a command even after "--": the rest would
// run as tmux commands and the ';' would be lost. tmux turns "\;" at an
// argument's end into ";", so inserting one backslash before a final ';'
// passes every argument through unchanged ("a\;" becomes "a\\;", which
// tmux reads back as "a\;").
func TmuxArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.HasSuffix(a, ";") {
			a = a[:len(a)-1] + `\;`
		}
		out[i] = a
	}
	return out
}

// HasSessionArgv succeeds when the agents' tmux session exists.
func HasSessionArgv() []string {
	return []string{"tmux", "has-session", "-t", Session}
}

// WindowTarget is the tmux target of the session's window named window,
// by exact name: never read as a window index ("1") or as the prefix of
// another window's name (an agent's, a service's).
func WindowTarget(window string) string { return Session + ":=" + window }

// KillWindowArgv ends the window named window and what runs in it.
func KillWindowArgv(window string) []string {
	return []string{"tmux", "kill-window", "-t", WindowTarget(window)}
}

// PaneArgv prints the pid of the agent's pane process, or fails when the
// window is gone.
func PaneArgv(window string) []string {
	return []string{"tmux", "list-panes", "-t", WindowTarget(window), "-F", "#{pane_pid}"}
}

// Identity is an agent process inside its sandbox: its pid there and its
// start time (clock ticks after boot). A pid alone may be reused.
type Identity struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// IdentityArgv prints the stat line of process pid, or fails when it is
// gone.
func IdentityArgv(pid int) []string {
	return []string{"cat", "/proc/" + strconv.Itoa(pid) + "/stat"}
}

// maxPID bounds a pid read from a sandbox (the kernel's limit is 2^22).
const maxPID = 1 << 22

// ParsePID reads the pid PaneArgv printed (sandbox-controlled).
func ParsePID(out []byte) (int, error) {
	s := strings.TrimSpace(string(out))
	if first, _, ok := strings.Cut(s, "\n"); ok {
		s = first
	}
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 1 || pid > maxPID {
		return 0, fmt.Errorf("not a pid: %.20q", s)
	}
	return pid, nil
}

// WithStat wraps argv, a command that prints a pid first (StartArgv,
// PaneArgv), so that the stat line of that process follows the pid: the
// first sight of an agent, or a look at it, in one command instead of two
// (on Incus each costs 70-80 ms). The command's own failure is the
// wrapper's; a stat that cannot be read leaves it out (ParsePane).
func WithStat(argv []string) []string {
	const script = `out=$("$@") || exit; p=${out%%[!0-9]*}; printf '%s\n' "$p"; cat "/proc/$p/stat" 2>/dev/null; exit 0`
	return append([]string{"sh", "-c", script, "sh"}, argv...)
}

// MaxPaneOutput bounds what a WithStat command may print (a pid line and
// a stat line; the stat's command name is at most 16 bytes).
const MaxPaneOutput = 4096

// ParsePane reads what a WithStat command printed (sandbox-controlled):
// the pid, and, when its stat line came too (seen), the process's
// identity and whether it is alive.
func ParsePane(out []byte) (pid int, id Identity, alive, seen bool, err error) {
	first, rest, _ := bytes.Cut(out, []byte("\n"))
	if pid, err = ParsePID(first); err != nil {
		return 0, Identity{}, false, false, err
	}
	if id, alive, err := ParseStat(pid, rest); err == nil {
		return pid, id, alive, true, nil
	}
	return pid, Identity{}, false, false, nil
}

// ParseStat reads the identity from a /proc/<pid>/stat line
// (sandbox-controlled): fields counted after the command name's last ')'.
// A zombie or an exiting process is not alive.
func ParseStat(pid int, stat []byte) (Identity, bool, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return Identity{}, false, errors.New("malformed stat")
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return Identity{}, false, errors.New("malformed stat")
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return Identity{}, false, errors.New("malformed stat")
	}
	state := f[0][0]
	return Identity{PID: pid, Start: start}, state != 'Z' && state != 'X', nil
}

// CaptureArgv prints the visible text of the agent's pane.
func CaptureArgv(window string) []string {
	return []string{"tmux", "capture-pane", "-p", "-J", "-t", WindowTarget(window)}
}

// CaptureAllArgv prints every window of the agents' session: for each, a
// NUL, the window's name and a newline, then its pane's history and
// visible text. It fails when there is no session.
func CaptureAllArgv() []string {
	const script = `w=$(tmux list-windows -t "$1" -F '#{window_id} #{window_name}') || exit
printf '%s\n' "$w" | while read -r id name; do printf '\0%s\n' "$name"; tmux capture-pane -p -J -S - -t "$id"; done`
	return []string{"sh", "-c", script, "sh", Session}
}

// Bounds of a CaptureAllArgv command's output: what it may print, and
// the lines kept of a pane (the last). tmux keeps 2000 lines of history
// per pane by default.
const (
	MaxCaptureOutput = 8 << 20
	MaxPaneLines     = 10000
)

// Pane is one window's captured pane, safe to print (PaneLines).
type Pane struct {
	Window string
	Lines  []string
}

// ParsePanes reads what a CaptureAllArgv command printed
// (sandbox-controlled).
func ParsePanes(out []byte) []Pane {
	var panes []Pane
	sections := bytes.Split(out, []byte{0})
	for _, sec := range sections[1:] {
		name, text, _ := bytes.Cut(sec, []byte("\n"))
		lines := PaneLines(text)
		if len(lines) > MaxPaneLines {
			lines = lines[len(lines)-MaxPaneLines:]
		}
		panes = append(panes, Pane{Window: cleanText(name), Lines: lines})
	}
	return panes
}

// Bounds of a pane tail in an idle report.
const (
	PaneTailLines = 20
	PaneTailBytes = 2048
)

// cleanText is sandbox-controlled text made safe to print: valid UTF-8,
// no control characters but newlines and tabs, and no format characters
// (a right-to-left override or an isolate reorders what the terminal
// shows after it: a forged line, a name that reads as another).
func cleanText(b []byte) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || (r >= 0x20 && r != 0x7f && !(r >= 0x80 && r < 0xa0) && !unicode.Is(unicode.Cf, r)) {
			return r
		}
		return -1
	}, strings.ToValidUTF8(string(b), "\uFFFD"))
}

// PaneLines are the lines of a captured pane (sandbox-controlled), clean
// (cleanText), without trailing blanks or blank lines at the end.
func PaneLines(out []byte) []string {
	lines := strings.Split(cleanText(out), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t")
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// PaneTail is the last non-empty lines of a captured pane
// (sandbox-controlled): clean (PaneLines), at most PaneTailLines lines and
// PaneTailBytes bytes (the end kept).
func PaneTail(out []byte) string {
	var lines []string
	for _, l := range PaneLines(out) {
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > PaneTailLines {
		lines = lines[len(lines)-PaneTailLines:]
	}
	tail := strings.Join(lines, "\n")
	if len(tail) > PaneTailBytes {
		tail = strings.ToValidUTF8(tail[len(tail)-PaneTailBytes:], "")
	}
	return tail
}
