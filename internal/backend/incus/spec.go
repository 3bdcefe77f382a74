package incus

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A command's argv and environment (the agent's prompt, a caller's
// variables) must not be on the incus client's command line, nor on that
// of the `incusd forkexec` it makes: every host user reads those in
// /proc. So `incus exec` only ever runs the jailbee client inside with no
// argument of the caller's, and the command itself travels as a spec on
// the client's stdin:
//
//	len (4 bytes, big endian, 1..maxSpec) JSON {"argv": [...], "env": [...], "dir": "..."}
//
// A command without a terminal reads it ahead of its own stdin
// (FrameCommand). A terminal's stdin is the terminal, so its spec goes in
// first through a command of its own (StashCommand: stdin to a private
// file, whose name it prints), and the terminal's command (RunCommand)
// reads that file, removes it and becomes the command.

// StashCommand and RunCommand are the hidden commands of a terminal's
// Exec: `jailbee _exec-stash < SPEC` and `jailbee _exec-run FILE`.
const (
	StashCommand = "_exec-stash"
	RunCommand   = "_exec-run"
)

// maxSpec bounds a spec: Linux itself takes at most a few MiB of
// arguments and environment.
const maxSpec = 8 << 20

// stashDir holds stashed specs (private files, unguessable names).
const stashDir = "/tmp"

// stashPrefix starts the name of a stashed spec.
const stashPrefix = ".jailbee-exec-"

// execSpec is one command: its argv, its whole environment and its
// directory.
type execSpec struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// encode is the spec as it travels: its length, then its JSON.
func (s execSpec) encode() ([]byte, error) {
	data, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	if len(data) > maxSpec {
		return nil, fmt.Errorf("exec: the command and its environment exceed %d bytes", maxSpec)
	}
	out := make([]byte, 4, 4+len(data))
	binary.BigEndian.PutUint32(out, uint32(len(data)))
	return append(out, data...), nil
}

// readSpec reads one spec from r and not a byte more.
func readSpec(r io.Reader) (execSpec, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return execSpec{}, errors.New("no command spec on stdin")
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > maxSpec {
		return execSpec{}, errors.New("a command spec of a wrong size")
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return execSpec{}, errors.New("a command spec cut short")
	}
	var s execSpec
	if err := json.Unmarshal(data, &s); err != nil || len(s.Argv) == 0 || s.Argv[0] == "" || !filepath.IsAbs(s.Dir) {
		return execSpec{}, errors.New("a malformed command spec")
	}
	return s, nil
}

// lookPath finds the spec's program on the spec's own PATH.
func (s execSpec) lookPath() (string, error) {
	path := ""
	for _, kv := range s.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	os.Setenv("PATH", path)
	return exec.LookPath(s.Argv[0])
}

// command is the spec as an exec.Cmd.
func (s execSpec) command() (*exec.Cmd, error) {
	prog, err := s.lookPath()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(prog, s.Argv[1:]...)
	cmd.Args[0] = s.Argv[0]
	cmd.Env, cmd.Dir = s.Env, s.Dir
	return cmd, nil
}

// noNewPrivs makes what the calling goroutine starts or becomes unable to
// gain privileges: setuid and setgid bits and file capabilities are
// ignored, so a setuid-root file that root inside planted, or that
// another sandbox wrote to a named mount both see (their containers share
// one idmap), runs with the command's own uid. The flag is per thread:
// the goroutine stays locked to its thread, and must start or exec the
// command from it. Root's commands (the host's `exec --user root`) gain
// nothing from it and keep it off.
func noNewPrivs() error {
	if os.Getuid() == 0 {
		return nil
	}
	return setNoNewPrivs()
}

// setNoNewPrivs is noNewPrivs for any uid.
func setNoNewPrivs() error {
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}

// startError is what a command that could not start says on stderr: as
// on the local backend for a missing program.
func startError(s execSpec, err error) string {
	if errors.Is(err, exec.ErrNotFound) && len(s.Argv) > 0 {
		return fmt.Sprintf("jailbee: %s: command not found", s.Argv[0])
	}
	return fmt.Sprintf("jailbee: %v", err)
}

// IsHelperCommand reports whether a program's first argument names one of
// the in-container helpers HelperMain runs.
func IsHelperCommand(arg string) bool {
	return arg == FrameCommand || arg == StashCommand || arg == RunCommand || arg == EgressCommand
}

// HelperMain runs the helper args[0] names with its arguments and returns
// its exit status.
func HelperMain(args []string) int {
	switch args[0] {
	case FrameCommand:
		return frameMain(args[1:])
	case StashCommand:
		return stashMain(args[1:])
	case RunCommand:
		return runMain(args[1:])
	case EgressCommand:
		return egressMain(args[1:])
	}
	return 2
}

// stashMain is `jailbee _exec-stash < SPEC`: the spec goes to a new
// private file (0600, the caller's, a random name), whose path is printed.
func stashMain(args []string) int {
	spec, err := readSpec(os.Stdin)
	if len(args) != 0 || err != nil {
		fmt.Fprintln(os.Stderr, "usage: jailbee _exec-stash < SPEC")
		return 2
	}
	data, err := spec.encode()
	if err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _exec-stash: %v\n", err)
		return 1
	}
	f, err := os.CreateTemp(stashDir, stashPrefix+"*")
	if err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _exec-stash: %v\n", err)
		return 1
	}
	if _, err := f.Write(data); err != nil || f.Close() != nil {
		os.Remove(f.Name())
		fmt.Fprintln(os.Stderr, "jailbee _exec-stash: cannot write the spec")
		return 1
	}
	fmt.Println(f.Name())
	return 0
}

// runMain is `jailbee _exec-run FILE`: it reads a spec _exec-stash wrote
// for this uid, removes it and becomes the command.
func runMain(args []string) int {
	if len(args) != 1 || !stashedName(args[0]) {
		fmt.Fprintln(os.Stderr, "usage: jailbee _exec-run FILE")
		return 2
	}
	spec, err := readStashed(args[0])
	if err == nil {
		err = noNewPrivs()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _exec-run: %v\n", err)
		return 1
	}
	prog, err := spec.lookPath()
	if err == nil {
		if err = os.Chdir(spec.Dir); err == nil {
			err = syscall.Exec(prog, spec.Argv, spec.Env)
		}
	}
	fmt.Fprintln(os.Stderr, startError(spec, err))
	return 127
}

// stashedName reports whether p is a path _exec-stash makes.
func stashedName(p string) bool {
	dir, base := filepath.Split(p)
	return filepath.Clean(dir) == stashDir && strings.HasPrefix(base, stashPrefix) && !strings.ContainsAny(base, "/\x00")
}

// readStashed reads and removes a stashed spec: a regular file of this
// uid, not a link.
func readStashed(p string) (execSpec, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return execSpec{}, errors.New("no stashed spec")
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Getuid() {
		return execSpec{}, errors.New("not a stashed spec of this user")
	}
	os.Remove(p)
	return readSpec(io.LimitReader(f, 4+maxSpec))
}
