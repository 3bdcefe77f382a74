package incus

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"agentbox/internal/backend"
	"agentbox/internal/backend/holders"
	"agentbox/internal/secfs"
)

// AttachMount implements backend.Backend: the host directory becomes the
// disk device m.Device() at m.Path(), read-only when asked. Incus mounts
// it into a running container at once and keeps it across restarts. The
// directory is checked first to be reached through no symlink; Incus
// opens it again by name, so a directory on the way that someone other
// than the host's administrator can write is not safe to name.
func (b *Backend) AttachMount(ctx context.Context, name string, m backend.HostMount) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if managed, _ := b.lastSeen(name); !managed {
		if _, err := b.raw(ctx, name); err != nil {
			return err
		}
	}
	fail := func(err error) error {
		// Incus's messages may name the host path: it stays out.
		msg := strings.ReplaceAll(err.Error(), m.Source, "(the host directory)")
		if errors.Is(err, backend.ErrExists) {
			return fmt.Errorf("attach mount %s to %s: already attached", m.Name, name)
		}
		return fmt.Errorf("attach mount %s to %s: %s", m.Name, name, msg)
	}
	dir, _, err := secfs.OpenDirNoFollow(m.Source, nil)
	if err != nil {
		return fail(errors.New("the host directory is missing or reached through a symlink"))
	}
	dir.Close()
	err = b.retryConfig(ctx, "config", "device", "add", name, m.Device(), "disk",
		"source="+m.Source, "path="+m.Path(), "readonly="+strconv.FormatBool(m.ReadOnly))
	if err != nil {
		return fail(err)
	}
	return nil
}

// ErrMountCopied: root inside the container mounted a named mount
// elsewhere (or over its mount point), which no device removal undoes;
// the host directory stays reachable in the container until it stops.
var ErrMountCopied = errors.New("root inside the sandbox mounted it elsewhere: it stays reachable there until the sandbox stops")

// detachHostMount removes the device of a named host mount, then ends
// the processes of the container that still hold the unmounted mount
// (Incus unmounts it lazily). A mount of the directory that no device
// explains (root inside bound it elsewhere) fails it: before the removal,
// so the device stays and a retry looks again, and after it.
func (b *Backend) detachHostMount(ctx context.Context, name, device string) error {
	in, err := b.raw(ctx, name)
	if err != nil {
		return err
	}
	source, point := in.Devices[device]["source"], path.Clean("/"+in.Devices[device]["path"])
	if source == "" {
		return nil
	}
	fail := func(err error) error { return fmt.Errorf("detach mount %s from %s: %w", path.Base(point), name, err) }
	want, wantErr := hostMountID(source)
	var id uint64
	mounts, err := b.initMounts(ctx, name)
	if unreadable(err) {
		// Where root inside bound it cannot be told: as if elsewhere.
		return fail(fmt.Errorf("%w (%v)", ErrMountCopied, err))
	}
	if err != nil && !errors.Is(err, backend.ErrNotRunning) {
		// Not looked at (incusd did not answer, the init was changing):
		// the device stays, and the caller tries again or stops it.
		return fail(err)
	}
	if err == nil && wantErr == nil {
		if leftover(mounts, want, source, in.Devices) {
			return fail(ErrMountCopied)
		}
		for _, e := range mounts {
			if e.point == point && e.ident() == want {
				id = uint64(e.id)
			}
		}
	}
	if err := b.retryConfig(ctx, "config", "device", "remove", name, device); err != nil && !errors.Is(err, errNoDevice) {
		return fail(err)
	}
	mounts, err = b.initMounts(ctx, name)
	if unreadable(err) {
		return fail(fmt.Errorf("%w (%v)", ErrMountCopied, err))
	}
	if err != nil && !errors.Is(err, backend.ErrNotRunning) {
		return fail(err) // not looked at: as if still held
	}
	if err != nil {
		return nil // not running: a start mounts only its devices
	}
	// The holders: of the device's mount, and of any mount of the source's
	// filesystem the table no longer shows (a copy root bound and lazily
	// unmounted, kept through a process's working directory or a
	// descriptor).
	target := holders.Target{MountID: id}
	// The source's device as stat reports it, as statx does for a held
	// file: mountinfo's major:minor is the filesystem's, which on btrfs is
	// not the subvolume's that stat reports.
	var st unix.Stat_t
	if wantErr == nil && unix.Stat(source, &st) == nil {
		target.Dev, target.Attached = unix.Mkdev(unix.Major(st.Dev), unix.Minor(st.Dev)), map[uint64]bool{}
		for _, e := range mounts {
			target.Attached[uint64(e.id)] = true
		}
	}
	b.mu.Lock()
	initPID := b.inits[name].pid
	b.mu.Unlock()
	if (target.MountID != 0 || target.Dev != 0) && initPID != 0 {
		if err := holders.Kill(ctx, initPID, target); err != nil {
			return fail(err)
		}
	}
	if wantErr != nil {
		return nil // gone from the host
	}
	delete(in.Devices, device)
	if leftover(mounts, want, source, in.Devices) {
		return fail(ErrMountCopied)
	}
	// A mount namespace pinned by a bind of its nsfs file lives with no
	// process and no descriptor, and its table cannot be read: as if
	// bound elsewhere.
	if slices.ContainsFunc(mounts, func(e mountEntry) bool { return strings.HasPrefix(e.root, "mnt:[") }) {
		return fail(fmt.Errorf("%w (a mount namespace is kept by a bind mount)", ErrMountCopied))
	}
	// A mount namespace of a process's own (root's, or the agent's in a
	// user namespace of its own) keeps its copy, private or not, in a
	// table no one here can read whole: as if bound elsewhere.
	if err := holders.OtherMountNamespace(ctx, initPID); errors.Is(err, holders.ErrOtherMountNamespace) {
		return fail(fmt.Errorf("%w (%v)", ErrMountCopied, err))
	} else if err != nil {
		return fail(err)
	}
	return nil
}

// leftover reports whether mounts hold a mount of the host directory want
// (host path source, or a directory below it) that none of devices
// explains: each device of source or of a directory below it accounts for
// one mount on its own path.
func leftover(mounts []mountEntry, want mountID, source string, devices map[string]map[string]string) bool {
	explained := map[string]bool{}
	for _, d := range devices {
		src := d["source"]
		if d["type"] == "disk" && d["path"] != "" && (src == source || strings.HasPrefix(src, source+"/")) {
			explained[path.Clean(d["path"])] = true
		}
	}
	for _, e := range mounts {
		if e.dev != want.dev || (e.root != want.root && !strings.HasPrefix(e.root, want.root+"/")) {
			continue
		}
		if !explained[e.point] {
			return true
		}
		delete(explained, e.point) // one mount per device
	}
	return false
}
