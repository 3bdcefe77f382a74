package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentInstallTakesThePin: without --version, `agent install` asks
// npm for the release broker.yaml pins; a malformed pin is refused before
// npm is asked anything; --version wins over the pin. (npm here is a
// stand-in that says no release exists and names what it was asked.)
func TestAgentInstallTakesThePin(t *testing.T) {
	bin := t.TempDir()
	asked := filepath.Join(t.TempDir(), "asked")
	npm := "#!/bin/sh\necho \"$2\" >>" + asked + "\necho '{\"error\":{\"summary\":\"No match found\"}}'\nexit 1\n"
	if err := os.WriteFile(filepath.Join(bin, "npm"), []byte(npm), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	state := t.TempDir()
	for _, tc := range []struct {
		config, version string
		code            int
		asked, stderr   string
	}{
		{"agents:\n  claude:\n    version: 2.1.300\n", "", 1, "@anthropic-ai/claude-code-linux-x64@2.1.300", "No match found"},
		{"agents:\n  claude:\n    version: 2.1.300\n", "2.1.301", 1, "@anthropic-ai/claude-code-linux-x64@2.1.301", "No match found"},
		{"", "", 1, "@anthropic-ai/claude-code-linux-x64@2.1.332", "No match found"},
		{"agents:\n  claude:\n    version: latest\n", "", 1, "", "agents.claude.version: must be a release number"},
	} {
		os.Remove(asked)
		if err := os.WriteFile(filepath.Join(state, "broker.yaml"), []byte(tc.config), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"agent", "install", "claude", "--state", state}
		if tc.version != "" {
			args = append(args, "--version", tc.version)
		}
		var stdout, stderr bytes.Buffer
		code := runWith(t, nil, &stdout, &stderr, args...)
		got, _ := os.ReadFile(asked)
		if code != tc.code || strings.TrimSpace(string(got)) != tc.asked || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%q --version %q: exit %d, npm asked %q, stderr %q", tc.config, tc.version, code, got, stderr.String())
		}
	}
	var stdout bytes.Buffer
	if code := runWith(t, nil, &stdout, &bytes.Buffer{}, "agent", "ls", "--json", "--state", state); code != 0 || strings.TrimSpace(stdout.String()) != "[]" {
		t.Fatalf("agent ls of nothing installed: %d %q", code, stdout.String())
	}
}
