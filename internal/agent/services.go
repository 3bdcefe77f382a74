package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// Services (the repository config's services) run beside the agents, in
// the same tmux session, each in a window named after it. Service names
// never equal an agent's (config.Parse) and windows are always targeted
// by exact name (=NAME), so no name is read as a window index or a prefix
// of another. A service's window stays when its command ends
// (remain-on-exit), so its exit code can be read.

// ServiceLogDir is where, under the agent user's home, each service's
// output is kept (NAME.log, its current run), beside its command (NAME.sh).
const ServiceLogDir = ".jailbee/services"

// MaxServiceLog bounds one run's kept output (the pane's stream).
const MaxServiceLog = 8 << 20

// serviceScript (re)starts service $1 with command $2: its command goes to
// a file (as a tmux argument, text ending in ';' would split the tmux
// command), its old window goes, and the new one's output is kept, bounded,
// in its log. Every tmux command in one call: remain-on-exit is set before
// the server can see the command end, and the pipe is in place before the
// server reads the pane's first output.
const serviceScript = `set -eu
n=$1 d="$HOME/` + ServiceLogDir + `"
mkdir -p "$d"
printf '%s\n' "$2" > "$d/$n.sh"
: > "$d/$n.log"
t="` + Session + `:=$n"
tmux kill-window -t "$t" 2>/dev/null || true
if tmux has-session -t "=` + Session + `" 2>/dev/null; then
	set -- new-window -d -t "` + Session + `:" -n "$n"
else
	set -- new-session -d -s "` + Session + `" -n "$n" -x 200 -y 50
fi
exec tmux "$@" -- sh "$d/$n.sh" \; set-option -w -t "$t" remain-on-exit on \; pipe-pane -t "$t" "$LOGGER > '$d/$n.log'"
`

// serviceLogger writes a pane's output to its log (MaxServiceLog bytes
// at most) as it comes. The tmux server runs it with the server's
// environment, so the bound is in its text. head -c alone keeps its
// output in stdio's buffer until it ends, and with remain-on-exit the pipe
// stays open: a service's last few KiB (all of a short one's) never
// reached its log. stdbuf (coreutils, beside head) makes head's output
// unbuffered. (Not dd: without iflag=fullblock it counts reads, not
// bytes; with it, it buffers too.)
var serviceLogger = fmt.Sprintf(`if command -v stdbuf >/dev/null; then exec stdbuf -o0 head -c %[1]d; else exec head -c %[1]d; fi`, MaxServiceLog)

// StartServiceArgv (re)starts service name with command in the sandbox's
// tmux session (a new session when there is none).
func StartServiceArgv(name, command string) []string {
	return []string{"env", "LOGGER=" + serviceLogger, "sh", "-c", serviceScript, "sh", name, command}
}

// ListServicesArgv prints one line per window of the session: its name,
// whether its pane is dead, its exit status and its pid, tab-separated.
// It fails when there is no session.
func ListServicesArgv() []string {
	return []string{"tmux", "list-panes", "-s", "-t", "=" + Session, "-F", "#{window_name}\t#{pane_dead}\t#{pane_dead_status}\t#{pane_pid}"}
}

// MaxServicesOutput bounds what ListServicesArgv may print.
const MaxServicesOutput = 64 << 10

// Service states (ps).
const (
	ServiceRunning    = "running"
	ServiceExited     = "exited"
	ServiceNotStarted = "not started"
)

// ServiceState is one service as its window shows it.
type ServiceState struct {
	State string
	Code  int // exited: its exit status, -1 for a signal
	PID   int // running: its pane's pid in the sandbox
}

// ParseServices reads what ListServicesArgv printed (sandbox-controlled):
// the state of each window whose name is one of names. Lines that do not
// parse, and windows of other names, are ignored; a name with more than
// one window counts as not started (the sandbox made it up).
func ParseServices(out []byte, names []string) map[string]ServiceState {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	got := map[string]ServiceState{}
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 4 || !want[f[0]] {
			continue
		}
		st, ok := parseServiceLine(f[1], f[2], f[3])
		if !ok {
			continue
		}
		seen[f[0]]++
		got[f[0]] = st
	}
	for n, k := range seen {
		if k > 1 {
			delete(got, n)
		}
	}
	return got
}

// parseServiceLine reads a window's pane_dead, pane_dead_status and
// pane_pid.
func parseServiceLine(dead, status, pid string) (ServiceState, bool) {
	switch dead {
	case "0":
		p, err := ParsePID([]byte(pid))
		return ServiceState{State: ServiceRunning, PID: p}, err == nil
	case "1":
		if status == "" {
			return ServiceState{State: ServiceExited, Code: -1}, true // by a signal
		}
		code, err := strconv.Atoi(status)
		return ServiceState{State: ServiceExited, Code: code}, err == nil && code >= 0 && code <= 255
	}
	return ServiceState{}, false
}
