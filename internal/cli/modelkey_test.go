package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/config"
)

const testKey = "sk-ant-test-0123456789abcdefghij"

// TestModelConfigKey: the key is read from an owner-only regular file or a
// set variable; anything else is refused, and no refusal shows the key.
func TestModelConfigKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", testKey+"\n", 0o600)
	open := write("open", testKey, 0o644)
	empty := write("empty", " \n", 0o600)
	spaced := write("spaced", testKey+" "+testKey, 0o600)
	big := write("big", strings.Repeat("k", maxAPIKeyBytes+1), 0o600)
	atMax := write("atmax", strings.Repeat("k", maxAPIKeyBytes), 0o600)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JB_TEST_KEY", testKey)
	t.Setenv("JB_TEST_EMPTY", "")
	up := config.DefaultModelUpstream
	for _, tc := range []struct {
		name    string
		model   config.Model
		wantKey string
		wantErr string
	}{
		{"no key", config.Model{Upstream: up}, "", ""},
		{"file", config.Model{Upstream: up, APIKeyFile: good}, testKey, ""},
		{"file at max size", config.Model{Upstream: up, APIKeyFile: atMax}, strings.Repeat("k", maxAPIKeyBytes), ""},
		{"env", config.Model{Upstream: up, APIKeyEnv: "JB_TEST_KEY"}, testKey, ""},
		{"file readable by others", config.Model{Upstream: up, APIKeyFile: open}, "", "readable by others (mode 0644): chmod 600 it"},
		{"symlink", config.Model{Upstream: up, APIKeyFile: link}, "", "too many levels of symbolic links"},
		{"missing", config.Model{Upstream: up, APIKeyFile: filepath.Join(dir, "nope")}, "", "no such file"},
		{"empty file", config.Model{Upstream: up, APIKeyFile: empty}, "", "empty"},
		{"two words", config.Model{Upstream: up, APIKeyFile: spaced}, "", "other than visible ASCII"},
		{"past max size", config.Model{Upstream: up, APIKeyFile: big}, "", "over 4096 bytes"},
		{"env unset", config.Model{Upstream: up, APIKeyEnv: "JB_TEST_UNSET"}, "", "JB_TEST_UNSET is not set"},
		{"env empty", config.Model{Upstream: up, APIKeyEnv: "JB_TEST_EMPTY"}, "", "JB_TEST_EMPTY is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := modelConfig(tc.model)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error with %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), testKey) || strings.Contains(err.Error(), "kkkkkkkk") {
					t.Fatalf("the error shows the key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantKey == "" {
				if m != nil {
					t.Fatalf("got a model config with no key named: %+v", m)
				}
				return
			}
			if m == nil || m.Key != tc.wantKey || m.Upstream.String() != up {
				t.Fatalf("got %+v", m)
			}
		})
	}
}
