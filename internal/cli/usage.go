package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"agentbox/internal/wire"
)

func newUsageCmd(deps Deps) *cobra.Command {
	var state string
	var asJSON bool
	c := &cobra.Command{
		Use:   "usage [NAME] [--json]",
		Short: "Show each sandbox's model usage: requests and tokens",
		Long: `Show the model usage of each sandbox: every successful Messages API response
its model socket passed on counts one request and the tokens the upstream
reported in that response's usage (input, output, cache read, cache write),
as reported, not estimated. A response is recorded once, when it ends (a
stream cut short counts what it reported up to then), and durably: the
counts survive a broker restart.

One row per sandbox, then one TOTAL line per orchestrator tree: the
orchestrator and its children. A destroyed sandbox keeps its row (marked
"(destroyed)"), so a tree's total stays true; a name used again gets a row
of its own.

NAME shows that sandbox's rows, and for an orchestrator its whole tree; a
TOTAL line is always the whole tree's.

--json prints an array of {name, uuid, tree, requests, input_tokens,
output_tokens, cache_read_input_tokens, cache_creation_input_tokens,
destroyed, updated}, without the totals.`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: completeSandbox(&state, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			var a wire.UsageArgs
			if len(args) == 1 {
				a.Name = args[0]
			}
			var res wire.UsageResult
			if err := adminCall(cmd.Context(), state, "usage", a, &res); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if res.Rows == nil {
					res.Rows = []wire.UsageRow{}
				}
				return writeJSON(out, res.Rows)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTREE\tREQUESTS\tINPUT\tOUTPUT\tCACHE READ\tCACHE WRITE")
			line := func(name, tree string, u wire.Usage) {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", name, tree, u.Requests, u.InputTokens, u.OutputTokens,
					u.CacheReadInputTokens, u.CacheCreationInputTokens)
			}
			for _, r := range res.Rows {
				name := r.Name
				if r.Destroyed {
					name += " (destroyed)"
				}
				line(name, r.Tree, r.Usage)
			}
			// TOTAL cannot be a sandbox's name: names are lowercase.
			for _, t := range res.Trees {
				line("TOTAL", t.Tree, t.Usage)
			}
			return tw.Flush()
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// humanCount is a count in at most five characters: 950, 12.3k, 4.1M.
func humanCount(n int64) string {
	if n < 1000 {
		return fmt.Sprint(n)
	}
	const units = "kMGT"
	v, i := float64(n)/1000, 0
	// Rounded to one decimal it must stay below 1000: 999 950 is 1.0M.
	for v >= 999.95 && i < len(units)-1 {
		v /= 1000
		i++
	}
	return fmt.Sprintf("%.1f%c", v, units[i])
}
