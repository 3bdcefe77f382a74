package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/untrusted"
	"agentbox/internal/wire"
)

func newOutboxCmd(Deps) *cobra.Command {
	c := &cobra.Command{
		Use:   "outbox",
		Short: "See and resolve what orchestrators published",
		Long: `See what orchestrators published from their outboxes, and settle an action whose
outcome is uncertain. Every proposal is named SANDBOX/OUTBOX/NAME (outbox issue
or pr). Its journal, kept in the broker's state dir, records each action as
prepared (sent, no answer yet), applied (with its URL), uncertain (it may
have been applied: a timeout, a lost connection, a 5xx, a broker stopped
mid-call) or failed (the forge refused it). A proposal with an uncertain
action publishes nothing more until a person resolves it; nothing is ever
retried by itself. See docs/publish.md.`,
		RunE: groupUsage,
	}
	c.AddCommand(newOutboxLsCmd(), newOutboxShowCmd(), newOutboxResolveCmd())
	return c
}

func newOutboxLsCmd() *cobra.Command {
	var state string
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List publish proposals and their state",
		Long: `List every publish proposal: its name (SANDBOX/OUTBOX/NAME), state (running,
done, failed or blocked: an action is uncertain), the publish manifest that
reports it, how many of its actions were applied, and when it last changed.
Proposals not done come first. --json prints {"proposals": [...]} with each
journal as stored but without its proposal (outbox show --json has it), and
"more": true when there were more than one answer holds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var list wire.OutboxList
			if err := adminCall(cmd.Context(), state, "outbox-ls", nil, &list); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, list)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PROPOSAL\tSTATE\tMANIFEST\tAPPLIED\tUPDATED")
			for _, j := range list.Proposals {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\n", untrusted.Printable(j.Key()), untrusted.Printable(j.State), untrusted.Printable(j.Ref), applied(j), len(j.Actions),
					time.UnixMilli(j.Updated).UTC().Format(time.RFC3339))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if list.More {
				fmt.Fprintln(out, "(more proposals than one answer holds, done ones last: every journal is under the broker state dir, publish/)")
			}
			return nil
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func applied(j wire.OutboxJournal) int {
	n := 0
	for _, a := range j.Actions {
		if a.State == "applied" {
			n++
		}
	}
	return n
}

func newOutboxShowCmd() *cobra.Command {
	var state string
	var asJSON bool
	c := &cobra.Command{
		Use:   "show SANDBOX/OUTBOX/NAME [--json]",
		Short: "Show a publish proposal's actions",
		Long: `Show one proposal: each action with its state, URL, issue number and, for a
failed or uncertain one, the forge's message. --json prints the journal as
stored, the canonical proposal included unless it is too large for one
answer (then null).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var j wire.OutboxJournal
			if err := adminCall(cmd.Context(), state, "outbox-show", wire.OutboxArgs{Key: args[0]}, &j); err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), j)
			}
			printJournal(cmd.OutOrStdout(), j)
			return nil
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func printJournal(w io.Writer, j wire.OutboxJournal) {
	fmt.Fprintf(w, "%s: %s (manifest %s)\n", untrusted.Printable(j.Key()), untrusted.Printable(j.State), untrusted.Printable(j.Ref))
	for i, a := range j.Actions {
		st := a.State
		if st == "" {
			st = "not tried"
		}
		fmt.Fprintf(w, "  %d. %s: %s", i+1, untrusted.Printable(a.Kind), untrusted.Printable(st))
		if a.Number > 0 {
			fmt.Fprintf(w, " #%d", a.Number)
		}
		if a.URL != "" {
			fmt.Fprintf(w, " %s", untrusted.Printable(a.URL))
		}
		if a.Detail != "" {
			fmt.Fprintf(w, " (%s)", untrusted.Printable(a.Detail)) // the forge's text
		}
		fmt.Fprintln(w)
	}
}

func newOutboxResolveCmd() *cobra.Command {
	var state, url string
	var appliedFlag, retry bool
	c := &cobra.Command{
		Use:   "resolve SANDBOX/OUTBOX/NAME (--applied --url URL | --retry)",
		Short: "Settle a proposal's uncertain action",
		Long: `Settle the uncertain action of a blocked proposal, after looking on the forge
whether it was applied:

  --applied --url URL  it was: record it applied with URL (the issue, comment,
                       pull request or review you found)
  --retry              it was not: send it once more

Either way the proposal then continues with its actions not applied, and the
orchestrator gets a started status and then done or failed for its publish
manifest. A retried action that is uncertain again blocks the proposal again.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if appliedFlag == retry {
				return exitf(ExitUsage, "give exactly one of --applied --url URL or --retry")
			}
			if appliedFlag != (url != "") {
				return exitf(ExitUsage, "--url goes with --applied")
			}
			var j wire.OutboxJournal
			a := wire.OutboxArgs{Key: args[0], Applied: appliedFlag, URL: url, Retry: retry}
			if err := adminCall(cmd.Context(), state, "outbox-resolve", a, &j); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "resolved %s: publishing continues (manifest %s)\n", j.Key(), j.Ref)
			return nil
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&appliedFlag, "applied", false, "the uncertain action was applied")
	c.Flags().StringVar(&url, "url", "", "with --applied: the URL of what was applied")
	c.Flags().BoolVar(&retry, "retry", false, "the uncertain action was not applied: send it once more")
	return c
}
