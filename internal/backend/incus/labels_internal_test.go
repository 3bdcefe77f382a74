package incus

import (
	"agentbox/internal/backend"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestLabelConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   []string
		bad    bool
	}{
		{name: "none", labels: nil},
		{name: "sorted", labels: map[string]string{"role": "child", "branch": "fix/x", "parent": "lead", "repo": "/srv/a b"},
			want: []string{"user.jailbee.branch=fix/x", "user.jailbee.parent=lead", "user.jailbee.repo=/srv/a b", "user.jailbee.role=child"}},
		{name: "the managed key is ours", labels: map[string]string{"managed": "false"}, bad: true},
		{name: "uppercase key", labels: map[string]string{"Role": "x"}, bad: true},
		{name: "key with a dot", labels: map[string]string{"a.b": "x"}, bad: true},
		{name: "empty key", labels: map[string]string{"": "x"}, bad: true},
		{name: "newline in value", labels: map[string]string{"repo": "/a\nb"}, bad: true},
		{name: "NUL in value", labels: map[string]string{"repo": "/a\x00b"}, bad: true},
		{name: "value at the bound", labels: map[string]string{"repo": strings.Repeat("a", maxLabelLen)},
			want: []string{"user.jailbee.repo=" + strings.Repeat("a", maxLabelLen)}},
		{name: "value past the bound", labels: map[string]string{"repo": strings.Repeat("a", maxLabelLen+1)}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := labelConfig(tc.labels)
			if tc.bad {
				if err == nil {
					t.Fatalf("labelConfig = %q, want an error", got)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("labelConfig = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestIncusError(t *testing.T) {
	exit := errors.New("exit status 1")
	for _, tc := range []struct {
		stderr string
		is     error
		msg    string
	}{
		{stderr: "Error: Instance not found\n", is: backend.ErrNotFound, msg: "sandbox not found: Instance not found"},
		{stderr: `Error: Failed creating instance record: Add instance info to the database: This "instances" entry already exists`, is: backend.ErrExists},
		{stderr: "Error: The incus daemon doesn't appear to be started (socket path: /var/lib/incus/unix.socket)", is: ErrDaemonDown},
		{stderr: `Error: Get "http://unix.socket/1.0": dial unix /var/lib/incus/unix.socket: connect: connection refused`, is: ErrDaemonDown},
		{stderr: `Error: Get "http://unix.socket/1.0": dial unix /var/lib/incus/unix.socket: connect: no such file or directory`, is: ErrDaemonDown},
		{stderr: "Error: Failed to start device \"x\": boom", msg: `incus: Failed to start device "x": boom`},
		{stderr: "", msg: "incus: exit status 1"},
	} {
		err := incusError(exit, tc.stderr)
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%q: %v, want %v", tc.stderr, err, tc.is)
		}
		if tc.msg != "" && err.Error() != tc.msg {
			t.Errorf("%q: %q, want %q", tc.stderr, err.Error(), tc.msg)
		}
		if errors.Is(err, ErrDaemonDown) && strings.Contains(err.Error(), "/var/lib") {
			t.Errorf("%q: a host path in %q", tc.stderr, err)
		}
	}
}
