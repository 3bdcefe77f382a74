// Package holders ends the processes that still hold a mount after it was
// detached. Linux has no revoke: a lazily unmounted mount stays alive,
// files and all, for every process whose working directory, root, open
// file or memory mapping is on it. Killing those processes is the only
// way to make a detached mount gone from a sandbox's view.
package holders

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// maxRounds bounds the scans: each round kills every holder it finds, and
// only a holder can hand the mount on (a descriptor sent to another
// process), so a few rounds end it.
const maxRounds = 64

// exitWait paces the wait for a killed process to be gone.
const exitWait = 20 * time.Millisecond

// maxFDs bounds the descriptors looked at in one process, over its
// distinct descriptor tables: each is a file of /proc to read (some 50 us
// here), and a process may hold a million per table (fs.nr_open) at 8
// bytes each. A process past the bound counts as a holder (fail closed)
// without being looked at to the end.
const maxFDs = 1 << 14

// maxMaps bounds the file mappings looked at in one process (each a
// statx; vm.max_map_count allows some 65,000). A process past it counts
// as a holder, as for maxFDs: a real program maps a few thousand files'
// pieces at most.
const maxMaps = 1 << 14

// scanBound bounds a whole Kill or OtherMountNamespace: the sandbox
// decides how many processes, descriptors and mappings there are to look
// at (16,384 descriptors take about 0.2 s here, so a thousand such
// processes would take minutes), and its callers hold what other
// sandboxes wait for. Past it the scan fails, and with it the detach: its
// callers then end the sandbox (fail closed). A variable for tests.
var scanBound = 10 * time.Second

// statxFlags: a look at a file never waits on its filesystem. What the
// sandbox mounts (FUSE, whose daemon is the sandbox's) could make a
// statx that asks it block for ever; the mount id is the VFS's own.
const statxFlags = unix.AT_STATX_DONT_SYNC

// MountID is the mount id (statx STATX_MNT_ID, mountinfo's first field) of
// the mount fd is on.
func MountID(fd int) (uint64, error) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, err
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		return 0, errors.New("the kernel reports no mount ids")
	}
	return stx.Mnt_id, nil
}

// Target is what holds a detached mount: a file on mount MountID and,
// when Dev is set, a file on any mount of the filesystem Dev that
// Attached does not list. That second kind is a copy root inside bound
// elsewhere and lazily unmounted (or cloned with open_tree): no mount
// table shows it, yet a process whose working directory or descriptor is
// on it reaches the directory still. Attached must be read after the
// mount was detached.
type Target struct {
	MountID  uint64
	Dev      uint64 // unix.Mkdev of the filesystem; 0: MountID alone
	Attached map[uint64]bool
}

func (t Target) has(stx *unix.Statx_t) bool {
	if t.MountID != 0 && stx.Mnt_id == t.MountID {
		return true
	}
	return t.Dev != 0 && unix.Mkdev(stx.Dev_major, stx.Dev_minor) == t.Dev && !t.Attached[stx.Mnt_id]
}

// Kill ends every process of the sandbox whose first process is the host
// process nsPID that holds t, and returns once none does.
// The sandbox's processes are those of nsPID's pid namespace and of the
// namespaces nested in it, whatever their mount namespace: root inside
// may move a holder to a mount namespace of its own, where a descriptor
// it had still holds the mount (mount ids are unique on the host).
func Kill(ctx context.Context, nsPID int, t Target) error {
	ctx, cancel := context.WithTimeout(ctx, scanBound)
	defer cancel()
	var ns unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(nsPID)+"/ns/pid", &ns); err != nil {
		return fmt.Errorf("the sandbox's pid namespace: %w", err)
	}
	var own unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &own); err != nil || own.Dev == ns.Dev && own.Ino == ns.Ino {
		// Every process of the host would count as the sandbox's.
		return errors.New("the sandbox has no pid namespace of its own")
	}
	for range maxRounds {
		killed, err := killRound(ctx, ns, t)
		if err != nil || len(killed) == 0 {
			return err
		}
		err = waitGone(ctx, killed)
		for _, fd := range killed {
			unix.Close(fd)
		}
		if err != nil {
			return err
		}
	}
	return errors.New("processes keep taking up a detached mount")
}

// killRound signals every holder once and returns their pidfds.
func killRound(ctx context.Context, ns unix.Stat_t, t Target) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var killed []int
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			for _, fd := range killed {
				unix.Close(fd)
			}
			return nil, fmt.Errorf("look for the processes holding a detached mount: %w", err)
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		// The pidfd first: every look below is then at this process or at
		// one reusing its pid after it died, which the signal misses.
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone
		}
		if !inNamespace(pid, ns) || !holds(ctx, pid, t) {
			unix.Close(fd)
			continue
		}
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			unix.Close(fd)
			return killed, fmt.Errorf("kill a process holding a detached mount: %w", err)
		}
		killed = append(killed, fd)
	}
	return killed, nil
}

// nsGetParent is NS_GET_PARENT: the namespace a pid namespace is nested in.
const nsGetParent = 0xb702

// maxNesting bounds the pid namespaces above a process (the kernel's
// MAX_PID_NS_LEVEL is 32).
const maxNesting = 33

// inNamespace reports whether process pid is in the pid namespace ns or
// in one nested in it.
func inNamespace(pid int, ns unix.Stat_t) bool {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	for range maxNesting {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			break
		}
		if st.Dev == ns.Dev && st.Ino == ns.Ino {
			unix.Close(fd)
			return true
		}
		parent, err := unix.IoctlRetInt(fd, nsGetParent)
		unix.Close(fd)
		if err != nil {
			return false // the host's: not nested in ns
		}
		fd = parent
	}
	unix.Close(fd)
	return false
}

// holds reports whether process pid has its executable, working
// directory, root, an open file or a mapping on t, or more
// descriptors than maxFDs. Each thread is looked at: a thread may have a
// working directory and a descriptor table of its own (unshare CLONE_FS,
// CLONE_FILES); a table the thread shares with its leader is looked at
// once, with the leader's.
// A scan that its context ends reports no hold; its caller sees the end.
func holds(ctx context.Context, pid int, t Target) bool {
	proc := "/proc/" + strconv.Itoa(pid)
	// The executable first: a program run from the mount may unmap every
	// mapping of its file and keep the mount through it alone.
	if on(proc+"/exe", t) || mapsOn(ctx, proc, t) {
		return true
	}
	tids, err := readNames(proc + "/task")
	if err != nil {
		return false // gone
	}
	budget := maxFDs
	for _, tid := range tids {
		task := proc + "/task/" + tid
		if on(task+"/cwd", t) || on(task+"/root", t) {
			return true
		}
		if tid != strconv.Itoa(pid) && sameFiles(pid, tid) {
			continue
		}
		if fdsOn(ctx, task, t, &budget) {
			return true
		}
	}
	return false
}

// fdsOn reports whether a descriptor of task is on t, or its
// descriptors are more than budget (what is left of maxFDs) holds. The
// file a descriptor names is looked at through its magic link, never
// through its fdinfo: the kernel writes out an epoll descriptor's whole
// interest list there, and a sandbox can make that list a million lines
// long and dup the descriptor thousands of times.
func fdsOn(ctx context.Context, task string, t Target, budget *int) bool {
	return anyFD(ctx, task+"/fd", budget, func(n string) bool {
		return on(task+"/fd/"+n, t)
	})
}

// anyFD reports whether is reports true for a name in the descriptor
// directory dir, or dir holds more names than budget; each name looked at
// is taken from budget. It reports false once ctx ends.
func anyFD(ctx context.Context, dir string, budget *int, is func(name string) bool) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false // gone
	}
	defer f.Close()
	for ctx.Err() == nil {
		names, err := f.Readdirnames(1024)
		for _, n := range names {
			if *budget--; *budget < 0 || is(n) {
				return true
			}
		}
		if err != nil {
			return false
		}
	}
	return false
}

// sameFiles reports whether thread tid of process pid shares its
// leader's descriptor table (kcmp KCMP_FILES); false when that cannot be
// told, and the thread's table is looked at.
func sameFiles(pid int, tid string) bool {
	t, err := strconv.Atoi(tid)
	if err != nil {
		return false
	}
	const kcmpFiles = 2
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pid), uintptr(t), kcmpFiles, 0, 0, 0)
	return errno == 0 && r == 0
}

// on reports whether the file the magic link p names is on t.
func on(p string, t Target) bool {
	var stx unix.Statx_t
	return unix.Statx(unix.AT_FDCWD, p, statxFlags, unix.STATX_MNT_ID, &stx) == nil && t.has(&stx)
}

// mapsOn reports whether a file mapped into the process is on t, or it
// maps more than maxMaps pieces of files.
func mapsOn(ctx context.Context, proc string, t Target) bool {
	budget := maxMaps
	return anyFD(ctx, proc+"/map_files", &budget, func(n string) bool {
		return on(proc+"/map_files/"+n, t)
	})
}

func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// waitGone waits until every process of pidfds has exited (a pidfd turns
// readable), which releases what it held.
func waitGone(ctx context.Context, pidfds []int) error {
	fds := make([]unix.PollFd, len(pidfds))
	for i, fd := range pidfds {
		fds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	for len(fds) > 0 {
		if _, err := unix.Poll(fds, int(exitWait/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		live := fds[:0]
		for _, f := range fds {
			if f.Revents == 0 {
				live = append(live, unix.PollFd{Fd: f.Fd, Events: unix.POLLIN})
			}
		}
		fds = live
		if err := ctx.Err(); err != nil && len(fds) > 0 {
			return fmt.Errorf("wait for the processes holding a detached mount: %w", err)
		}
	}
	return nil
}

// ErrOtherMountNamespace: a process of the sandbox is in a mount
// namespace other than the sandbox's, or keeps one by a descriptor. Its
// copies of the sandbox's mounts are its own: a private one stays when
// the sandbox's is detached, and what it holds cannot be told from
// outside (its mount table shows only what its processes' roots reach).
var ErrOtherMountNamespace = errors.New("a process of the sandbox has a mount namespace of its own")

// OtherMountNamespace returns ErrOtherMountNamespace when a thread of the
// sandbox whose first process is nsPID (see Kill) is in a mount namespace
// other than nsPID's, or has a descriptor on one, or has more descriptors
// than maxFDs (not looked at: fail closed).
func OtherMountNamespace(ctx context.Context, nsPID int) error {
	ctx, cancel := context.WithTimeout(ctx, scanBound)
	defer cancel()
	var pidNS, mntNS, own unix.Stat_t
	first := "/proc/" + strconv.Itoa(nsPID)
	if err := errors.Join(unix.Stat(first+"/ns/pid", &pidNS), unix.Stat(first+"/ns/mnt", &mntNS), unix.Stat("/proc/self/ns/pid", &own)); err != nil {
		return fmt.Errorf("the sandbox's namespaces: %w", err)
	}
	if own.Dev == pidNS.Dev && own.Ino == pidNS.Ino {
		return errors.New("the sandbox has no pid namespace of its own")
	}
	mine := "mnt:[" + strconv.FormatUint(mntNS.Ino, 10) + "]"
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("look at the sandbox's mount namespaces: %w", err)
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || !inNamespace(pid, pidNS) {
			continue
		}
		proc := "/proc/" + e.Name()
		tids, err := readNames(proc + "/task")
		if err != nil {
			continue // gone
		}
		budget := maxFDs
		for _, tid := range tids {
			task := proc + "/task/" + tid
			if ns, err := os.Readlink(task + "/ns/mnt"); err == nil && ns != mine {
				return ErrOtherMountNamespace
			}
			if tid != e.Name() && sameFiles(pid, tid) {
				continue
			}
			if anyFD(ctx, task+"/fd", &budget, func(n string) bool {
				l, err := os.Readlink(task + "/fd/" + n)
				return err == nil && strings.HasPrefix(l, "mnt:[") && l != mine
			}) {
				return ErrOtherMountNamespace
			}
		}
	}
	return nil
}
