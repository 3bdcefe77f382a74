package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/agentbin"
	"agentbox/internal/backend"
	"agentbox/internal/cli"
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

// TestBrokerPassesInstalledAgents: the broker opens its backend with the
// binary of each agent whose pinned release is installed, and says which
// agents cannot run when it is not.
func TestBrokerPassesInstalledAgents(t *testing.T) {
	state := t.TempDir()
	open := func() (map[string]string, string) {
		t.Helper()
		var got map[string]string
		var stderr bytes.Buffer
		code := cli.Run(context.Background(), "jailbee", []string{"broker", "--state", state}, cli.Deps{
			OpenBackend: func(o cli.BackendOptions) (backend.Backend, error) {
				got = o.AgentBinaries
				return nil, errors.New("enough")
			},
			Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &stderr,
		})
		if code == 0 || !strings.Contains(stderr.String(), "enough") {
			t.Fatalf("broker: exit %d, %q", code, stderr.String())
		}
		return got, stderr.String()
	}
	got, stderr := open()
	if len(got) != 0 || !strings.Contains(stderr, "claude agents cannot run until `jailbee agent install claude`") {
		t.Fatalf("nothing installed: agents %v, log %q", got, stderr)
	}
	// An installed release that is not the pin does not count.
	if err := os.WriteFile(filepath.Join(state, "broker.yaml"), []byte("agents:\n  claude:\n    version: 2.1.300\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	install := func(version string) string {
		t.Helper()
		bin := filepath.Join(agentbin.BinDir(state, "claude", version), "claude")
		if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		record, _ := json.Marshal(agentbin.Installed{Agent: "claude", Version: version, Path: bin, Size: 10})
		if err := os.WriteFile(filepath.Join(agentbin.Dir(state, "claude", version), "installed.json"), record, 0o644); err != nil {
			t.Fatal(err)
		}
		return bin
	}
	install(agentbin.ClaudeDefaultVersion)
	if got, _ := open(); len(got) != 0 {
		t.Fatalf("only another release installed: agents %v", got)
	}
	bin := install("2.1.300")
	if got, stderr := open(); len(got) != 1 || got["claude"] != bin || strings.Contains(stderr, "cannot run") {
		t.Fatalf("the pin installed: agents %v (want claude: %s), log %q", got, bin, stderr)
	}
}
