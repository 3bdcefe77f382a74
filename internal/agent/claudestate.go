package agent

import (
	"encoding/json"
	"errors"
	"strconv"
)

// The Claude adapter: what the broker learns of a Claude agent's activity
// from the CLI's session status file (~/.claude/sessions/<pid>.json) and
// its transcript, read inside the sandbox by `jailbee _agent-probe` (a
// bounded, no-follow read by the agent user) and judged here. Everything
// the probe prints is the sandbox's word: it can only misreport its own
// agent, and whatever cannot be matched to the prompted process counts as
// unknown, never as idle.

// Activity is what an agent is doing, as far as its adapter can tell.
type Activity string

const (
	Busy    Activity = "busy"    // a model call or a tool runs
	Idle    Activity = "idle"    // its turn is over, no subagent history
	Waiting Activity = "waiting" // it needs input (a question, a permission)
	Unknown Activity = "unknown" // no signal that can be trusted
)

// Counts reports whether a stretch of this activity counts towards an
// idle report: waiting for input, or idle with no subagent history.
func (a Activity) Counts() bool { return a == Idle || a == Waiting }

// MaxProbeOutput bounds what a probe may print.
const MaxProbeOutput = 16 << 10

// Probe is what `jailbee _agent-probe PID` printed.
type Probe struct {
	// StartTicks is the process's start time (/proc/PID/stat field 22,
	// clock ticks after boot); StartUnixMs the same time as Unix
	// milliseconds (boot time plus ticks). Zero: the process is gone.
	StartTicks  uint64 `json:"start_ticks"`
	StartUnixMs int64  `json:"start_unix_ms"`
	// Session is the status file of the process, nil when there is none
	// (or it could not be read as one).
	Session *ClaudeSession `json:"session"`
	// Subagents: whether the session's transcript shows subagent work;
	// nil when it could not be told (too large, unreadable).
	Subagents *bool `json:"subagents"`
}

// ClaudeSession is the CLI's session status file, the fields the adapter uses.
type ClaudeSession struct {
	PID        int    `json:"pid"`
	SessionID  string `json:"sessionId"`
	Cwd        string `json:"cwd"`
	StartedAt  int64  `json:"startedAt"` // Unix ms
	Status     string `json:"status"`
	WaitingFor string `json:"waitingFor,omitempty"`
}

// ProbeArgv reads the Claude session state of process pid inside the
// sandbox (the jailbee client's hidden command).
func ProbeArgv(pid int) []string {
	return []string{"jailbee", "_agent-probe", "--pid", strconv.Itoa(pid)}
}

// ParseProbe reads a probe's output (sandbox-controlled).
func ParseProbe(out []byte) (Probe, error) {
	var p Probe
	if len(out) > MaxProbeOutput {
		return Probe{}, errors.New("probe output too long")
	}
	if err := json.Unmarshal(out, &p); err != nil {
		return Probe{}, errors.New("probe output is not a probe")
	}
	return p, nil
}

// startSlackMs is how much earlier than the process a session may say it
// started (the two clocks round differently); more is a file left by an
// earlier process with the same pid.
const startSlackMs = 1000

// ClaudeActivity judges a probe of the agent id whose session runs in
// cwd: the status file must be the prompted process's own (its pid, a
// start no earlier than the process's, the checkout as its cwd) or the
// activity is unknown; idle after any subagent history is unknown too
// (an old transcript is no evidence that the work is over).
func ClaudeActivity(p Probe, id Identity, cwd string) Activity {
	s := p.Session
	switch {
	case p.StartTicks == 0 || p.StartTicks != id.Start:
		return Unknown // gone, or the pid was recycled
	case s == nil || s.PID != id.PID || s.Cwd != cwd:
		return Unknown // no file, or a foreign one
	case s.StartedAt < p.StartUnixMs-startSlackMs:
		return Unknown // stale: written before this process started
	}
	switch s.Status {
	case "busy":
		return Busy
	case "waiting":
		return Waiting
	case "idle":
		if p.Subagents != nil && !*p.Subagents {
			return Idle
		}
	}
	return Unknown
}
