package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/leasecheck"
	"agentbox/internal/untrusted"
)

// validateOutput is the --json result of a valid assignment.
type validateOutput struct {
	Valid          bool   `json:"valid"`
	AssignmentPath string `json:"assignment_path"`
	assignment.Summary
	ManagedLaunch launchReadiness `json:"managed_launch"`
}

type launchReadiness struct {
	Ready   bool   `json:"ready"`
	Refusal string `json:"refusal,omitempty"`
}

// refusalOutput is the --json result of a refused assignment.
type refusalOutput struct {
	Valid  bool   `json:"valid"`
	Error  string `json:"error"`
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason"`
}

func newValidate(env *Env) *cobra.Command {
	var asJSON, requireLaunch bool
	c := &cobra.Command{
		Use:   "validate ASSIGNMENT",
		Short: "Validate an assignment and every file it names",
		Long: `Validate the assignment at the absolute path ASSIGNMENT, stored directly in
its run directory /run/branchbox/managed/<run-id>/ (or $BRANCHBOX_MANAGED_ROOT/<run-id>/).

The document is decoded strictly (unknown fields, duplicate keys and trailing
data refused at every level) and checked against the rules of its version
("1", "2" or "3"); then every materialization is checked on disk without
following a symbolic link: modes, owners, types, link counts, sizes, SHA-256
digests and contents.

On success it prints a summary of the run and of each lease with its state and
liveness. It never prints a secret value, a capability, a digest or a source
path. A refusal names the field and the rule, never a value.

  --json            print the summary (or the refusal) as JSON on stdout
  --require-launch  also refuse an assignment a managed Dev Containers launch
                    would refuse (version 3, a workspace consumer distinct from
                    this runtime's uid and gid, preloaded service_images)

Exit status: 0 valid, 1 refused, 2 usage error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			checked, err := leasecheck.Load(args[0], loadOptions(env))
			if err != nil {
				return reportRefusal(env.Stdout, asJSON, err)
			}
			a := checked.Assignment
			launch := launchReadiness{Ready: true}
			if err := a.RequireManagedLaunch(env.Runtime); err != nil {
				launch = launchReadiness{Refusal: err.Error()}
				if requireLaunch {
					return reportRefusal(env.Stdout, asJSON, err)
				}
			}
			out := validateOutput{
				Valid:          true,
				AssignmentPath: checked.Path,
				Summary:        a.Summarize(env.Now()),
				ManagedLaunch:  launch,
			}
			if asJSON {
				return writeJSON(env.Stdout, out)
			}
			writeSummary(env.Stdout, &out)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	c.Flags().BoolVar(&requireLaunch, "require-launch", false, "refuse an assignment a managed launch would refuse")
	return c
}

func reportRefusal(w io.Writer, asJSON bool, err error) error {
	if !asJSON {
		return refused(err)
	}
	out := refusalOutput{Valid: false, Error: err.Error(), Reason: err.Error()}
	var ae *assignment.Error
	if errors.As(err, &ae) {
		out.Field, out.Reason = ae.Field, ae.Reason
	}
	if werr := writeJSON(w, out); werr != nil {
		return werr
	}
	return &exitError{code: ExitRefused}
}

// writeJSON prints v as indented JSON, with every C1 control and format
// character escaped (untrusted.EscapeJSON): a tool response is the
// endpoint's to write, and may echo the consumer's request.
func writeJSON(w io.Writer, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return &exitError{code: ExitRefused, msg: "cannot write output"}
	}
	if _, err := w.Write(append(untrusted.EscapeJSON(js), '\n')); err != nil {
		return &exitError{code: ExitRefused, msg: "cannot write output"}
	}
	return nil
}

func writeSummary(w io.Writer, out *validateOutput) {
	s := &out.Summary
	fmt.Fprintf(w, "valid: version %q assignment for run %s\n", s.Version, s.RunID)
	row := func(k, format string, args ...any) {
		fmt.Fprintf(w, "  %-19s %s\n", k, fmt.Sprintf(format, args...))
	}
	row("assignment lease", "%s", s.AssignmentLeaseID)
	row("outer runtime", "%s", s.OuterRuntimeID)
	row("workspace", "%s", s.Workspace)
	row("repository", "%s at %s", s.Repository.Path, s.Repository.Revision)
	row("task branch", "%s", s.TaskBranch)
	row("tunnel placement", "%s", s.TunnelPlacement)
	ports := make([]string, 0, len(s.PublishedPorts))
	for _, p := range s.PublishedPorts {
		ports = append(ports, fmt.Sprintf("%d->%d", p.Host, p.Runtime))
	}
	row("published ports", "%s", orNone(strings.Join(ports, ", ")))
	names := make([]string, 0, len(s.ServiceImages))
	for n := range s.ServiceImages {
		names = append(names, n)
	}
	sort.Strings(names)
	row("service images", "%s", orNone(strings.Join(names, ", ")))
	row("port proxy image", "%s", orNone(s.PortProxyImage))
	if c := s.WorkspaceConsumer; c != nil {
		row("workspace consumer", "uid %d gid %d", c.UID, c.GID)
	}
	if s.WorkspaceFolder != "" {
		row("workspace folder", "%s (omitted services: %s)", s.WorkspaceFolder, orNone(strings.Join(s.OmittedServices, ", ")))
	}
	if out.ManagedLaunch.Ready {
		row("managed launch", "ready")
	} else {
		row("managed launch", "not ready: %s", out.ManagedLaunch.Refusal)
	}
	fmt.Fprintf(w, "leases (%d):\n", len(s.Leases))
	for _, l := range s.Leases {
		var parts []string
		parts = append(parts, "consumer "+l.Consumer)
		if l.Executable != "" {
			parts = append(parts, "executable "+l.Executable)
		}
		if len(l.InheritedEnvironment) > 0 {
			parts = append(parts, "inherits "+strings.Join(l.InheritedEnvironment, " "))
		}
		if len(l.EnvironmentNames) > 0 {
			parts = append(parts, "binds "+strings.Join(l.EnvironmentNames, " "))
		}
		if len(l.Targets) > 0 {
			parts = append(parts, "targets "+strings.Join(l.Targets, " "))
		}
		if l.EndpointLeaseID != "" {
			parts = append(parts, fmt.Sprintf("endpoint %s, spool %s, consumer uid %d", l.EndpointLeaseID, l.RequestSpoolTarget, l.ConsumerUID))
		}
		if l.ReplayPolicy != "" {
			parts = append(parts, "replay "+l.ReplayPolicy)
		}
		if l.ExpiresAt != nil {
			parts = append(parts, "expires "+l.ExpiresAt.Format(time.RFC3339))
		}
		live := "live"
		if !l.Live {
			live = "expired"
		}
		fmt.Fprintf(w, "  %s [%s] state %s, %s; %s\n", l.LeaseID, l.Scope, l.State, live, strings.Join(parts, ", "))
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
