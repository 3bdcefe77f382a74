package grant

import (
	"fmt"
	"regexp"
	"strings"
)

// Runner names the agent that runs a child: the spec's runner object,
// shared by spawn/restart manifests, the grant's default_runner and the
// repository's orchestration.default_runner.
type Runner struct {
	Agent   string `json:"agent" yaml:"agent"`
	Profile string `json:"profile,omitempty" yaml:"profile"`
	Model   string `json:"model,omitempty" yaml:"model"`
}

// The runner agents the spec knows.
const (
	AgentClaude   = "claude"
	AgentClaudeJB = "claude-jb"
)

// Tiers are the model tiers a runner may name, in the spec's order.
var Tiers = []string{"fable", "opus", "sonnet", "haiku"}

// LongContextSuffix may follow a tier exactly once ("sonnet[1m]").
const LongContextSuffix = "[1m]"

// profileRE is the LiteLLM profile name rule of the host config.
var profileRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// BaseTier returns model without the optional LongContextSuffix; LiteLLM
// profile checks use the base tier.
func BaseTier(model string) string {
	return strings.TrimSuffix(model, LongContextSuffix)
}

// ValidModel reports whether model is a tier, optionally with the exact
// LongContextSuffix.
func ValidModel(model string) bool {
	base := BaseTier(model)
	for _, t := range Tiers {
		if base == t {
			return true
		}
	}
	return false
}

// ValidProfile reports whether p is a valid LiteLLM profile name.
func ValidProfile(p string) bool { return profileRE.MatchString(p) }

// Check validates the runner on its own (no repository knowledge). prefix
// names the object in the message, e.g. "runner" or
// "orchestration.default_runner".
func (r Runner) Check(prefix string) error {
	switch r.Agent {
	case AgentClaude, AgentClaudeJB:
	case "":
		return fmt.Errorf("%s.agent is required", prefix)
	default:
		return fmt.Errorf("%s.agent must be `claude` or `claude-jb`", prefix)
	}
	if r.Profile != "" {
		if r.Agent != AgentClaudeJB {
			return fmt.Errorf("%s.profile is only valid with agent `claude-jb`", prefix)
		}
		if !ValidProfile(r.Profile) {
			return fmt.Errorf("%s.profile must match [a-z0-9][a-z0-9_-]{0,63}", prefix)
		}
	}
	if r.Model != "" && !ValidModel(r.Model) {
		return fmt.Errorf("%s.model must be fable, opus, sonnet or haiku, optionally with the exact suffix [1m]", prefix)
	}
	return nil
}
