package unit

import (
	"fmt"
	"math"
	"net"
	"os"
	"os/signal"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/backend"
	"agentbox/internal/egress"
	"agentbox/internal/threads"
)

// ControlFD is the descriptor the supervisor inherits its control
// listener on (the launcher's first extra file).
const ControlFD = 3

// reapInterval is how often the supervisor reaps children even without a
// SIGCHLD (signals coalesce; orphans of the sandbox reparent to it).
const reapInterval = time.Second

// notFoundStatus and cannotRunStatus are the shell's statuses for a
// command that does not exist or cannot be executed.
const (
	notFoundStatus  = 127
	cannotRunStatus = 126
)

// The supervisor's threads. It lives in its sandbox's task (pids) cgroup,
// and Go aborts when clone fails to make a thread the scheduler needs: a
// sandbox at its task limit (a fork loop, a parallel build) would kill its
// own pid 1, and with it every process it has. So the supervisor makes its
// threads before the sandbox has any process (threads.Reserve) and bounds
// what it needs: supervisorProcs Ps running Go code, and at most
// startSlots commands being started, the one place it blocks in a syscall
// (a path lookup, the fork, a reason written to the caller's stderr, which
// the caller may not read).
const (
	supervisorProcs   = 2
	startSlots        = 4
	supervisorThreads = 10
)

// UnitTasks bounds the tasks the unit itself holds in its sandbox's pids
// cgroup as it starts: bubblewrap's monitor, and the supervisor's threads
// (those it makes at start and those Go made before: 16 in all on the
// test machines). The backend adds it to the sandbox's limit until the
// supervisor answers, then sets the limit to the sandbox's on top of the
// tasks the unit holds then, so that the limit is what the sandbox's own
// processes and threads may use.
const UnitTasks = 1 + supervisorThreads + 8

// InitMain is `jailbee _sandbox-init`: the sandbox's pid 1. It returns only
// on a setup failure.
func InitMain() int {
	// Nothing but the control listener may stay open: a descriptor of the
	// launcher or bubblewrap could reach host paths.
	if err := unix.CloseRange(ControlFD+1, math.MaxUint32, 0); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init: close descriptors: %v\n", err)
		return 1
	}
	// Not dumpable: no process of the sandbox (same uid) may ptrace the
	// supervisor or open its descriptors through /proc.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init: prctl: %v\n", err)
		return 1
	}
	// Go would turn these signals into an exit, so a sandbox process could
	// end its own sandbox by accident: catch and drop them. Caught, not
	// ignored: an ignored signal stays ignored in every command started.
	// The kernel hands pid 1 every signal it has a handler for, and Go
	// crashes on a fault signal (SIGSEGV, SIGABRT, ...) another process
	// sends: those are caught too. Notify takes only sent ones: a real
	// fault of the supervisor still crashes it.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGPIPE,
		syscall.SIGILL, syscall.SIGTRAP, syscall.SIGABRT, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV,
		syscall.SIGSTKFLT, syscall.SIGSYS)
	go func() {
		for range sigs {
		}
	}()
	f := os.NewFile(ControlFD, "control")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init: control listener: %v\n", err)
		return 1
	}
	threads.Reserve(supervisorProcs, supervisorThreads)
	s := &supervisor{waiters: map[int]chan syscall.WaitStatus{}, starting: make(chan struct{}, startSlots)}
	go s.reap()
	go relayEgress()
	for {
		conn, err := ln.Accept()
		if err != nil {
			// Only the broker connects; a transient error (EMFILE) must
			// not end the sandbox.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go s.serve(conn.(*net.UnixConn))
	}
}

// relayEgress serves the sandbox's egress relay on loopback for as long
// as the unit lives: the network namespace has nothing but lo, so this is
// its only way out (docs/egress.md). Taken first, by pid 1, the port
// cannot be taken by a process of the sandbox.
func relayEgress() {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", backend.EgressPort))
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init: egress relay: %v\n", err)
		return
	}
	egress.Relay(ln, path.Join(backend.ModelMountPath, backend.EgressSocketName))
}

// supervisor runs commands and reaps every process of the sandbox.
type supervisor struct {
	mu       sync.Mutex
	waiters  map[int]chan syscall.WaitStatus // commands of live connections, by pid
	starting chan struct{}                   // a slot per command being started
}

// reap collects every child that ended (commands, and orphans reparented
// to pid 1) and hands a command's status to its connection.
func (s *supervisor) reap() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	tick := time.NewTicker(reapInterval)
	for {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			s.mu.Lock()
			if ch, ok := s.waiters[pid]; ok {
				ch <- ws
				delete(s.waiters, pid)
			}
			s.mu.Unlock()
		}
		select {
		case <-sigs:
		case <-tick.C:
		}
	}
}

func (s *supervisor) serve(conn *net.UnixConn) {
	defer conn.Close()
	req, files, err := readRequest(conn)
	defer closeAll(files)
	if err != nil {
		return
	}
	switch req.Op {
	case "ping":
		writeReply(conn, Reply{OK: true})
	case "exec":
		if len(files) != maxFDs {
			return
		}
		s.exec(conn, req, files)
	}
}

// exec starts one command and reports its pid and its exit status; the
// connection closing first kills the command's process group.
func (s *supervisor) exec(conn *net.UnixConn, req Request, files []*os.File) {
	s.starting <- struct{}{}
	status, ch, relay, started := s.start(req, files)
	<-s.starting
	closeAll(files)
	if !started {
		writeReply(conn, Reply{Exit: &status})
		return
	}
	pid := status
	if err := writeReply(conn, Reply{PID: &pid}); err != nil {
		endGroup(pid, ch)
		relay.close(false)
		return
	}
	gone := make(chan struct{})
	go func() {
		// The broker sends nothing more: any read result means it left.
		var b [1]byte
		conn.Read(b[:])
		close(gone)
	}()
	var ws syscall.WaitStatus
	select {
	case ws = <-ch:
	case <-gone:
		// The broker cancelled: it waits (bounded) for the word that
		// nothing of the command runs any more.
		endGroup(pid, ch)
		relay.close(false)
		killed := 128 + int(syscall.SIGKILL)
		writeReply(conn, Reply{Exit: &killed})
		return
	}
	relay.close(true)
	code := ws.ExitStatus()
	if ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	writeReply(conn, Reply{Exit: &code})
}

// endGroup kills the command's process group and returns once the group
// is empty: its leader reaped, and every other member gone too (this
// process is pid 1, so the reaper reaps them as they die). A member stuck
// in the kernel must not hold the supervisor for ever: after
// groupEndTimeout it stops looking.
func endGroup(pid int, ch chan syscall.WaitStatus) {
	syscall.Kill(-pid, syscall.SIGKILL)
	<-ch
	for deadline := time.Now().Add(groupEndTimeout); time.Now().Before(deadline); {
		// SIGKILL again, not 0: a member forked as the first one was
		// sent is killed too.
		if syscall.Kill(-pid, syscall.SIGKILL) != nil {
			return
		}
		time.Sleep(groupEndPoll)
	}
}

// groupEndTimeout bounds endGroup's wait; groupEndPoll is how often it
// looks.
const (
	groupEndTimeout = 5 * time.Second
	groupEndPoll    = 5 * time.Millisecond
)

// start forks the command in a session of its own. It returns the pid,
// the channel the reaper sends its status on (registered under the same
// lock as the fork, so the reaper cannot miss it), the relay of a TTY
// exec (nil otherwise) and true, or a shell-style status (the reason
// written to the command's stderr) and false. The caller keeps the
// channel: the reaper forgets it once it has sent, which a quick
// command's end can do before start's caller runs on.
func (s *supervisor) start(req Request, files []*os.File) (int, chan syscall.WaitStatus, *ttyRelay, bool) {
	stderr := files[2]
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		fmt.Fprintln(stderr, "jailbee: empty command")
		return cannotRunStatus, nil, nil, false
	}
	prog, err := lookPath(req.Argv[0], envPath(req.Env))
	if err != nil {
		fmt.Fprintf(stderr, "jailbee: %s: command not found\n", shown(req.Argv[0]))
		return notFoundStatus, nil, nil, false
	}
	dir := req.Dir
	if dir == "" {
		dir = "/"
	}
	stdio := []uintptr{files[0].Fd(), files[1].Fd(), files[2].Fd()}
	var relay *ttyRelay
	if req.TTY {
		// The command gets a terminal of the sandbox's own (ptyrelay.go).
		r, slave, err := openTTYRelay(files[0])
		if err != nil {
			fmt.Fprintf(stderr, "jailbee: %v\n", err)
			return cannotRunStatus, nil, nil, false
		}
		defer slave.Close()
		relay = r
		stdio = []uintptr{slave.Fd(), slave.Fd(), slave.Fd()}
	}
	attr := &syscall.ProcAttr{
		Dir:   dir,
		Env:   req.Env,
		Files: stdio,
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: req.TTY, Ctty: 0},
	}
	ch := make(chan syscall.WaitStatus, 1)
	s.mu.Lock()
	pid, err := syscall.ForkExec(prog, req.Argv, attr)
	if err == nil {
		s.waiters[pid] = ch
	}
	s.mu.Unlock()
	if err != nil {
		if relay != nil {
			relay.close(false)
		}
		fmt.Fprintf(stderr, "jailbee: %s: %v\n", shown(req.Argv[0]), err)
		if err == syscall.ENOENT {
			return notFoundStatus, nil, nil, false
		}
		return cannotRunStatus, nil, nil, false
	}
	if relay != nil {
		relay.run()
	}
	return pid, ch, relay, true
}

// envPath is the PATH of the command's environment.
func envPath(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			return v
		}
	}
	return "/usr/bin:/bin"
}

// lookPath finds prog as a shell would, in the command's own PATH.
func lookPath(prog, pathList string) (string, error) {
	if strings.Contains(prog, "/") {
		return prog, executable(prog)
	}
	for _, d := range strings.Split(pathList, ":") {
		if d == "" {
			d = "."
		}
		p := path.Join(d, prog)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return os.ErrPermission
	}
	return nil
}

// shown bounds a command name in a message.
func shown(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
