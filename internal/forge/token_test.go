package forge_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/config"
	"agentbox/internal/forge"
)

func TestLoadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	private := write("private", token+"\n", 0o600)
	groupReadable := write("group", token, 0o640)
	worldReadable := write("world", token, 0o604)
	spaced := write("spaced", "two words", 0o600)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(private, link); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JB_TEST_FORGE_TOKEN", " "+token+" ")
	t.Setenv("JB_TEST_FORGE_EMPTY", "")

	for _, c := range []struct {
		name    string
		cfg     config.Forge
		wantErr string
	}{
		{"file", config.Forge{TokenFile: private}, ""},
		{"env", config.Forge{TokenEnv: "JB_TEST_FORGE_TOKEN"}, ""},
		{"group-readable", config.Forge{TokenFile: groupReadable}, "readable by others (mode 0640): chmod 600 it"},
		{"world-readable", config.Forge{TokenFile: worldReadable}, "readable by others (mode 0604): chmod 600 it"},
		{"symlink", config.Forge{TokenFile: link}, "too many levels of symbolic links"},
		{"directory", config.Forge{TokenFile: dir}, "not a regular file"},
		{"missing", config.Forge{TokenFile: filepath.Join(dir, "none")}, "no such file"},
		{"two words", config.Forge{TokenFile: spaced}, "visible ASCII"},
		{"env empty", config.Forge{TokenEnv: "JB_TEST_FORGE_EMPTY"}, "JB_TEST_FORGE_EMPTY is not set"},
		{"none", config.Forge{}, "no forge token is configured"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := forge.LoadToken(c.cfg)
			if c.wantErr == "" {
				if err != nil || got != token {
					t.Fatalf("LoadToken = %q, %v; want the token", got, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("LoadToken = %v, want an error with %q", err, c.wantErr)
			}
			if strings.Contains(err.Error(), token) || strings.Contains(err.Error(), "two words") {
				t.Fatalf("the error carries the file's content: %v", err)
			}
		})
	}
	if _, err := forge.LoadToken(config.Forge{}); !errors.Is(err, forge.ErrNoToken) {
		t.Fatalf("no token: %v, want ErrNoToken", err)
	}
	if _, err := forge.FromConfig(config.Forge{APIURL: config.DefaultForgeAPIURL}); !errors.Is(err, forge.ErrNoToken) {
		t.Fatalf("FromConfig without a token: %v, want ErrNoToken", err)
	}
}

func TestGitURL(t *testing.T) {
	if got := forge.GitURL(config.DefaultForgeGitURL, repo); got != "https://github.com/acme/widget.git" {
		t.Fatalf("GitURL = %q", got)
	}
}
