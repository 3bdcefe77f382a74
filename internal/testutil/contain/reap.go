package contain

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The re-executing process is a child subreaper: a sandbox the tests
// start is a unit of its own session that outlives the process that
// started it, and init would adopt one the tests left behind (a test
// binary that panics at its -timeout runs no cleanup). Adopted here
// instead, such processes are killed once the test binary has ended.

// leftoverRounds bounds the kill rounds: a killed sandbox's processes
// come to this process in turn (its pid namespace's init, then nothing:
// that init's death ends the namespace).
const leftoverRounds = 50

// runReaping starts cmd, reaps every process adopted meanwhile (as init
// would: a test may wait for a process to be gone), and returns cmd's exit
// status once it ends, after killing what it left.
func runReaping(cmd *exec.Cmd) (int, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return 0, fmt.Errorf("child subreaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	code := -1
	for code < 0 {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("wait: %w", err)
		}
		if pid == cmd.Process.Pid {
			code = exitCode(ws)
		}
	}
	if killed := killLeftovers(); len(killed) > 0 {
		fmt.Fprintf(os.Stderr, "contain: the tests left %d processes running; killed: %s\n", len(killed), strings.Join(killed, ", "))
	}
	return code, nil
}

func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// killLeftovers kills this process's children until none is left, and
// reaps them; it returns "pid comm" of each it killed.
func killLeftovers() []string {
	var killed []string
	for range leftoverRounds {
		kids := children(os.Getpid())
		if len(kids) == 0 {
			break
		}
		for pid, comm := range kids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed = append(killed, strconv.Itoa(pid)+" "+comm)
			}
		}
		reapFor(100 * time.Millisecond)
	}
	return killed
}

// reapFor reaps children until none is left or d has passed.
func reapFor(d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.ECHILD {
			return
		}
		if pid <= 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// children maps the pids whose parent is ppid to their command names,
// from /proc/PID/stat.
func children(ppid int) map[int]string {
	out := map[int]string{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(string(b[end+1:]))
		if len(f) < 2 {
			continue
		}
		if parent, err := strconv.Atoi(f[1]); err != nil || parent != ppid {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b[:open])))
		if err == nil {
			out[pid] = string(b[open+1 : end])
		}
	}
	return out
}
