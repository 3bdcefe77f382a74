package incus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

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

// detachHostMount removes the device of a named host mount, then ends
// the processes of the container that still hold the unmounted mount
// (Incus unmounts it lazily).
func (b *Backend) detachHostMount(ctx context.Context, name string, m backend.HostMount) error {
	if managed, _ := b.lastSeen(name); !managed {
		if _, err := b.raw(ctx, name); err != nil {
			return err
		}
	}
	var id uint64
	var initPID int
	if mounts, err := b.initMounts(ctx, name); err == nil {
		if e, ok := visibleMount(mounts, m.Path()); ok && e.point == m.Path() {
			id = uint64(e.id)
			b.mu.Lock()
			initPID = b.inits[name].pid
			b.mu.Unlock()
		}
	}
	err := b.retryConfig(ctx, "config", "device", "remove", name, m.Device())
	if err != nil && !errors.Is(err, errNoDevice) {
		return err
	}
	if id == 0 || initPID == 0 {
		return nil
	}
	if err := holders.Kill(ctx, initPID, id); err != nil {
		return fmt.Errorf("detach mount %s from %s: %w", m.Name, name, err)
	}
	return nil
}
