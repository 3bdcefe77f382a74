package cli

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"agentbox/internal/config"
	"agentbox/internal/grant"
	"agentbox/internal/orchestrate"
)

// tierOrder is the order models are listed in.
var tierOrder = []string{"fable", "opus", "sonnet", "haiku"}

// RunnerLine is one runner `inbox runners` lists.
type RunnerLine struct {
	Agent   string   `json:"agent"`
	Profile string   `json:"profile,omitempty"`
	Models  []string `json:"models"`
}

// RunnersResult is `inbox runners --json`.
type RunnersResult struct {
	// DefaultAgent is what omitting the runner starts: the grant's default
	// runner's agent, else the repo's default agent; "" when unknown.
	DefaultAgent  string        `json:"default_agent"`
	DefaultRunner *grant.Runner `json:"default_runner"`
	Runners       []RunnerLine  `json:"runners"`
}

func newInboxRunnersCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "runners [--json]",
		Short: "List the runners a spawn or restart may name, and what omitting one starts",
		Long: `List the runners you may name (--agent/--profile/--model) and what omitting a
runner starts. Reads your grant from the broker, then this repository's
.jailbee/config.yaml. Text form:

  default: omit runner (<agent>)      (<agent> is unknown when none is configured)
  claude: fable, opus, sonnet, haiku
  claude-jb -P <profile>: <its models>`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := inboxCall(cmd.Context(), "grant", nil)
			if err != nil {
				return err
			}
			g, err := grant.Parse(raw)
			if err != nil {
				return exitf(ExitFailed, "the broker's grant is not a grant document")
			}
			repo := config.Default()
			if cwd, err := os.Getwd(); err == nil {
				if root := repoRoot(cwd); root != "" {
					if repo, err = orchestrate.LoadRepoConfig(root); err != nil {
						return exitf(ExitFailed, "%v", err)
					}
				}
			}
			res := listRunners(g, repo)
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, res)
			}
			def := res.DefaultAgent
			if def == "" {
				def = "unknown"
			}
			fmt.Fprintf(out, "default: omit runner (%s)\n", def)
			for _, r := range res.Runners {
				name := r.Agent
				if r.Profile != "" {
					name += " -P " + r.Profile
				}
				fmt.Fprintf(out, "%s: %s\n", name, strings.Join(r.Models, ", "))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// listRunners computes what `inbox runners` shows: every runner the repo
// config would accept.
func listRunners(g grant.Grant, repo *config.Repo) RunnersResult {
	res := RunnersResult{DefaultRunner: g.DefaultRunner, Runners: []RunnerLine{}}
	switch {
	case g.DefaultRunner != nil:
		res.DefaultAgent = g.DefaultRunner.Agent
	case repo.DefaultAgent != "":
		res.DefaultAgent = repo.DefaultAgent
	}
	if repo.CheckRunner(grant.Runner{Agent: grant.AgentClaude}) == nil {
		res.Runners = append(res.Runners, RunnerLine{Agent: grant.AgentClaude, Models: slices.Clone(tierOrder)})
	}
	profiles := make([]string, 0, len(repo.LiteLLM.Profiles))
	for p := range repo.LiteLLM.Profiles {
		profiles = append(profiles, p)
	}
	sort.Strings(profiles)
	for _, p := range profiles {
		var models []string
		for _, tier := range tierOrder {
			if repo.CheckRunner(grant.Runner{Agent: grant.AgentClaudeJB, Profile: p, Model: tier}) == nil {
				models = append(models, tier)
			}
		}
		if len(models) > 0 {
			res.Runners = append(res.Runners, RunnerLine{Agent: grant.AgentClaudeJB, Profile: p, Models: models})
		}
	}
	return res
}
