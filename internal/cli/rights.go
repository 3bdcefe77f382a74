package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"agentbox/internal/wire"
)

func newRightsCmd(deps Deps) *cobra.Command {
	var state string
	var asJSON bool
	var a wire.RightsArgs
	c := &cobra.Command{
		Use:   "rights NAME [--json] [--add-mount M]... [--add-egress H]... [--loose] [--remove-mount M]... [--remove-egress H]... [--remove-loose]",
		Short: "Show a sandbox's rights; add or remove rights by hand",
		Long: `Show a sandbox's rights: each item (a mount of broker.yaml's mounts, loose,
or an egress host), who gave it (orchestration: a spawn or a rights
manifest; hand: this command) and when it expires.

--add-mount, --add-egress and --loose add rights by hand: they never expire,
and an orchestrator's revoke leaves them ("<item> was not given by
orchestration; left as is"). A mount is attached at once to a running
sandbox (at /mnt/jailbee/NAME) and at every start. --remove-mount,
--remove-egress and --remove-loose remove an item, whoever gave it; a
removed mount is detached at once. Removals apply before additions.

--json prints {rights: [{kind, item, owner, expires_at}], notes}; expires_at
is "" for a right that does not expire.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandbox(&state, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			a.Name = args[0]
			var res wire.RightsResult
			if err := adminCall(cmd.Context(), state, "rights", a, &res); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, res)
			}
			for _, n := range res.Notes {
				fmt.Fprintln(cmd.ErrOrStderr(), n)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tITEM\tOWNER\tEXPIRES")
			for _, r := range res.Rights {
				item, exp := r.Item, r.ExpiresAt
				if item == "" {
					item = "-"
				}
				if exp == "" {
					exp = "(no expiry)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Kind, item, r.Owner, exp)
			}
			return tw.Flush()
		},
	}
	addStateFlag(c, &state)
	f := c.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringArrayVar(&a.Add.Mounts, "add-mount", nil, "add a mount of broker.yaml's mounts by hand (repeatable)")
	f.StringArrayVar(&a.Add.Egress, "add-egress", nil, "add an egress host (or *.domain) by hand (repeatable)")
	f.BoolVar(&a.Add.Loose, "loose", false, "add loose by hand")
	f.StringArrayVar(&a.Remove.Mounts, "remove-mount", nil, "remove a mount right (repeatable)")
	f.StringArrayVar(&a.Remove.Egress, "remove-egress", nil, "remove an egress right (repeatable)")
	f.BoolVar(&a.Remove.Loose, "remove-loose", false, "remove loose")
	return c
}
