package orchestrate_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"agentbox/internal/orchestrate"
)

// TestLoadRepoConfigFollowsNoSymlink: a `.jailbee` committed as a symlink
// (a branch merged from a sandbox, pointing into a sandbox's checkout on
// the host) or a config.yaml that is one is refused, not read; a plain
// config is read, and a repository without one gets the default.
func TestLoadRepoConfigFollowsNoSymlink(t *testing.T) {
	elsewhere := t.TempDir() // a sandbox's checkout, say
	if err := os.WriteFile(filepath.Join(elsewhere, "config.yaml"), []byte("limits:\n  pids: 99999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	plain, linkedDir, linkedFile, none := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.Mkdir(filepath.Join(plain, ".jailbee"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(plain, orchestrate.RepoConfigPath), []byte("limits:\n  pids: 321\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(linkedDir, ".jailbee")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(linkedFile, ".jailbee"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(elsewhere, "config.yaml"), filepath.Join(linkedFile, orchestrate.RepoConfigPath)); err != nil {
		t.Fatal(err)
	}

	cfg, err := orchestrate.LoadRepoConfig(plain)
	if err != nil || cfg.Limits.Pids == nil || *cfg.Limits.Pids != 321 {
		t.Fatalf("plain config: %+v %v", cfg, err)
	}
	if _, err := orchestrate.LoadRepoConfig(none); err != nil {
		t.Fatalf("no config: %v", err)
	}
	for name, repo := range map[string]string{".jailbee a symlink": linkedDir, "config.yaml a symlink": linkedFile} {
		cfg, err := orchestrate.LoadRepoConfig(repo)
		var r *orchestrate.Refusal
		if !errors.As(err, &r) || r.Detail != "the repository config .jailbee/config.yaml cannot be read" {
			t.Errorf("%s: %+v %v, want refused", name, cfg, err)
		}
	}
}
