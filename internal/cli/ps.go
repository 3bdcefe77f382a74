package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"agentbox/internal/wire"
)

func newPsCmd(deps Deps) *cobra.Command {
	var state string
	var asJSON bool
	c := &cobra.Command{
		Use:   "ps NAME [--json]",
		Short: "Show a sandbox's services and their state",
		Long: `Show every service of a sandbox's repository config (.jailbee/config.yaml,
services) and its state, as tmux inside the sandbox tells it: running (with
its pid inside the sandbox), exited (with its exit code, or "signal" when a
signal ended it) or not started. SELECTED is yes for the services the
sandbox's starts run: those of its autostart profile, or its explicit
services, with their dependencies. A sandbox that does not run shows every
service not started.

Each service runs in its own window of the sandbox's tmux session, named
after it; its output is kept, bounded, in ~/.jailbee/services/NAME.log in
the sandbox (its current run).

--json prints an array of {name, selected, state, pid, exit_code}; pid only
when running, exit_code only when exited with one.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSandbox(&state, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			var res wire.PsResult
			if err := adminCall(cmd.Context(), state, "ps", wire.NameArgs{Name: args[0]}, &res); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if res.Services == nil {
				res.Services = []wire.ServiceInfo{}
			}
			if asJSON {
				return writeJSON(out, res.Services)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SERVICE\tSELECTED\tSTATE")
			for _, s := range res.Services {
				selected := "no"
				if s.Selected {
					selected = "yes"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, selected, serviceState(s))
			}
			return tw.Flush()
		},
	}
	addStateFlag(c, &state)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// serviceState is a service's state for a person.
func serviceState(s wire.ServiceInfo) string {
	switch {
	case s.State == "running" && s.PID > 0:
		return fmt.Sprintf("running (pid %d)", s.PID)
	case s.State == "exited" && s.ExitCode != nil:
		return fmt.Sprintf("exited (code %d)", *s.ExitCode)
	case s.State == "exited":
		return "exited (signal)"
	}
	return s.State
}
