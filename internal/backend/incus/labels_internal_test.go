package incus

import (
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
