package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseBrokerMounts: `mounts` names host directories; each entry
// needs an absolute, clean path of an existing directory reached through
// no symlink, and an explicit read_only.
func TestParseBrokerMounts(t *testing.T) {
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	file := filepath.Join(tmp, "file")
	link := filepath.Join(tmp, "link")
	for _, err := range []error{
		os.Mkdir(data, 0o755), os.WriteFile(file, nil, 0o644),
		os.Symlink(data, link), os.Mkdir(filepath.Join(data, "sub"), 0o755),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	b, err := ParseBroker([]byte("mounts:\n  docs: {path: " + data + ", read_only: true}\n  scratch.1: {path: " + data + "/sub, read_only: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]MountDir{"docs": {Path: data, ReadOnly: true}, "scratch.1": {Path: data + "/sub"}}
	if len(b.Mounts) != len(want) || b.Mounts["docs"] != want["docs"] || b.Mounts["scratch.1"] != want["scratch.1"] {
		t.Fatalf("mounts = %+v, want %+v", b.Mounts, want)
	}
	if b, err := ParseBroker([]byte("mounts: null\n")); err != nil || len(b.Mounts) != 0 {
		t.Fatalf("mounts: null = %+v, %v", b, err)
	}

	for _, tt := range []struct{ name, yaml, want string }{
		{"bad name", "mounts: {../x: {path: " + data + ", read_only: true}}\n", "mounts.../x: invalid mount name"},
		{"relative", "mounts: {d: {path: data, read_only: true}}\n", "mounts.d.path: must be an absolute, clean path of a directory (not /) (line 1)"},
		{"unclean", "mounts: {d: {path: " + data + "/../data, read_only: true}}\n", "mounts.d.path: must be an absolute, clean path"},
		{"trailing slash", "mounts: {d: {path: " + data + "/, read_only: true}}\n", "mounts.d.path: must be an absolute, clean path"},
		{"root", "mounts: {d: {path: /, read_only: true}}\n", "mounts.d.path: must be an absolute, clean path"},
		{"not a string", "mounts: {d: {path: [x], read_only: true}}\n", "mounts.d.path: must be an absolute, clean path"},
		{"missing", "mounts: {d: {path: " + data + "/gone, read_only: true}}\n", "mounts.d.path: is not an existing directory (line 1)"},
		{"a file", "mounts: {d: {path: " + file + ", read_only: true}}\n", "mounts.d.path: is not a directory (line 1)"},
		{"a symlink", "mounts: {d: {path: " + link + ", read_only: true}}\n", "mounts.d.path: passes through a symbolic link (give the real path) (line 1)"},
		{"through a symlink", "mounts: {d: {path: " + link + "/sub, read_only: true}}\n", "mounts.d.path: passes through a symbolic link"},
		{"no read_only", "mounts: {d: {path: " + data + "}}\n", "mounts.d: needs path and read_only (line 1)"},
		{"no path", "mounts: {d: {read_only: true}}\n", "mounts.d: needs path and read_only (line 1)"},
		{"read_only string", "mounts: {d: {path: " + data + ", read_only: \"yes\"}}\n", "mounts.d.read_only: must be true or false (line 1)"},
		{"unknown key", "mounts: {d: {path: " + data + ", read_only: true, shift: true}}\n", "mounts.d.shift: unknown key (line 1)"},
		{"not a mapping", "mounts: [d]\n", "mounts: must be a mapping (line 1)"},
		{"entry not a mapping", "mounts: {d: " + data + "}\n", "mounts.d: must be a mapping (line 1)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := brokerError(t, tt.yaml)
			if !strings.HasPrefix(got, tt.want) {
				t.Fatalf("\n got: %s\nwant: %s...", got, tt.want)
			}
			if strings.Contains(got, tmp) {
				t.Fatalf("error names the host path: %s", got)
			}
		})
	}
}

// TestBrokerValidateMounts: a Broker built in code is held to the same
// form of mount names and paths.
func TestBrokerValidateMounts(t *testing.T) {
	for _, tt := range []struct {
		mounts map[string]MountDir
		want   string
	}{
		{map[string]MountDir{"ok": {Path: "/srv/data"}}, ""},
		{map[string]MountDir{"../x": {Path: "/srv/data"}}, "mounts.../x: invalid mount name"},
		{map[string]MountDir{"d": {Path: "srv"}}, "mounts.d.path: must be an absolute, clean path of a directory (not /)"},
		{map[string]MountDir{"d": {Path: "/"}}, "mounts.d.path: must be an absolute, clean path of a directory (not /)"},
	} {
		b := DefaultBroker()
		b.Mounts = tt.mounts
		got := ""
		if err := b.Validate(); err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("%v: %q, want %q", tt.mounts, got, tt.want)
		}
	}
}
