package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/backend"
	"agentbox/internal/backend/local/unit"
	"agentbox/internal/cgroup"
	"agentbox/internal/secfs"
)

// Bounds of starting a unit.
const (
	// startTimeout bounds a launch: bubblewrap's setup and the supervisor's
	// first answer take milliseconds.
	startTimeout = 30 * time.Second
	// maxStatusBytes bounds what is read from bubblewrap's status fd: two
	// short JSON objects.
	maxStatusBytes = 4 << 10
	// maxLogTailBytes is how much of supervisor.log a failed start reports.
	maxLogTailBytes = 512
	// stopTimeout bounds waiting for a killed unit to be gone.
	stopTimeout = 30 * time.Second
	// pingInterval paces the wait for a new supervisor's first answer.
	pingInterval = 5 * time.Millisecond
)

// systemPath is the PATH of a sandboxed command after ClientBinDir.
const systemPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// systemDirs are bound read-only (or recreated as the same symlink, on a
// merged-/usr system) so the sandbox runs the host's tools.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// readOnlyProc are the kernel knobs under /proc that a new procfs leaves
// writable to their owner: bound read-only over themselves.
var readOnlyProc = []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"}

// Start launches the sandbox's unit; starting a running sandbox is a no-op.
func (b *Backend) Start(ctx context.Context, name string) error {
	dir, m, unlock, err := b.lockLoad(name)
	defer unlock()
	if err != nil {
		return err
	}
	if m.running() {
		return nil
	}
	// What a unit that died without a Stop left behind (processes outside
	// its pid namespace, its cgroups) goes first.
	if err := b.stopUnit(ctx, dir, m); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	pid, st, err := b.launch(ctx, name, dir, m)
	if err != nil {
		b.stopUnit(context.WithoutCancel(ctx), dir, m)
		return fmt.Errorf("start %s: %w", name, err)
	}
	m.PID, m.StartTime = pid, st
	return saveMeta(dir, m)
}

// Stop kills the sandbox's unit: its pid 1, and with it every process of
// its pid namespace, then whatever is left in its cgroups.
func (b *Backend) Stop(ctx context.Context, name string) error {
	dir, m, unlock, err := b.lockLoad(name)
	defer unlock()
	if err != nil {
		return err
	}
	return b.stopUnit(ctx, dir, m)
}

// stopUnit ends the unit m records and clears its identity.
func (b *Backend) stopUnit(ctx context.Context, dir string, m meta) error {
	ctx, cancel := context.WithTimeout(ctx, stopTimeout)
	defer cancel()
	if err := killProcess(ctx, m.PID, m.StartTime); err != nil {
		return fmt.Errorf("stop %s: %w", filepath.Base(dir), err)
	}
	if b.cg != nil {
		g, err := b.cg.Open(m.UUID)
		if err != nil {
			return fmt.Errorf("stop %s: %w", filepath.Base(dir), err)
		}
		if err := g.Kill(ctx); err != nil {
			return fmt.Errorf("stop %s: %w", filepath.Base(dir), err)
		}
		if err := g.Remove(); err != nil {
			return fmt.Errorf("stop %s: %w", filepath.Base(dir), err)
		}
	}
	if m.PID == 0 {
		return nil
	}
	m.PID, m.StartTime = 0, 0
	return saveMeta(dir, m)
}

// launch starts `jailbee _sandbox-launch` for the sandbox and returns the
// host pid and start time of its supervisor once the supervisor answers.
func (b *Backend) launch(ctx context.Context, name, dir string, m meta) (int, uint64, error) {
	spec := unit.LaunchSpec{UID: -1, GID: -1, Bwrap: b.bwrap}
	var g *cgroup.Group
	if b.cg != nil {
		// Room for the unit as it starts; set to the sandbox's own limit
		// on top of the unit's tasks once it is up (below).
		pids := m.Limits.Pids
		if pids != 0 {
			pids = min(pids+unit.UnitTasks, cgroup.MaxPids)
		}
		var err error
		g, err = b.cg.Create(m.UUID, cgroup.Limits{Pids: pids, MemoryBytes: m.Limits.MemoryBytes, CPUWeight: m.Limits.CPUWeight})
		if err != nil {
			return 0, 0, fmt.Errorf("cgroups: %w", err)
		}
		spec.CgroupProcs = g.ProcsFiles()
	}
	src, err := b.sources(dir, m)
	if err != nil {
		return 0, 0, err
	}
	if b.asRoot {
		spec.UID, spec.GID = m.UID, m.GID
	}
	for _, s := range src.stage {
		spec.Stage = append(spec.Stage, unit.StageEntry{Source: s.host, Name: s.name})
	}
	spec.Args = b.bwrapArgs(name, src)
	spec.Env = []string{"PATH=" + ClientBinDir + ":" + systemPath, "HOME=" + HomePath, "LANG=C.UTF-8"}

	ln, err := listenControl(dir)
	if err != nil {
		return 0, 0, err
	}
	lnFile, err := ln.File()
	ln.Close()
	if err != nil {
		return 0, 0, err
	}
	defer lnFile.Close()
	specR, specW, err := os.Pipe()
	if err != nil {
		return 0, 0, err
	}
	defer specR.Close()
	defer specW.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return 0, 0, err
	}
	defer statusR.Close()
	defer statusW.Close()
	logf, err := os.OpenFile(filepath.Join(dir, unitLog), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, 0, err
	}
	defer logf.Close()

	cmd := exec.Command(b.binary, "_sandbox-launch")
	cmd.Args[0] = ClientName
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = logf, logf
	// The order sets the descriptor numbers unit expects: 3, 4, 5.
	cmd.ExtraFiles = []*os.File{lnFile, specR, statusW}
	// A session of its own: the unit must outlive the broker and never
	// get the broker's terminal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if b.asRoot {
		cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, fmt.Errorf("launch: %w", err)
	}
	// bubblewrap's first process is the launcher's pid; reap it whenever
	// it ends (while this broker lives; init adopts it otherwise).
	go cmd.Wait()
	lnFile.Close()
	specR.Close()
	statusW.Close()
	data, _ := json.Marshal(spec)
	_, werr := specW.Write(data)
	specW.Close()
	if werr != nil {
		return 0, 0, fmt.Errorf("launch: %w%s", werr, logTail(dir))
	}
	pid, err := childPID(ctx, statusR)
	if err != nil {
		return 0, 0, fmt.Errorf("%w%s", err, logTail(dir))
	}
	// Keep draining bubblewrap's status in the background: its exit
	// report must not block on a full pipe.
	go func(r *os.File) {
		io.Copy(io.Discard, r)
		r.Close()
	}(statusR)
	statusR = nil
	st, err := waitPing(ctx, dir, pid)
	if err != nil {
		return 0, 0, fmt.Errorf("the supervisor does not answer: %w%s", err, logTail(dir))
	}
	if g != nil && m.Limits.Pids != 0 {
		// The supervisor answers once it has made its threads, and no
		// command of the sandbox has run yet: what the group holds now
		// is the unit's own, and the limit is the sandbox's on top.
		unitTasks, err := g.Tasks()
		if err != nil {
			return 0, 0, fmt.Errorf("cgroups: %w", err)
		}
		if err := g.SetPids(min(m.Limits.Pids+unitTasks, cgroup.MaxPids)); err != nil {
			return 0, 0, fmt.Errorf("cgroups: %w", err)
		}
	}
	return pid, st, nil
}

// childPID reads bubblewrap's first status object: the host pid of the
// sandbox's pid 1.
func childPID(ctx context.Context, r *os.File) (int, error) {
	if d, ok := ctx.Deadline(); ok {
		r.SetReadDeadline(d)
	}
	var st struct {
		ChildPID int `json:"child-pid"`
	}
	dec := json.NewDecoder(io.LimitReader(r, maxStatusBytes))
	if err := dec.Decode(&st); err != nil || st.ChildPID <= 0 {
		return 0, errors.New("bubblewrap could not set up the sandbox")
	}
	r.SetReadDeadline(time.Time{})
	return st.ChildPID, nil
}

// waitPing waits until the new supervisor (host pid pid) answers on its
// control socket; it fails at once when the supervisor has ended.
func waitPing(ctx context.Context, dir string, pid int) (uint64, error) {
	st, err := startTime(pid)
	if err != nil {
		return 0, errors.New("the sandbox ended during setup")
	}
	for {
		err := withControl(dir, func(sock string) error { return unit.Ping(ctx, sock) })
		if err == nil {
			return st, nil
		}
		if !alive(pid, st) {
			return 0, errors.New("the sandbox ended during setup")
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(pingInterval):
		}
	}
}

// listenControl makes the supervisor's control socket in the sandbox
// directory, owner only. The socket is named through the directory's
// handle, so a long state dir cannot exceed a socket address.
func listenControl(dir string) (*net.UnixListener, error) {
	var ln *net.UnixListener
	err := withControl(dir, func(sock string) error {
		if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			return fmt.Errorf("control socket: %w", err)
		}
		// The name goes through /proc/self/fd: never unlink by it later.
		l.SetUnlinkOnClose(false)
		if err := os.Chmod(sock, 0o600); err != nil {
			l.Close()
			return err
		}
		ln = l
		return nil
	})
	return ln, err
}

// withControl calls fn with a short path of dir's control socket, valid
// while fn runs: /proc/self/fd/N/control.sock through a handle of dir.
func withControl(dir string, fn func(sock string) error) error {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn("/proc/self/fd/" + strconv.Itoa(fd) + "/" + controlSock)
}

// logTail is the end of the unit's log, for an error, or "".
func logTail(dir string) string {
	f, err := os.OpenFile(filepath.Join(dir, unitLog), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return ""
	}
	off := max(0, fi.Size()-maxLogTailBytes)
	buf := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(buf, off)
	return ": " + string(trimSpace(buf[:n]))
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// source is one host path a sandbox binds.
type source struct {
	name string // staging name (root broker)
	host string // host path
}

// sources are the host paths a unit binds, each as bubblewrap will name
// it: staged under unit.StageDir for a root broker (stage lists them),
// the host path itself otherwise.
type sources struct {
	stage                    []source
	checkout, home, etc, bin string
	mounts                   string   // the folder of named mount points
	sockets                  string   // "" when no socket dir is attached
	model                    string   // "" when no model dir is attached
	agents                   []source // name on PATH, path to bind
	tmpBytes, shmBytes       int64    // the sizes of /tmp and /dev/shm; 0: tmpfs's default
}

// sizedTmpfs is bubblewrap's tmpfs at dir, of size bytes (0: tmpfs's
// default). bubblewrap makes /dev/shm a directory of /dev's own tmpfs,
// which the agent may write: a tmpfs of its own bounds it.
func sizedTmpfs(size int64, dir string) []string {
	if size > 0 {
		return []string{"--size", strconv.FormatInt(size, 10), "--tmpfs", dir}
	}
	return []string{"--tmpfs", dir}
}

func (b *Backend) sources(dir string, m meta) (sources, error) {
	var s sources
	add := func(name, host string) string {
		if !b.asRoot {
			return host
		}
		s.stage = append(s.stage, source{name: name, host: host})
		return path.Join(unit.StageDir, name)
	}
	if b.cg != nil && m.Limits.MemoryBytes > 0 {
		// The pages of /tmp and /dev/shm (both writable by the agent)
		// count against the memory limit but belong to no process: full
		// ones would leave the OOM killer only the processes, the
		// supervisor among them. Half the limit for /tmp and an eighth
		// for /dev/shm leave the rest to the processes.
		s.tmpBytes = m.Limits.MemoryBytes / 2
		s.shmBytes = m.Limits.MemoryBytes / 8
	}
	s.checkout = add("checkout", filepath.Join(dir, checkoutDir))
	s.home = add("home", filepath.Join(dir, homeDir))
	s.etc = add("etc", filepath.Join(dir, etcDir))
	s.bin = add("jailbee", b.binary)
	mnts, err := freshMountsDir(dir)
	if err != nil {
		return sources{}, err
	}
	s.mounts = add("mnts", mnts)
	if isDir(m.SocketDir) {
		s.sockets = add("orchestration", m.SocketDir)
	}
	if isDir(m.ModelDir) {
		s.model = add("model", m.ModelDir)
	}
	for _, name := range slices.Sorted(maps.Keys(b.agents)) {
		host := b.agents[name]
		// Checked here, not at New: an agent may be removed or upgraded
		// while the broker runs. The path stays out of the error: the
		// name is what the user installs by.
		if fi, err := os.Lstat(host); err != nil || !fi.Mode().IsRegular() {
			return sources{}, fmt.Errorf("the %s agent's binary is missing on the host (jailbee agent install %s)", name, name)
		}
		// "agent-" keeps an agent's staging name apart from the others.
		s.agents = append(s.agents, source{name: name, host: add("agent-"+name, host)})
	}
	return s, nil
}

// freshMountsDir empties the sandbox's folder of mount points (a unit
// that ended left its mounts' points behind) and returns its path.
func freshMountsDir(dir string) (string, error) {
	p := filepath.Join(dir, mountsDir)
	if err := secfs.RemoveTree(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("mount points: %w", err)
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		return "", fmt.Errorf("mount points: %w", err)
	}
	return p, nil
}

// isDir reports whether p is set and a directory (not a symlink to one).
func isDir(p string) bool {
	if p == "" {
		return false
	}
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

// bwrapArgs builds the bubblewrap invocation of a unit: every namespace
// new, no nested user namespaces, the supervisor as pid 1.
func (b *Backend) bwrapArgs(name string, s sources) []string {
	args := []string{
		"--unshare-all", "--unshare-user", // user, pid, mount, ipc, uts, net, cgroup
		"--disable-userns", // no nested user namespace: no capabilities to regain
		"--as-pid-1",       // the supervisor is pid 1: killing it ends the namespace
		"--new-session",
		"--uid", strconv.Itoa(backend.AgentUID), "--gid", strconv.Itoa(backend.AgentGID),
		"--hostname", name,
	}
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(d); err == nil {
				args = append(args, "--symlink", target, d)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", d, d)
		}
	}
	args = append(args, "--dir", "/etc")
	for _, f := range generatedEtcFiles {
		args = append(args, "--ro-bind", path.Join(s.etc, f), "/etc/"+f)
	}
	for _, f := range hostEtcFiles {
		args = append(args, "--ro-bind-try", f, f)
	}
	args = append(args, "--proc", "/proc")
	for _, p := range readOnlyProc {
		args = append(args, "--ro-bind-try", p, p)
	}
	args = append(args, "--dev", "/dev")
	args = append(args, sizedTmpfs(s.shmBytes, "/dev/shm")...)
	args = append(args, sizedTmpfs(s.tmpBytes, "/tmp")...)
	args = append(args,
		"--bind", s.checkout, WorkspacePath,
		"--bind", s.home, HomePath,
		"--ro-bind", s.bin, path.Join(ClientBinDir, ClientName),
	)
	for _, a := range s.agents {
		args = append(args, "--ro-bind", a.host, path.Join(ClientBinDir, a.name))
	}
	if s.sockets != "" {
		args = append(args, "--ro-bind", s.sockets, backend.SocketMountPath)
	}
	if s.model != "" {
		args = append(args, "--ro-bind", s.model, backend.ModelMountPath)
	}
	return append(args,
		"--ro-bind", s.mounts, backend.HostMountDir,
		"--remount-ro", "/", // the sandbox's own root: no new top-level entries
		"--chdir", "/",
		"--json-status-fd", strconv.Itoa(unit.StatusFD),
		"--", path.Join(ClientBinDir, ClientName), "_sandbox-init",
	)
}
