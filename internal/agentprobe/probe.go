// Package agentprobe is the in-sandbox side of the Claude adapter: `jailbee
// _agent-probe --pid PID`, run by the broker as the agent user inside a
// sandbox, prints what agent.ParseProbe reads: the process's start time,
// its session status file and whether its transcript shows subagent work.
// Every read is bounded and refuses symlinks, FIFOs and devices
// (secfs.OpenRegularNoFollow): the files are the agent's, and the agent
// is not trusted. Nothing here runs on the host.
package agentprobe

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"agentbox/internal/agent"
	"agentbox/internal/secfs"
)

// Command is the hidden command's name.
const Command = "_agent-probe"

// Bounds of what the probe reads.
const (
	maxSessionBytes    = 64 << 10  // a status file is a few hundred bytes
	maxTranscriptBytes = 256 << 20 // past this, subagent history is unknown
	maxStatBytes       = 4 << 10
	maxProcStatBytes   = 1 << 20
)

// clockTicks is the kernel's USER_HZ: /proc times are in these units (100
// on every Linux architecture Go supports).
const clockTicks = 100

// IsHelperCommand reports whether arg names the probe.
func IsHelperCommand(arg string) bool { return arg == Command }

// HelperMain runs the probe with args (the command's name first).
func HelperMain(args []string) int {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	pid := fs.Int("pid", 0, "the agent's pid")
	if err := fs.Parse(args[1:]); err != nil || *pid <= 1 {
		fmt.Fprintln(os.Stderr, "usage: jailbee _agent-probe --pid PID")
		return 2
	}
	home, err := os.UserHomeDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	p := Run(*pid, home)
	out, _ := json.Marshal(p)
	os.Stdout.Write(append(out, '\n'))
	return 0
}

// Run probes process pid whose CLI keeps its state under home.
func Run(pid int, home string) agent.Probe {
	var p agent.Probe
	p.StartTicks = startTicks(pid)
	if p.StartTicks == 0 {
		return p
	}
	if boot := bootTime(); boot > 0 {
		p.StartUnixMs = boot*1000 + int64(p.StartTicks)*1000/clockTicks
	}
	data, err := secfs.ReadFileNoFollow(filepath.Join(home, ".claude", "sessions", strconv.Itoa(pid)+".json"), maxSessionBytes)
	if err != nil {
		return p
	}
	var s agent.ClaudeSession
	if json.Unmarshal(data, &s) != nil {
		return p
	}
	p.Session = &s
	p.Subagents = subagentHistory(home, s)
	return p
}

// startTicks reads field 22 of /proc/PID/stat; 0 when it cannot.
func startTicks(pid int) uint64 {
	data, err := secfs.ReadFileNoFollow("/proc/"+strconv.Itoa(pid)+"/stat", maxStatBytes)
	if err != nil {
		return 0
	}
	id, alive, err := agent.ParseStat(pid, data)
	if err != nil || !alive {
		return 0
	}
	return id.Start
}

// bootTime reads btime (Unix seconds) from /proc/stat; 0 when it cannot.
func bootTime() int64 {
	data, err := secfs.ReadFileNoFollow("/proc/stat", maxProcStatBytes)
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// sessionIDPattern is the shape of a session id: it becomes a file name.
var sessionIDPattern = regexp.MustCompile(`^[0-9A-Za-z-]{1,64}$`)

// maxTranscriptLine bounds one transcript entry the probe reads (an entry
// holds a whole tool result); a longer one makes the history unknown.
const maxTranscriptLine = 32 << 20

// subagentHistory tells whether the session's transcript shows subagent
// work; nil when it cannot be told.
func subagentHistory(home string, s agent.ClaudeSession) *bool {
	yes, no := true, false
	if !sessionIDPattern.MatchString(s.SessionID) || !filepath.IsAbs(s.Cwd) {
		return nil
	}
	project := filepath.Join(home, ".claude", "projects", strings.ReplaceAll(s.Cwd, "/", "-"))
	if fi, err := os.Lstat(filepath.Join(project, s.SessionID, "subagents")); err == nil && fi.IsDir() {
		return &yes
	}
	f, err := secfs.OpenRegularNoFollow(filepath.Join(project, s.SessionID+".jsonl"))
	if errors.Is(err, os.ErrNotExist) {
		return &no // no transcript yet: no history
	}
	if err != nil {
		return nil
	}
	defer f.Close()
	found, err := hasSubagentEntry(f, maxTranscriptBytes, maxTranscriptLine)
	if err != nil {
		return nil
	}
	return &found
}

// hasSubagentEntry reads a transcript (at most limit bytes, lines of at
// most maxLine, else an error) for an entry of subagent work: a sidechain
// entry, or a call of the tool that starts a subagent (Task, later named
// Agent). Tool definitions that name the tool are not calls; a line that
// is not JSON (one being written) is skipped.
func hasSubagentEntry(r io.Reader, limit int64, maxLine int) (bool, error) {
	lr := &io.LimitedReader{R: r, N: limit + 1}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, min(64<<10, maxLine)), maxLine) // the larger of the two bounds a line
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(`"isSidechain":true`)) && !bytes.Contains(line, []byte(`"tool_use"`)) {
			continue
		}
		var e struct {
			IsSidechain bool `json:"isSidechain"`
			Message     struct {
				Content json.RawMessage `json:"content"`
			} `json:"message"`
		}
		if json.Unmarshal(line, &e) != nil {
			continue
		}
		if e.IsSidechain {
			return true, nil
		}
		var blocks []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if json.Unmarshal(e.Message.Content, &blocks) != nil {
			continue
		}
		for _, b := range blocks {
			if b.Type == "tool_use" && (b.Name == "Task" || b.Name == "Agent") {
				return true, nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	if lr.N <= 0 {
		return false, errors.New("transcript too large")
	}
	return false, nil
}
