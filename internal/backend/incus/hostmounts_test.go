package incus_test

import (
	"errors"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/incus"
)

// TestHostMountCopiedByRoot: root inside a container can bind a named
// mount elsewhere, which removing the device does not undo: the detach
// says so instead of reporting the mount gone.
func TestHostMountCopiedByRoot(t *testing.T) {
	b := newBackend(t)
	ctx := t.Context()
	const name = "copied"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy(t.Context(), name) })
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	m := backend.HostMount{Name: "d", Source: backendtest.HostDir(t), ReadOnly: true}
	if err := b.AttachMount(ctx, name, m); err != nil {
		t.Fatal(err)
	}
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
