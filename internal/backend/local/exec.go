package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"agentbox/internal/backend"
	"agentbox/internal/secfs"
)

// systemPath is the PATH of a sandboxed command after ClientBinDir.
const systemPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxStatusBytes bounds what is read from bwrap's --json-status-fd: two
// short JSON objects.
const maxStatusBytes = 4 << 10

// overflowUID is the kernel's "nobody" id; a uid from it up is refused.
const overflowUID = 65534

// systemDirs are bound read-only (or recreated as the same symlink, on a
// merged-/usr system) so the sandbox runs the host's tools.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// statusFD is where bwrap writes its JSON status (the first ExtraFile).
const statusFD = "3"

// Exec runs opts.Argv in the running sandbox and returns its exit status
// (128+n for a command killed by signal n). A command ended by Stop or
// Destroy returns an error wrapping backend.ErrNotRunning.
func (b *Backend) Exec(ctx context.Context, name string, opts backend.ExecOptions) (int, error) {
	if len(opts.Argv) == 0 || opts.Argv[0] == "" {
		return -1, errors.New("exec: empty command")
	}
	for k, v := range opts.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return -1, fmt.Errorf("exec: invalid environment variable %q", k)
		}
	}
	p, status, err := b.start(ctx, name, opts)
	if err != nil {
		return -1, err
	}
	werr := p.cmd.Wait()
	b.mu.Lock()
	delete(b.procs[name], p)
	if len(b.procs[name]) == 0 {
		delete(b.procs, name)
	}
	killed := p.killed
	b.mu.Unlock()
	close(p.done)

	if killed {
		return -1, fmt.Errorf("exec in %s: %w (stopped while the command ran)", name, backend.ErrNotRunning)
	}
	if ctx.Err() != nil {
		return -1, fmt.Errorf("exec in %s: %w", name, ctx.Err())
	}
	if status != nil {
		// bwrap reports the child's pid once the sandbox is set up: without
		// it, the exit status is bwrap's own failure, not the command's.
		if s := <-status; !bytes.Contains(s, []byte(`"child-pid"`)) {
			return -1, fmt.Errorf("exec in %s: bubblewrap could not set up the sandbox (%v)", name, werr)
		}
	}
	return exitStatus(werr)
}

// exitStatus turns Wait's error into a shell-style exit status.
func exitStatus(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return -1, err
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ee.ExitCode(), nil
}

// start checks that the sandbox runs and starts the command, both under
// the lock, so a concurrent Stop either refuses the Exec or kills it.
// status (bwrap only) yields what bwrap wrote to its status fd.
func (b *Backend) start(ctx context.Context, name string, opts backend.ExecOptions) (*process, <-chan []byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, err := b.loadLocked(name)
	if err != nil {
		return nil, nil, err
	}
	if !m.Running {
		return nil, nil, fmt.Errorf("%w: %s", backend.ErrNotRunning, name)
	}
	var cmd *exec.Cmd
	if b.insecure {
		cmd, err = b.insecureCommand(ctx, name, m, opts)
	} else {
		cmd, err = b.bwrapCommand(ctx, name, m, opts)
	}
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opts.Stdin, opts.Stdout, opts.Stderr
	// A process group of its own, so a kill reaches what the command spawned
	// (bwrap's own children die with it through --die-with-parent).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &process{cmd: cmd, done: make(chan struct{})}
	cmd.Cancel = p.kill

	var status chan []byte
	var statusW *os.File
	if !b.insecure {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		statusW = w
		cmd.ExtraFiles = []*os.File{w}
		status = make(chan []byte, 1)
		go func() {
			defer r.Close()
			data, _ := io.ReadAll(io.LimitReader(r, maxStatusBytes))
			status <- data
		}()
	}
	err = cmd.Start()
	if statusW != nil {
		statusW.Close() // the reader sees EOF once bwrap exits
	}
	if err != nil {
		return nil, nil, fmt.Errorf("exec in %s: %w", name, err)
	}
	if b.procs[name] == nil {
		b.procs[name] = map[*process]bool{}
	}
	b.procs[name][p] = true
	return p, status, nil
}

// kill ends the command's whole process group.
func (p *process) kill() error {
	if p.cmd.Process == nil {
		return nil
	}
	return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// identity resolves ExecOptions.User to ids and a login name.
func identity(u string) (uid, gid int, login string, err error) {
	switch u {
	case "", AgentUser:
		return backend.AgentUID, backend.AgentGID, AgentUser, nil
	case "root":
		return 0, 0, "root", nil
	}
	n, err := strconv.Atoi(u)
	if err != nil || n < 0 || n >= overflowUID {
		return 0, 0, "", fmt.Errorf("exec: unknown user %q", u)
	}
	switch n {
	case 0:
		return 0, 0, "root", nil
	case backend.AgentUID:
		return backend.AgentUID, backend.AgentGID, AgentUser, nil
	}
	return n, n, u, nil
}

// baseEnv is the whole environment of a command: nothing of the broker's
// own environment leaks in except TERM.
func baseEnv(pathList, home, login string, extra map[string]string) []string {
	env := map[string]string{
		"PATH": pathList,
		"HOME": home,
		"USER": login,
		"LANG": "C.UTF-8",
	}
	if term, ok := os.LookupEnv("TERM"); ok {
		env["TERM"] = term
	}
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// bwrapCommand builds the bubblewrap invocation of one Exec. The
// environment goes through the process environment (bwrap passes it on),
// not --setenv, so values never show in the host's process list.
func (b *Backend) bwrapCommand(ctx context.Context, name string, m meta, opts backend.ExecOptions) (*exec.Cmd, error) {
	uid, gid, login, err := identity(opts.User)
	if err != nil {
		return nil, err
	}
	dir := b.dir(name)
	args := []string{
		"--unshare-all", "--unshare-user", // user, pid, mount, ipc, uts, net, cgroup
		"--die-with-parent", "--new-session",
		"--uid", strconv.Itoa(uid), "--gid", strconv.Itoa(gid),
		"--cap-drop", "ALL",
		"--hostname", name,
	}
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(d)
			if err != nil {
				return nil, err
			}
			args = append(args, "--symlink", target, d)
		case fi.IsDir():
			args = append(args, "--ro-bind", d, d)
		}
	}
	args = append(args, "--dir", "/etc")
	for _, f := range generatedEtcFiles {
		args = append(args, "--ro-bind", filepath.Join(dir, etcDir, f), "/etc/"+f)
	}
	for _, f := range hostEtcFiles {
		args = append(args, "--ro-bind-try", f, f)
	}
	args = append(args,
		"--proc", "/proc",
		"--dev", "/dev",
		"--tmpfs", "/tmp",
		"--bind", filepath.Join(dir, checkoutDir), WorkspacePath,
		"--bind", filepath.Join(dir, homeDir), HomePath,
	)
	if m.SocketDir != "" {
		// -try: a socket directory the broker has since removed leaves the
		// mount point empty (the client reports the broker unreachable)
		// instead of failing every command.
		args = append(args, "--ro-bind-try", m.SocketDir, backend.SocketMountPath)
	}
	pathList := systemPath
	if b.client != "" {
		args = append(args, "--ro-bind", b.client, path.Join(ClientBinDir, ClientName))
		pathList = ClientBinDir + ":" + systemPath
	}
	workdir := WorkspacePath
	if opts.Dir != "" {
		workdir = path.Join(WorkspacePath, opts.Dir) // an absolute Dir replaces it
		if path.IsAbs(opts.Dir) {
			workdir = path.Clean(opts.Dir)
		}
	}
	args = append(args,
		"--remount-ro", "/", // the sandbox's own root: no new top-level entries
		"--chdir", workdir,
		"--json-status-fd", statusFD,
		"--",
	)
	args = append(args, opts.Argv...)
	cmd := exec.CommandContext(ctx, b.bwrap, args...)
	cmd.Env = baseEnv(pathList, HomePath, login, opts.Env)
	return cmd, nil
}

// insecureCommand runs the command on the host as the broker's user, in
// the checkout, with the same cleared environment and the socket's path
// in SocketEnv. opts.User is ignored: there is no one else to be.
func (b *Backend) insecureCommand(ctx context.Context, name string, m meta, opts backend.ExecOptions) (*exec.Cmd, error) {
	dir := b.dir(name)
	checkout, home := filepath.Join(dir, checkoutDir), filepath.Join(dir, homeDir)
	workdir := insecureDir(opts.Dir, checkout, home)
	pathList := systemPath
	if b.client != "" {
		pathList = filepath.Join(b.root, insecureBinDir) + ":" + systemPath
	}
	login := "agent"
	if u, err := user.Current(); err == nil {
		login = u.Username
	}
	extra := map[string]string{}
	if m.SocketDir != "" {
		extra[SocketEnv] = filepath.Join(m.SocketDir, SocketFile)
	}
	for k, v := range opts.Env {
		extra[k] = v
	}
	prog, err := lookPathIn(opts.Argv[0], pathList, workdir)
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	cmd := exec.CommandContext(ctx, prog, opts.Argv[1:]...)
	cmd.Args[0] = opts.Argv[0]
	cmd.Dir = workdir
	cmd.Env = baseEnv(pathList, home, login, extra)
	return cmd, nil
}

// insecureDir maps a sandbox working directory to the host: the checkout
// and home paths a sandboxed command would see become their host dirs.
func insecureDir(dir, checkout, home string) string {
	if dir == "" {
		return checkout
	}
	if !path.IsAbs(dir) {
		return filepath.Join(checkout, dir)
	}
	dir = path.Clean(dir)
	for inside, host := range map[string]string{WorkspacePath: checkout, HomePath: home} {
		if dir == inside {
			return host
		}
		if rest, ok := strings.CutPrefix(dir, inside+"/"); ok {
			return filepath.Join(host, rest)
		}
	}
	return dir
}

// lookPathIn finds prog in pathList (the command's PATH, not the broker's).
func lookPathIn(prog, pathList, workdir string) (string, error) {
	if strings.Contains(prog, "/") {
		if !filepath.IsAbs(prog) {
			prog = filepath.Join(workdir, prog)
		}
		return exec.LookPath(prog)
	}
	for _, d := range filepath.SplitList(pathList) {
		if p, err := exec.LookPath(filepath.Join(d, prog)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: %w", prog, exec.ErrNotFound)
}

// linkInsecureClient makes Root/.insecure-bin/jailbee a symlink to the
// client binary, so insecure commands find it on PATH by its name.
func (b *Backend) linkInsecureClient() error {
	if b.client == "" {
		return nil
	}
	bin := filepath.Join(b.root, insecureBinDir)
	if err := secfs.EnsurePrivateDir(bin); err != nil {
		return err
	}
	link := filepath.Join(bin, ClientName)
	if target, err := os.Readlink(link); err == nil && target == b.client {
		return nil
	}
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Symlink(b.client, link)
}

// removeSandboxDir removes a sandbox directory without following links.
// A sandbox may leave directories it made read-only (a Go module cache):
// when removal fails, owner write permission is restored on every real
// directory, through a handle opened without following links, and
// removal is tried once more.
func removeSandboxDir(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("remove %s: %w: not a real directory", filepath.Base(dir), secfs.ErrUnsafe)
	}
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			makeOwnerWritable(p)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// makeOwnerWritable gives a directory inside a sandbox mode 0700 through a
// handle opened with O_NOFOLLOW, so a symlink swapped in cannot redirect
// the change to a host file.
func makeOwnerWritable(dir string) {
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	defer f.Close()
	f.Chmod(0o700)
}
