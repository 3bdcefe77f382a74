package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"agentbox/internal/backend"
	"agentbox/internal/backend/holders"
	"agentbox/internal/secfs"
)

// Named host mounts of a running sandbox. The sandbox sees the broker-
// owned directory <sandbox>/mnts read-only at backend.HostMountDir (bound
// at start, emptied first), so the mount points in it, made on the host,
// are ones nothing inside can replace or move: the sandbox's root is
// read-only and it has no mount rights. An attach clones the host
// directory (open_tree, opened without following symlinks) and moves the
// clone onto its mount point from a thread that entered the sandbox's
// mount namespace; a detach unmounts it there, kills the processes still
// holding it (package holders) and removes the mount point.

// mountsDir is the sandbox directory's folder of mount points.
const mountsDir = "mnts"

// AttachMount implements backend.Backend. It needs a root broker: only
// root can enter the sandbox's mount namespace.
func (b *Backend) AttachMount(ctx context.Context, name string, hm backend.HostMount) error {
	if err := hm.Validate(); err != nil {
		return err
	}
	if !b.asRoot {
		return fmt.Errorf("%w: attaching a mount to a running sandbox needs a root broker", backend.ErrUnsupported)
	}
	dir, m, unlock, err := b.lockLoad(name)
	defer unlock()
	if err != nil {
		return err
	}
	if !m.running() {
		return fmt.Errorf("%w: %s", backend.ErrNotRunning, name)
	}
	fail := func(err error) error { return fmt.Errorf("attach mount %s to %s: %w", hm.Name, name, err) }
	tree, err := cloneTree(hm)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(tree)
	point := filepath.Join(dir, mountsDir, hm.Name)
	// unix calls, not os: their errors name no host path.
	switch err := unix.Mkdir(point, 0o755); {
	case errors.Is(err, unix.EEXIST):
		return fail(errors.New("already attached"))
	case errors.Is(err, unix.ENOENT):
		return fail(errors.New("the sandbox has no mount points (restart the sandbox)"))
	case err != nil:
		return fail(fmt.Errorf("make the mount point: %w", err))
	}
	var want unix.Stat_t
	err = unix.Lstat(point, &want)
	if err == nil {
		err = inMountNS(m, func() error {
			fd, err := openPoint(hm.Name, want)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return unix.MoveMount(tree, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		})
	}
	if err != nil {
		unix.Rmdir(point)
		return fail(err)
	}
	return nil
}

// cloneTree opens the host directory without following any symlink and
// returns a detached clone of it (not of the mounts below it), read-only
// when asked, never with setuid or device files honoured.
func cloneTree(hm backend.HostMount) (int, error) {
	src, _, err := secfs.OpenDirNoFollow(hm.Source, nil)
	if err != nil {
		return -1, errors.New("the host directory is missing or reached through a symlink")
	}
	defer src.Close()
	tree, err := unix.OpenTree(int(src.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("clone the host directory: %w", err)
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if hm.ReadOnly {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attr}); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("set the mount's attributes: %w", err)
	}
	return tree, nil
}

// openPoint opens the mount point of mount name inside the sandbox (the
// caller is in its mount namespace) and checks that it is the directory
// the host made (want): the same file, reached by no symlink.
func openPoint(name string, want unix.Stat_t) (int, error) {
	p := backend.HostMount{Name: name}.Path()
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, errors.New("the sandbox has no mount point for it (restart the sandbox)")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != want.Dev || st.Ino != want.Ino {
		unix.Close(fd)
		return -1, fmt.Errorf("%w: the mount point inside is not the one the broker made", secfs.ErrUnsafe)
	}
	return fd, nil
}

// detachHostMount unmounts the named mount inside the running sandbox,
// ends the processes still holding it and removes its mount point.
func (b *Backend) detachHostMount(ctx context.Context, name, device string) error {
	dir, m, unlock, err := b.lockLoad(name)
	defer unlock()
	if err != nil {
		return err
	}
	mount, ok := attachedName(dir, device)
	if !ok {
		return nil
	}
	fail := func(err error) error { return fmt.Errorf("detach mount %s from %s: %w", mount, name, err) }
	point := filepath.Join(dir, mountsDir, mount)
	var want unix.Stat_t
	if err := unix.Lstat(point, &want); errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return fail(err)
	}
	if m.running() {
		var id uint64
		err := inMountNS(m, func() error {
			var err error
			id, err = unmountPoint(mount, want)
			return err
		})
		if err != nil {
			return fail(err)
		}
		if id != 0 {
			if err := holders.Kill(ctx, m.PID, holders.Target{MountID: id}); err != nil {
				return fail(err)
			}
		}
	}
	if err := unix.Rmdir(point); err != nil && !errors.Is(err, unix.ENOENT) {
		return fail(fmt.Errorf("remove the mount point: %w", err))
	}
	return nil
}

// attachedName is the name of the attached mount whose device is device
// (a long name's device holds only a hash of its end), ok false if none.
func attachedName(dir, device string) (string, bool) {
	names, err := os.ReadDir(filepath.Join(dir, mountsDir))
	if err != nil {
		return "", false
	}
	for _, e := range names {
		if (backend.HostMount{Name: e.Name()}).Device() == device {
			return e.Name(), true
		}
	}
	return "", false
}

// unmountPoint detaches what is mounted on the mount point of name (the
// caller is in the sandbox's mount namespace) and returns its mount id,
// 0 when nothing is.
func unmountPoint(name string, want unix.Stat_t) (uint64, error) {
	p := backend.HostMount{Name: name}.Path()
	parent, err := unix.Open(backend.HostMountDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, nil // a sandbox started without mount points has none
	}
	defer unix.Close(parent)
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return 0, nil
	}
	defer unix.Close(fd)
	outer, err1 := holders.MountID(parent)
	id, err2 := holders.MountID(fd)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	if id == outer {
		return 0, nil // the bare mount point: nothing attached
	}
	// The path is safe to name: every component is on the read-only root
	// or the read-only mount point folder, which nothing inside can change.
	if err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		return 0, fmt.Errorf("unmount: %w", err)
	}
	return id, nil
}

// inMountNS runs fn on a thread of its own that entered the mount
// namespace of the sandbox's running unit m. The thread never leaves it:
// it ends with fn (a locked thread that is not unlocked is not reused).
func inMountNS(m meta, fn func() error) error {
	ns, err := os.Open("/proc/" + strconv.Itoa(m.PID) + "/ns/mnt")
	if err != nil {
		return backend.ErrNotRunning
	}
	defer ns.Close()
	// Opened, then checked: the handle is the unit's, not a reused pid's.
	if !m.running() {
		return backend.ErrNotRunning
	}
	return onOwnThread(func() error {
		// setns to a mount namespace needs a thread that shares no
		// filesystem state (root, cwd) with the rest of the process.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("enter the sandbox's mount namespace: %w", err)
		}
		return fn()
	})
}

// onOwnThread runs fn on a locked thread that ends with it, never the
// main thread: Go cannot end that one, and /proc/self (the broker's own
// mount table, its cgroup) describes the main thread.
func onOwnThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Holding the main thread, the next goroutine gets another.
			err := onOwnThread(fn)
			runtime.UnlockOSThread()
			done <- err
			return
		}
		done <- fn() // the thread stays locked: Go ends it with this goroutine
	}()
	return <-done
}
