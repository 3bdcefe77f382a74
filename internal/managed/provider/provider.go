// Package provider starts a coding provider with exactly the environment
// its lease allows, in host-process mode: the provider runs as a child of
// branchbox on the same host (the in-container mode, through docker exec,
// comes with the launch).
//
// A provider starts only when the requested executable and the ordered
// inherited names exactly match one live model-identity lease
// (assignment.AuthorizeProvider). Its process starts from an empty
// environment and receives only: PATH set to SafePATH, the signed inherited
// names copied from the caller's environment, and the provider-environment
// values of that lease's exact consumer, each read from its value file
// immediately before the start, its digest recomputed from the bytes used.
//
// The executable is opened, immediately before the start, one component at
// a time without following a symbolic link (package secfs); the file and
// every directory above it must be owned by root or the runtime's uid and
// not writable by anyone else, and the very inode checked is executed
// (through /proc/self/fd), so no one but root or the runtime can swap the
// program between the check and the start.
package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/leasecheck"
	"agentbox/internal/secfs"
)

// SafePATH is the fixed PATH a provider starts with, and the only PATH a
// bare executable name is looked up in (never the caller's PATH).
const SafePATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// lookupDirs are the directories a bare executable name is looked up in:
// SafePATH's, unless a test replaced them.
var lookupDirs = strings.Split(SafePATH, ":")

// SetLookupDirsForTest replaces the directories a bare executable name is
// looked up in (the child's PATH stays SafePATH) and returns a restore
// function.
func SetLookupDirsForTest(dirs []string) (restore func()) {
	old := lookupDirs
	lookupDirs = dirs
	return func() { lookupDirs = old }
}

// Request is one provider start.
type Request struct {
	// Executable is the provider entrypoint, exactly as the lease names it.
	Executable string
	// Inherit are the environment names to copy from the caller, in the
	// lease's exact order.
	Inherit []string
	// Args are the provider's arguments (after argv[0]).
	Args []string
}

// Plan is an authorized provider start whose values are not read yet.
type Plan struct {
	checked *leasecheck.Checked
	grant   *assignment.ProviderGrant
	path    string // the resolved executable
	args    []string
	// elsewhere: the provider runs in the container (AuthorizeElsewhere),
	// never on this host.
	elsewhere bool
}

// Authorize checks the request against the checked assignment's leases at
// now and resolves the executable (a bare name in SafePATH, or the signed
// absolute path).
func Authorize(c *leasecheck.Checked, req Request, now time.Time) (*Plan, error) {
	g, err := c.Assignment.AuthorizeProvider(req.Executable, req.Inherit, now)
	if err != nil {
		return nil, err
	}
	p, err := resolve(g.Executable)
	if err != nil {
		return nil, err
	}
	return &Plan{checked: c, grant: g, path: p, args: append([]string(nil), req.Args...)}, nil
}

// AuthorizeElsewhere checks the request as Authorize does, for a provider
// that runs somewhere else (in the launched container): the executable is
// not looked up on this host, and the plan's Path is the signed name.
func AuthorizeElsewhere(c *leasecheck.Checked, req Request, now time.Time) (*Plan, error) {
	g, err := c.Assignment.AuthorizeProvider(req.Executable, req.Inherit, now)
	if err != nil {
		return nil, err
	}
	return &Plan{checked: c, grant: g, path: g.Executable, args: append([]string(nil), req.Args...), elsewhere: true}, nil
}

// Args are the provider's arguments (after argv[0]).
func (p *Plan) Args() []string { return p.args }

// Grant returns what the plan was authorized for.
func (p *Plan) Grant() *assignment.ProviderGrant { return p.grant }

// Path is the resolved executable.
func (p *Plan) Path() string { return p.path }

// Environment builds the provider's exact environment from the caller's:
// PATH=SafePATH, each inherited name with the caller's value (a name the
// caller has not set is refused), then each provider-environment value read
// and digest-checked now.
func (p *Plan) Environment(caller []string) ([]string, error) {
	env := make([]string, 0, 1+len(p.grant.Inherited)+len(p.grant.Values))
	env = append(env, "PATH="+SafePATH)
	for _, name := range p.grant.Inherited {
		v, ok := Getenv(caller, name)
		if !ok {
			return nil, assignment.Errorf("inherit-env", "%s is not set in the caller's environment", name)
		}
		env = append(env, name+"="+v)
	}
	for _, b := range p.grant.Values {
		data, err := p.checked.ReadValue(b)
		if err != nil {
			return nil, err
		}
		env = append(env, b.Name+"="+string(data))
		clear(data)
	}
	return env, nil
}

// childExecutable is the name the child executes: descriptor 3, the
// handle of the executable that was checked (Command's ExtraFiles[0]).
const childExecutable = "/proc/self/fd/3"

// Command opens and checks the executable again (OpenExecutable), reads
// the values and returns the provider command, ready to start: call it
// immediately before Start. The command executes exactly the inode that
// was checked: its handle is ExtraFiles[0], descriptor 3 of the child,
// which runs /proc/self/fd/3 with argv[0] the signed executable. The
// caller closes cmd.ExtraFiles[0] once the command started (or will not
// start).
func (p *Plan) Command(ctx context.Context, caller []string) (*exec.Cmd, error) {
	if p.elsewhere {
		return nil, assignment.Errorf("provider", "the plan is for a provider in the container, not on this host")
	}
	exe, err := OpenExecutable(p.path)
	if err != nil {
		return nil, err
	}
	env, err := p.Environment(caller)
	if err != nil {
		exe.Close()
		return nil, err
	}
	cmd := exec.CommandContext(ctx, childExecutable, p.args...)
	cmd.Args[0] = p.grant.Executable
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{exe}
	return cmd, nil
}

// ErrStart reports a provider that could not be started.
var ErrStart = errors.New("provider could not be started")

// Run starts the provider with the given standard streams, forwards
// SIGINT, SIGTERM, SIGHUP and SIGQUIT to it, and waits. It returns the
// provider's exit status (-1 when a signal ended it).
func (p *Plan) Run(ctx context.Context, caller []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	cmd, err := p.Command(ctx, caller)
	if err != nil {
		return 0, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	err = cmd.Start()
	cmd.ExtraFiles[0].Close() // the child holds its own copy
	if err != nil {
		return 0, errors.Join(ErrStart, secfs.WithoutPath(err))
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return 0, errors.Join(ErrStart, secfs.WithoutPath(err))
	}
	return 0, nil
}

// resolve finds the executable and checks it (OpenExecutable): the signed
// absolute path, or a bare name in SafePATH (lookup).
func resolve(exe string) (string, error) {
	if strings.HasPrefix(exe, "/") {
		f, err := OpenExecutable(exe)
		if err != nil {
			return "", err
		}
		f.Close()
		return exe, nil
	}
	return lookup(exe)
}

// lookup finds a bare name in SafePATH's directories, never the caller's
// PATH, for a provider on this host: the first executable regular file
// wins, as for a shell. A directory that is missing or has a symbolic link
// on its path (/bin -> usr/bin on a merged-/usr system: its target comes
// earlier in SafePATH) is not searched. What is found must pass
// OpenExecutable's rules, else it is refused (never skipped for a later
// directory); a symbolic link found there is refused, not followed.
func lookup(name string) (string, error) {
	for _, dir := range lookupDirs {
		d, reason, err := openTrustedDir(dir)
		if err != nil {
			continue
		}
		f, st, err := secfs.OpenChild(d, name, unix.O_PATH)
		d.Close()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if errors.Is(err, secfs.ErrSymlink) {
			return "", assignment.Errorf("provider", "the executable found in the fixed PATH is a symbolic link, and none is followed: install the program itself there (versions 2 and 3 can sign its real absolute path)")
		}
		if err != nil {
			return "", assignment.Errorf("provider", "the executable found in the fixed PATH %s", describe(err))
		}
		f.Close()
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
			continue
		}
		if reason != "" {
			return "", assignment.Errorf("provider", "the executable found in the fixed PATH: %s", reason)
		}
		if r := fileReason(&st); r != "" {
			return "", assignment.Errorf("provider", "the executable found in the fixed PATH %s", r)
		}
		return path.Join(dir, name), nil
	}
	return "", assignment.Errorf("provider", "the executable is not in the fixed PATH %s", SafePATH)
}

// OpenExecutable opens the provider executable at the absolute, clean path
// p as an O_PATH handle, one component at a time from "/" without
// following a symbolic link anywhere (package secfs), and checks on the
// handles, never on the path string: p is a regular file with an execute
// bit, and p and every directory above it are owned by root or the
// runtime's (effective) uid and are not group- or other-writable (a
// directory may be, with the sticky bit, like /tmp). So no uid but root's
// and the runtime's can replace the program or anything on its path; a
// start through the handle (Command) runs exactly what was checked.
// Refusals name the rule, never the path.
func OpenExecutable(p string) (*os.File, error) {
	if !secfs.IsAbsClean(p) || p == "/" {
		return nil, assignment.Errorf("provider", "the executable must be an absolute, clean path")
	}
	d, reason, err := openTrustedDir(path.Dir(p))
	if err != nil {
		return nil, assignment.Errorf("provider", "the executable's directory %s", describe(err))
	}
	f, st, err := secfs.OpenChild(d, path.Base(p), unix.O_PATH)
	d.Close()
	if err != nil {
		if reason != "" {
			return nil, assignment.Errorf("provider", "the executable: %s", reason)
		}
		return nil, assignment.Errorf("provider", "the executable %s", describe(err))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
		f.Close()
		return nil, assignment.Errorf("provider", "the executable's path does not name an executable regular file")
	}
	if reason != "" {
		f.Close()
		return nil, assignment.Errorf("provider", "the executable: %s", reason)
	}
	if r := fileReason(&st); r != "" {
		f.Close()
		return nil, assignment.Errorf("provider", "the executable %s", r)
	}
	return f, nil
}

// openTrustedDir opens the absolute, clean directory dir without following
// a symbolic link and returns, besides its handle, why another uid could
// replace what is below it ("" when none could): the first directory from
// "/" down to dir that breaks dirReason, named by how many levels above
// the executable it is.
func openTrustedDir(dir string) (*os.File, string, error) {
	depth := strings.Count(dir, "/")
	if dir == "/" {
		depth = 0
	}
	var reason string
	d, _, err := secfs.OpenDirNoFollow(dir, func(i int, st *unix.Stat_t) error {
		if reason == "" {
			if r := dirReason(st); r != "" {
				levels := depth - i + 1
				reason = fmt.Sprintf("the directory %d level(s) above it %s", levels, r)
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return d, reason, nil
}

// trusted reports whether uid may own the executable or a directory above
// it: root, or the uid the runtime runs as (which could replace its own
// files anyway).
func trusted(uid uint32) bool { return uid == 0 || uid == uint32(os.Geteuid()) }

// dirReason is leasecheck.AncestorReason's rule with the runtime's uid
// for the assignment owner's: owned by root or the runtime, and not group-
// or other-writable unless sticky.
func dirReason(st *unix.Stat_t) string {
	if !trusted(st.Uid) {
		return fmt.Sprintf("is owned by uid %d, neither root nor the runtime's uid %d", st.Uid, os.Geteuid())
	}
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return fmt.Sprintf("is group- or other-writable without the sticky bit (mode %04o)", st.Mode&0o7777)
	}
	return ""
}

// fileReason: the executable itself is owned by root or the runtime and is
// not group- or other-writable.
func fileReason(st *unix.Stat_t) string {
	if !trusted(st.Uid) {
		return fmt.Sprintf("is owned by uid %d, neither root nor the runtime's uid %d", st.Uid, os.Geteuid())
	}
	if st.Mode&0o022 != 0 {
		return fmt.Sprintf("is group- or other-writable (mode %04o)", st.Mode&0o7777)
	}
	return ""
}

// describe is leasecheck.Describe, with what to do about a symlink.
func describe(err error) string {
	d := leasecheck.Describe(err)
	if errors.Is(err, secfs.ErrSymlink) {
		d += ": sign the real file's path"
	}
	return d
}

// LookPath finds a bare command name in the fixed PATH only, never the
// caller's: the first executable regular file. It is for the tools
// branchbox itself runs (the docker and devcontainer CLIs); a provider is
// found by lookup, which adds OpenExecutable's rules.
func LookPath(name string) (string, bool) {
	for _, dir := range lookupDirs {
		if c := path.Join(dir, name); executable(c) {
			return c, true
		}
	}
	return "", false
}

func executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Getenv returns the first value of name in env, a list of "NAME=value"
// entries (getenv semantics).
func Getenv(env []string, name string) (string, bool) {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}
