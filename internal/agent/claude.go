package agent

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"agentbox/internal/grant"
)

// ModelSocketPath is where an agent inside a sandbox reaches its model:
// the broker's model socket (backend.ModelMountPath).
const ModelSocketPath = "/run/jailbee/model/anthropic.sock"

// PlaceholderKey is the API key a Claude agent is given. It is no secret:
// the broker's model socket drops whatever key a request carries and sends
// the host's in its place, so the real key never enters a sandbox.
const PlaceholderKey = "sk-ant-jailbee-placeholder-the-broker-holds-the-key"

// bypassFlag runs Claude Code without permission prompts: the sandbox is
// the boundary, and the agent user is never root (the CLI refuses the
// flag as root).
const bypassFlag = "--dangerously-skip-permissions"

// claudeEnv points the CLI at the model socket and stops the traffic a
// sandbox with no network could not carry anyway (telemetry, auto-update,
// error reports, the plugin marketplace).
var claudeEnv = map[string]string{
	"ANTHROPIC_UNIX_SOCKET":                                ModelSocketPath,
	"ANTHROPIC_BASE_URL":                                   "http://localhost",
	"ANTHROPIC_API_KEY":                                    PlaceholderKey,
	"DISABLE_TELEMETRY":                                    "1",
	"DISABLE_AUTOUPDATER":                                  "1",
	"DISABLE_ERROR_REPORTING":                              "1",
	"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC":             "1",
	"CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
}

// ClaudeEnv is the environment a Claude Code CLI in a sandbox needs: its
// model socket, the placeholder key and the quiet switches (no secret).
func ClaudeEnv() map[string]string { return maps.Clone(claudeEnv) }

// IsClaude reports whether the agent is the Claude Code CLI: its
// command's first word is `claude`.
func (s Spec) IsClaude() bool {
	f := strings.Fields(s.Command)
	return len(f) > 0 && f[0] == grant.AgentClaude
}

// command is the agent's command line as run: a Claude agent gains the
// bypass flag unless its command chooses a permission mode itself.
func (s Spec) command() string {
	if s.IsClaude() && !strings.Contains(s.Command, bypassFlag) && !strings.Contains(s.Command, "--permission-mode") {
		return s.Command + " " + bypassFlag
	}
	return s.Command
}

// env is what `env` sets before the agent's command: the model socket
// and quiet switches for a Claude agent, nothing for others.
func (s Spec) env() []string {
	if !s.IsClaude() {
		return nil
	}
	out := make([]string, 0, len(claudeEnv))
	for _, k := range slices.Sorted(maps.Keys(claudeEnv)) {
		out = append(out, k+"="+claudeEnv[k])
	}
	return out
}

// ClaudeHomeArgv seeds the agent user's home, inside the sandbox, so that
// no first-run dialog of the CLI appears for a session in cwd: onboarding
// done, the placeholder key approved, the folder trusted, the bypass mode
// accepted. A file that is there is left as it is (the CLI keeps its own
// state in it).
func ClaudeHomeArgv(cwd string) []string {
	state, _ := json.Marshal(map[string]any{
		"hasCompletedOnboarding": true,
		"customApiKeyResponses": map[string]any{
			"approved": []string{PlaceholderKey[len(PlaceholderKey)-20:]},
			"rejected": []string{},
		},
		"projects": map[string]any{
			cwd: map[string]bool{"hasTrustDialogAccepted": true, "hasCompletedProjectOnboarding": true},
		},
	})
	settings, _ := json.Marshal(map[string]bool{"skipDangerousModePermissionPrompt": true})
	const script = `set -e; umask 077; mkdir -p "$HOME/.claude"
[ -e "$HOME/.claude.json" ] || printf '%s\n' "$1" >"$HOME/.claude.json"
[ -e "$HOME/.claude/settings.json" ] || printf '%s\n' "$2" >"$HOME/.claude/settings.json"`
	return []string{"sh", "-c", script, "sh", string(state), string(settings)}
}
