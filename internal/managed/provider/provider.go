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
package provider

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"strings"
	"syscall"
	"time"

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
	return &Plan{checked: c, grant: g, path: g.Executable, args: append([]string(nil), req.Args...)}, nil
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

// Command reads the values and returns the provider command, ready to
// start: call it immediately before Start.
func (p *Plan) Command(ctx context.Context, caller []string) (*exec.Cmd, error) {
	env, err := p.Environment(caller)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, p.path, p.args...)
	cmd.Args[0] = p.grant.Executable
	cmd.Env = env
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
	if err := cmd.Start(); err != nil {
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

// resolve finds the executable: an absolute path as signed, or a bare name
// in SafePATH; it must be a regular file with an execute bit.
func resolve(exe string) (string, error) {
	if strings.HasPrefix(exe, "/") {
		if executable(exe) {
			return exe, nil
		}
		return "", assignment.Errorf("provider", "the signed executable path is not an executable regular file")
	}
	if c, ok := LookPath(exe); ok {
		return c, nil
	}
	return "", assignment.Errorf("provider", "the executable is not in the fixed PATH %s", SafePATH)
}

// LookPath finds a bare command name in the fixed PATH only, never the
// caller's: the first executable regular file.
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
