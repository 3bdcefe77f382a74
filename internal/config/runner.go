package config

import (
	"fmt"
	"strings"

	"agentbox/internal/grant"
)

// CheckRunner refuses a runner this repository cannot run, with the spec's
// details. It checks the runner's own syntax first (grant.Runner.Check),
// then:
//
//   - the agent entry: agents.<agent>; for claude-jb without an entry of
//     its own, agents.claude (the broker swaps the command's first word);
//   - it is defined and enabled, has prompt_args, and its command's first
//     word is `claude` or `claude-jb`;
//   - claude-jb needs litellm.enabled; a named profile must be configured
//     (and served, when Served is known) and, with a model, carry its base
//     tier.
func (c *Repo) CheckRunner(r grant.Runner) error {
	if err := r.Check("runner"); err != nil {
		return err
	}
	name := r.Agent
	a, ok := c.Agents[name]
	if !ok && r.Agent == grant.AgentClaudeJB {
		name = grant.AgentClaude
		a, ok = c.Agents[name]
	}
	if !ok || !a.IsEnabled() {
		return fmt.Errorf("agent `%s` is not enabled in this repo", r.Agent)
	}
	if len(a.PromptArgs) == 0 {
		return fmt.Errorf("agent `%s` has no prompt_args, so it cannot take a prompt", name)
	}
	if head := firstWord(a.Command); head != grant.AgentClaude && head != grant.AgentClaudeJB {
		return fmt.Errorf("agents.%s.command must start with `claude` or `claude-jb` to take a runner (it is `%s`)", name, shown(a.Command))
	}
	if r.Agent != grant.AgentClaudeJB {
		return nil
	}
	if !c.LiteLLM.Enabled {
		return fmt.Errorf("claude-jb needs LiteLLM enabled in this repo")
	}
	if r.Profile == "" {
		return nil
	}
	p, configured := c.LiteLLM.Profiles[r.Profile]
	if !configured || (c.LiteLLM.Served != nil && !c.LiteLLM.Served[r.Profile]) {
		names := sortedKeys(c.LiteLLM.Profiles)
		list := "none"
		if len(names) > 0 {
			list = strings.Join(names, ", ")
		}
		return fmt.Errorf("LiteLLM profile `%s` is not served (configured: %s; run `jailbee litellm up`)", r.Profile, list)
	}
	if r.Model != "" {
		tier := grant.BaseTier(r.Model)
		if _, ok := p.Tiers[tier]; !ok {
			return fmt.Errorf("LiteLLM profile `%s` has no `%s` tier", r.Profile, tier)
		}
	}
	return nil
}

func firstWord(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
