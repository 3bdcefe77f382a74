package incus_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/incus"
	"agentbox/internal/backend/incus/incustest"
)

// TestHostMountCopiedByRoot: root inside a container can bind a named
// mount elsewhere, which removing the device does not undo: the detach
// says so instead of reporting the mount gone.
func TestHostMountCopiedByRoot(t *testing.T) {
	const name = "copied"
	b, m := mountedSandbox(t, name)
	ctx := t.Context()
	r := backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"sh", "-c",
		"mkdir -p /root/copy && mount --bind " + m.Path() + " /root/copy && cat /root/copy/hello"}})
	if r.Code != 0 || r.Stdout != "hi\n" {
		t.Fatalf("root's copy: exit %d, %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if err := b.DetachMount(ctx, name, m.Device()); !errors.Is(err, incus.ErrMountCopied) {
		t.Fatalf("DetachMount with a copy left: %v, want ErrMountCopied", err)
	}
	// The device stays, so a retry looks again.
	if got := backendtest.Sh(t, b, name, "cat "+m.Path()+"/hello"); got != "hi" {
		t.Fatalf("after the refused detach the mount holds %q", got)
	}
	r = backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"umount", "/root/copy"}})
	if r.Code != 0 {
		t.Fatalf("umount: %q", r.Stderr)
	}
	if err := b.DetachMount(ctx, name, m.Device()); err != nil {
		t.Fatalf("DetachMount once the copy is gone: %v", err)
	}
	if r := backendtest.Exec(t, b, name, backend.ExecOptions{Argv: []string{"cat", m.Path() + "/hello"}}); r.Code == 0 {
		t.Fatal("the mount is still there after the detach")
	}
}

// TestHostMountCopyDetachedAndHeld: root binds a named mount elsewhere,
// leaves a process with its working directory in the copy and lazily
// unmounts the copy: no mount table shows it, yet the process reaches the
// host directory through it. The detach ends that process: afterwards
// nothing in the container reaches the directory. Also with the source a
// btrfs subvolume, whose device stat reports is not the one the mount
// table shows (where the host has the btrfs pool scripts/incus-setup.sh
// makes).
func TestHostMountCopyDetachedAndHeld(t *testing.T) {
	t.Run("directory", func(t *testing.T) { heldCopyDetached(t, "heldcopy", backendtest.HostDir(t)) })
	t.Run("btrfs subvolume", func(t *testing.T) {
		pool := "/var/lib/incus/storage-pools/" + incustest.FastPool
		var fs unix.Statfs_t
		if unix.Statfs(pool, &fs) != nil || fs.Type != unix.BTRFS_SUPER_MAGIC {
			t.Skip("no btrfs pool here")
		}
		sub := filepath.Join(pool, "jbtest-"+strings.ToLower(rand.Text()[:8]))
		if out, err := exec.Command("btrfs", "subvolume", "create", sub).CombinedOutput(); err != nil {
			t.Skipf("btrfs subvolume create: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("btrfs", "subvolume", "delete", sub).Run() })
		if err := os.WriteFile(filepath.Join(sub, "hello"), []byte("hi\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		heldCopyDetached(t, "heldsubvol", sub)
	})
}

func heldCopyDetached(t *testing.T, name, source string) {
	b, m := mountedSandboxFrom(t, name, source)
	ctx := t.Context()
	r := backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"sh", "-c",
		"mkdir -p /root/copy && mount --bind " + m.Path() + " /root/copy && " +
			"(cd /root/copy && exec setsid sh -c 'echo $$ >/root/holder; exec sleep 600' </dev/null >/dev/null 2>&1 &) && " +
			"while [ ! -s /root/holder ]; do sleep 0.1; done && umount -l /root/copy && cat /proc/$(cat /root/holder)/cwd/hello"}})
	if r.Code != 0 || r.Stdout != "hi\n" {
		t.Fatalf("root's held copy: exit %d, %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if err := b.DetachMount(ctx, name, m.Device()); err != nil {
		t.Fatalf("DetachMount: %v", err)
	}
	r = backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"sh", "-c",
		"for p in /proc/[0-9]*; do cat $p/cwd/hello 2>/dev/null; done; cat " + m.Path() + "/hello 2>/dev/null; true"}})
	if r.Stdout != "" {
		t.Fatalf("the host directory is still reachable after the detach: %q", r.Stdout)
	}
}

// TestHostMountPinnedNamespace: root keeps a mount namespace of its own
// alive with no process and no descriptor, through a bind mount of its
// nsfs file. What that namespace holds cannot be read from outside (no
// process of it to look through), so the detach fails closed
// (ErrMountCopied: the caller stops the sandbox) instead of reporting the
// mount gone.
func TestHostMountPinnedNamespace(t *testing.T) {
	const name = "pinned"
	b, m := mountedSandbox(t, name)
	ctx := t.Context()
	r := backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"sh", "-c",
		"mkdir /run/p && mount --bind /run/p /run/p && mount --make-private /run/p && touch /run/p/m && " +
			// A namespace of unshare's own, bound to /run/p/m. The kernel
			// refuses (EINVAL) to bind a mount namespace whose id is not
			// above the caller's, and since 6.18 ids come from per-CPU
			// batches of 4096: one made later on another CPU can be lower.
			// So one CPU takes 4097 ids first (UTS namespaces are
			// cheap), which moves it to a batch above every id handed out.
			"cpu=$(cut -d' ' -f39 /proc/self/stat) && " +
			"(taskset -c $cpu perl -e '" + burnNamespaceIDs + "' \"$(uname -m)\" & echo $! >/run/holder) && pid=$(cat /run/holder) && " +
			// Wait until it has made it (a readlink that fails while it
			// execs says nothing).
			"until n=$(readlink /proc/$pid/ns/mnt) && [ -n \"$n\" ] && [ \"$n\" != \"$(readlink /proc/self/ns/mnt)\" ]; do sleep 0.1; done && " +
			"mount --bind /proc/$pid/ns/mnt /run/p/m && kill -9 $pid && " +
			"while [ -e /proc/$pid ]; do sleep 0.1; done && nsenter --mount=/run/p/m cat " + m.Path() + "/hello"}})
	if r.Code != 0 || r.Stdout != "hi\n" {
		t.Fatalf("root's pinned namespace: exit %d, %q %q", r.Code, r.Stdout, r.Stderr)
	}
	err := b.DetachMount(ctx, name, m.Device())
	if errors.Is(err, incus.ErrMountCopied) {
		return
	}
	t.Fatalf("DetachMount with a pinned mount namespace: %v, want ErrMountCopied", err)
}

// burnNamespaceIDs is a perl program (perl-base is in the image) that makes
// and drops 4097 UTS namespaces, then execs unshare into a mount namespace
// of its own, with private propagation, held by a sleep. Its argument is
// the machine (uname -m), which names unshare's syscall number.
const burnNamespaceIDs = `my $nr = {x86_64 => 272, aarch64 => 97}->{$ARGV[0]} // die "no unshare syscall number for $ARGV[0]\n"; ` +
	`for (1..4097) { syscall($nr, 0x04000000) == 0 or die "unshare(CLONE_NEWUTS): $!\n" } ` +
	`exec "unshare", "-m", "--propagation", "private", "sleep", "600" or die "exec unshare: $!\n"`

// TestHostMountReadOnlyForRoot: root inside cannot make a read-only
// named mount writable (the mount came from a more privileged namespace,
// so its read-only flag is locked).
func TestHostMountReadOnlyForRoot(t *testing.T) {
	b := newBackend(t)
	ctx := t.Context()
	const name = "rootro"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(t.Context(), name) })
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	dir := backendtest.HostDir(t)
	m := backend.HostMount{Name: "d", Source: dir, ReadOnly: true}
	if err := b.AttachMount(ctx, name, m); err != nil {
		t.Fatal(err)
	}
	r := backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"sh", "-c",
		"mount -o remount,rw,bind " + m.Path() + " 2>/dev/null; mount -o remount,rw " + m.Path() + " 2>/dev/null; echo pwned > " + m.Path() + "/hello"}})
	if r.Code == 0 {
		t.Fatal("root inside wrote to a read-only mount")
	}
	if data, err := os.ReadFile(filepath.Join(dir, "hello")); err != nil || string(data) != "hi\n" {
		t.Fatalf("the host file holds %q, %v", data, err)
	}
}

// mountedSandbox is a running sandbox of its own backend with the
// read-only named mount "d" of a host directory holding "hello" (hi),
// destroyed when the test ends.
func mountedSandbox(t *testing.T, name string) (*incus.Backend, backend.HostMount) {
	t.Helper()
	return mountedSandboxFrom(t, name, backendtest.HostDir(t))
}

// mountedSandboxFrom is mountedSandbox with the host directory source.
func mountedSandboxFrom(t *testing.T, name, source string) (*incus.Backend, backend.HostMount) {
	t.Helper()
	b := newBackend(t)
	ctx := t.Context()
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(context.Background(), name) })
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	m := backend.HostMount{Name: "d", Source: source, ReadOnly: true}
	if err := b.AttachMount(ctx, name, m); err != nil {
		t.Fatal(err)
	}
	return b, m
}
