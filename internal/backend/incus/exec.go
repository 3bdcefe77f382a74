package incus

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"agentbox/internal/backend"

	"golang.org/x/sys/unix"
)

// Exec implements backend.Backend through `incus exec`, which passes the
// command's exit status through. The command runs as the agent user (or
// root, or a numeric uid), in the checkout unless Dir says otherwise, with
// a fixed base environment plus opts.Env: nothing of the broker's own.
// Its argv, environment and directory go in a spec on the client's stdin
// (spec.go), never on a command line.
func (b *Backend) Exec(ctx context.Context, name string, opts backend.ExecOptions) (int, error) {
	if len(opts.Argv) == 0 {
		return 0, errors.New("exec: empty command")
	}
	// A terminal's command cannot tell incus's own refusal from its own
	// output: look first. Otherwise only at a container not seen running.
	if managed, running := b.lastSeen(name); opts.TTY || !managed || !running {
		if err := b.checkRunning(ctx, name); err != nil {
			return 0, err
		}
	}
	uid, err := execUID(opts.User)
	if err != nil {
		return 0, err
	}
	env, err := commandEnv(uid, opts.Env)
	if err != nil {
		return 0, err
	}
	// The marker names this command's processes for a cancel: the incus
	// client going away does not end them. It is no secret: it is the one
	// value on the command line.
	marker := execMarker + "=" + rand.Text()
	spec, err := execSpec{Argv: opts.Argv, Env: append(env, marker), Dir: backend.WorkDir(opts.Dir)}.encode()
	if err != nil {
		return 0, err
	}
	if err := b.checkClient(ctx, name); err != nil {
		return 0, err
	}
	user := []string{"--user", strconv.Itoa(uid), "--group", strconv.Itoa(uid), "--cwd", "/"}
	if opts.TTY {
		// A terminal: its stdin is the terminal, so the spec goes in
		// first, to a private file the command's own uid reads and
		// removes. incus ends with the command.
		out, err := b.runInside(ctx, spec, append(append([]string{"exec", name}, user...),
			"--force-noninteractive", "--", ClientPath, StashCommand)...)
		if err != nil {
			return 0, fmt.Errorf("exec in %s: pass the command in: %w", name, err)
		}
		file := strings.TrimSpace(string(out))
		if !stashedName(file) {
			return 0, fmt.Errorf("exec in %s: the command was not passed in", name)
		}
		args := b.inProject(append(append([]string{"exec", name}, user...),
			"--env", marker, "--force-interactive", "--", ClientPath, RunCommand, file)...)
		code, err := b.runExec(ctx, name, uid, marker, args, nil, opts)
		if err != nil {
			// The command may never have come to read its spec.
			rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
			defer cancel()
			b.runInside(rmCtx, nil, append(append([]string{"exec", name}, user...), "--force-noninteractive", "--", "rm", "-f", file)...)
		}
		return code, err
	}
	args := b.inProject(append(append([]string{"exec", name}, user...),
		"--env", marker, "--force-noninteractive", "--", ClientPath, FrameCommand)...)
	return b.runExec(ctx, name, uid, marker, args, spec, opts)
}

// checkRunning returns ErrNotFound or ErrNotRunning for a container that
// is not this backend's or does not run.
func (b *Backend) checkRunning(ctx context.Context, name string) error {
	in, err := b.instance(ctx, name)
	if err != nil {
		return err
	}
	if !in.Running {
		return fmt.Errorf("%w: %s", backend.ErrNotRunning, name)
	}
	return nil
}

// runExec runs the incus client for one Exec. A framed command (spec not
// nil) has its spec, then its stdin, go through a pipe this side owns, and
// its stdout through deframe (see frame.go).
func (b *Backend) runExec(ctx context.Context, name string, uid int, marker string, args []string, spec []byte, opts backend.ExecOptions) (int, error) {
	framed := spec != nil
	cmd := exec.Command(b.opts.Incus, args...)
	cmd.Env = incusEnv()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opts.Stdin, opts.Stdout, opts.Stderr
	var f *framing
	if framed {
		var err error
		if f, err = newFraming(spec, opts); err != nil {
			return 0, err
		}
		defer f.close()
		cmd.Stdin, cmd.Stdout = f.clientIn, f.clientOut
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("exec in %s: %w", name, err)
	}
	if f != nil {
		f.start()
	}
	if opts.Started != nil {
		opts.Started()
	}
	done, killed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(killed)
		select {
		case <-ctx.Done():
			// The incus client going away does not end the command in the
			// container: end it there, then the client.
			b.killExec(context.WithoutCancel(ctx), name, uid, marker)
			cmd.Process.Kill()
		case <-done:
		}
	}()
	err := cmd.Wait()
	close(done)
	// The client ends as soon as the kill reaches the command's first
	// process; a cancelled Exec returns only once the kill's passes are
	// over, so nothing of the command runs on after it.
	<-killed
	status, framedOK := 0, false
	if f != nil {
		status, framedOK = f.wait()
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if framedOK {
		return status, nil
	}
	if framed {
		// The command never ran to its end under the framer: the container
		// may have gone or stopped since it was last seen.
		if err := b.checkRunning(ctx, name); err != nil {
			return 0, err
		}
	}
	return clientResult(name, framed, err)
}

// clientResult is an Exec's result from its client's end (err from its
// Wait): the status incus passed through. A framed command's status is
// never that of a client that ended well, as its framer ends well after
// it sent the status: without the status, that is no success.
func clientResult(name string, framed bool, err error) (int, error) {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", name, err)
	}
	if framed {
		return 0, fmt.Errorf("exec in %s: %w", name, errStatusLost)
	}
	return 0, nil
}

// errStatusLost: a framed command's client ended without passing on the
// command's status.
var errStatusLost = errors.New("the command's status was lost on its way out")

// framing is one framed Exec's plumbing: the client's stdin and stdout
// are pipes this side owns; the caller's streams are read and written
// through copies of our own, as the caller may close its *os.File
// streams once Started has run.
type framing struct {
	clientIn, stdinW   *os.File // the client's stdin pipe
	stdoutR, clientOut *os.File // the client's stdout pipe
	spec               []byte   // written ahead of stdin
	stdinSrc           io.Reader
	stdout             io.Writer
	closeOnce          sync.Once
	status             int
	ok                 bool
	deframed           chan struct{}
}

func newFraming(spec []byte, opts backend.ExecOptions) (*framing, error) {
	f := &framing{spec: spec, deframed: make(chan struct{})}
	var err error
	if f.clientIn, f.stdinW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if f.stdoutR, f.clientOut, err = os.Pipe(); err != nil {
		f.close()
		return nil, err
	}
	if f.stdinSrc, err = ownReader(opts.Stdin); err != nil {
		f.close()
		return nil, err
	}
	if f.stdout, err = ownWriter(opts.Stdout); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

// start runs the copies once the client holds its ends.
func (f *framing) start() {
	f.clientIn.Close()
	f.clientOut.Close()
	go func() {
		_, err := f.stdinW.Write(f.spec)
		if f.stdinSrc != nil {
			if err == nil {
				io.Copy(f.stdinW, f.stdinSrc)
			}
			closeIfFile(f.stdinSrc)
		}
		f.closeStdin()
	}()
	go func() {
		defer close(f.deframed)
		f.status, f.ok = deframe(f.stdoutR, f.stdout, func() { closeIfFile(f.stdout) })
		f.closeStdin() // the command has ended (or its stream broke): so may the client
		// Whatever follows is not the command's: drain it, so a client
		// that writes on is never stuck.
		io.Copy(io.Discard, f.stdoutR)
	}()
}

func (f *framing) closeStdin() { f.closeOnce.Do(func() { f.stdinW.Close() }) }

// wait returns the command's status once the client has ended.
func (f *framing) wait() (int, bool) {
	<-f.deframed
	return f.status, f.ok
}

func (f *framing) close() {
	for _, file := range []*os.File{f.clientIn, f.clientOut, f.stdoutR} {
		if file != nil {
			file.Close()
		}
	}
	if f.stdinW != nil {
		f.closeStdin()
	}
}

// ownReader returns a reader the caller's closing cannot end: a duplicate
// of an *os.File, the reader itself otherwise (nil: none).
func ownReader(r io.Reader) (io.Reader, error) {
	if file, ok := r.(*os.File); ok {
		return dupFile(file)
	}
	return r, nil
}

// ownWriter is ownReader for a writer (nil: discard).
func ownWriter(w io.Writer) (io.Writer, error) {
	if file, ok := w.(*os.File); ok {
		return dupFile(file)
	}
	if w == nil {
		return io.Discard, nil
	}
	return w, nil
}

func closeIfFile(v any) {
	if file, ok := v.(*os.File); ok {
		file.Close()
	}
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("exec: duplicate a stream: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// execMarker is the environment variable that marks one Exec's processes.
const execMarker = "JAILBEE_EXEC"

// killScript kills, inside the container, every process whose environment
// holds the entry $1 (grep -z: entries end in NUL). It runs as the
// command's uid, so it can end nothing but what that uid could end
// itself. One pass is not enough: a process forked after the pass listed
// /proc, by a parent killed (or exited) later in it, would live on, so
// passes repeat until one finds none of the command's processes. A killed
// process is found again until it has exited; one that never can (stuck
// in the kernel) must not keep the script spinning in the sandbox after
// the broker gave up on it, so the passes are bounded too.
const killScript = `n=0
while [ "$n" -lt 100 ]; do
	n=$((n + 1))
	found=
	for p in /proc/[0-9]*; do
		if grep -qzxF -- "$1" "$p/environ" 2>/dev/null; then
			kill -KILL "${p#/proc/}" 2>/dev/null
			found=1
		fi
	done
	[ -n "$found" ] || exit 0
done`

// killExec ends a cancelled command's processes in the container.
func (b *Backend) killExec(ctx context.Context, name string, uid int, marker string) {
	ctx, cancel := context.WithTimeout(ctx, killTimeout)
	defer cancel()
	args := []string{"exec", name, "--user", strconv.Itoa(uid), "--group", strconv.Itoa(uid), "--force-noninteractive",
		"--", "sh", "-c", killScript, "sh", marker}
	b.runInside(ctx, nil, args...)
}

// killTimeout bounds the kill of a cancelled command.
const killTimeout = 30 * time.Second

// execUID is the uid a command runs as: the agent's for "", 0 for root,
// or a numeric uid.
func execUID(user string) (int, error) {
	switch user {
	case "":
		return AgentUID, nil
	case "root":
		return 0, nil
	}
	uid, err := strconv.Atoi(user)
	if err != nil || uid < 0 || uid > 65535 {
		return 0, fmt.Errorf("%w: user %q", backend.ErrUnsupported, user)
	}
	return uid, nil
}

// commandEnv is a command's whole environment (incus adds nothing of
// the broker's).
func commandEnv(uid int, extra map[string]string) ([]string, error) {
	home, user := HomePath, AgentUser
	if uid == 0 {
		home, user = "/root", "root"
	}
	base := backend.ProxyEnv() // the only way out: the egress relay
	maps.Copy(base, map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": home,
		"USER": user,
		"LANG": "C.UTF-8",
	})
	return backend.CommandEnv(base, extra)
}
