package agent

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"agentbox/internal/backend"
	"agentbox/internal/grant"
)

// ModelSocketDir is where a sandbox sees its model sockets;
// ModelSocketPath is the Anthropic API's.
const (
	ModelSocketDir  = backend.ModelMountPath
	ModelSocketName = "anthropic.sock"
	ModelSocketPath = ModelSocketDir + "/" + ModelSocketName
)

// LiteLLMSocketName is the model socket of LiteLLM profile name (its
// endpoint in broker.yaml's model.litellm), beside the Anthropic one.
func LiteLLMSocketName(profile string) string { return "litellm-" + profile + ".sock" }

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

// firstWord is the command's first word.
func (s Spec) firstWord() string {
	f := strings.Fields(s.Command)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// IsClaude reports whether the agent is the Claude Code CLI: its
// command's first word is `claude`, or `claude-jb` (the same CLI, its
// model a LiteLLM profile's).
func (s Spec) IsClaude() bool {
	w := s.firstWord()
	return w == grant.AgentClaude || w == grant.AgentClaudeJB
}

// command is the agent's command line as run: a Claude agent gains the
// bypass flag unless its command chooses a permission mode itself, and
// claude-jb is the claude CLI (there is no claude-jb binary in a sandbox:
// the broker points the CLI at the profile's socket instead).
func (s Spec) command() string {
	cmd := s.Command
	if s.firstWord() == grant.AgentClaudeJB {
		cmd = grant.AgentClaude + strings.TrimPrefix(strings.TrimSpace(cmd), grant.AgentClaudeJB)
	}
	if s.IsClaude() && !strings.Contains(cmd, bypassFlag) && !strings.Contains(cmd, "--permission-mode") {
		cmd += " " + bypassFlag
	}
	return cmd
}

// env is what `env` sets before the agent's command: the model socket
// and quiet switches for a Claude agent (a claude-jb runner's profile's
// socket), nothing for others.
func (s Spec) env() []string {
	if !s.IsClaude() {
		return nil
	}
	env := ClaudeEnv()
	if s.firstWord() == grant.AgentClaudeJB && s.Runner != nil && s.Runner.Profile != "" {
		env["ANTHROPIC_UNIX_SOCKET"] = ModelSocketDir + "/" + LiteLLMSocketName(s.Runner.Profile)
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
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
