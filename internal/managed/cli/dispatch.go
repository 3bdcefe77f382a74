package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/managed/launch"
	"agentbox/internal/managed/spool"
	"agentbox/internal/untrusted"
)

// ExitNotPending is dispatch-tool's status when the wait ended with no
// request to dispatch: the only retryable status.
const ExitNotPending = 75

// dispatchOutput is dispatch-tool's --json object.
type dispatchOutput struct {
	Status    string          `json:"status"` // dispatched, not-pending, failed
	Retryable bool            `json:"retryable"`
	LeaseID   string          `json:"lease_id,omitempty"`
	RequestID string          `json:"request_id,omitempty"`
	Result    *dispatchResult `json:"result,omitempty"`
	Error     string          `json:"error,omitempty"`
}

type dispatchResult struct {
	RunID     string          `json:"run_id"`
	LeaseID   string          `json:"lease_id"`
	Consumer  string          `json:"consumer"`
	RequestID string          `json:"request_id"`
	Response  json.RawMessage `json:"response"`
	// Replayed: the response came from the ledger; the endpoint was not
	// contacted.
	Replayed bool `json:"replayed"`
}

func newFeatureDispatchTool(env *Env) *cobra.Command {
	var lease, id string
	var waitSeconds int
	var asJSON bool
	c := &cobra.Command{
		Use:   "dispatch-tool NAME --lease L --request-id R [--wait-seconds 0..300] [--json]",
		Short: "Relay one tool request from a feature's spool to its trusted endpoint",
		Long: `Dispatch tool request R of tool-request lease L in feature NAME's spool.

The consumer writes <spool>/requests/R.json (mode 0600, renamed into place);
branchbox moves it into the root-only .processing/ directory before reading
it, checks it again (a regular file of the consumer's with one link, 1 byte
to 256 KiB, at most 16 pending and 1 MiB in all), decodes the envelope
(exactly version, run_id, lease_id, consumer, request_id, capability,
payload), compares the ids and the capability, records a durable claim in its
ledger, relays the capability-free request to the endpoint socket, records
the correlated response durably, and writes <spool>/responses/R.json (the
consumer's, mode 0400).

The assignment is validated again first and must be the very bytes feature
start validated (code assignment_changed otherwise, or for a launch record
without their SHA-256).

A response already recorded for R is returned again without contacting the
endpoint. A relay interrupted earlier is retried only when the lease signs
replay_policy exact-digest-replay-v1; without it the claim stays blocked.

  --wait-seconds N  look again every 250 ms, and once more at the deadline,
                    for up to N seconds (0-300, default 0) while R is not
                    pending (and, under the replay policy, while the relay
                    fails in transport)
  --json            {"status":"dispatched","retryable":false,"result":{run_id,
                    lease_id,consumer,request_id,response,replayed}}; when
                    nothing was pending: {"status":"not-pending",
                    "retryable":true,"lease_id","request_id"}; otherwise
                    {"status":"failed","retryable":false,...,"error"}

Messages never hold the capability or the payload.

Exit status: 0 dispatched; 75 not pending when the wait ended, or still
held by another dispatch of R (retryable); 1 any other failure (terminal);
2 usage error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if waitSeconds < 0 || waitSeconds > spool.MaxWaitSeconds {
				return usage("--wait-seconds must be 0 to %d", spool.MaxWaitSeconds)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := launch.DispatchTool(ctx, launchConfig(env), args[0], lease, id, time.Duration(waitSeconds)*time.Second)
			if err != nil {
				return dispatchFailure(env, asJSON, lease, id, err)
			}
			out := dispatchOutput{Status: "dispatched", Result: &dispatchResult{
				RunID: res.IDs.RunID, LeaseID: res.IDs.LeaseID, Consumer: res.IDs.Consumer, RequestID: res.IDs.RequestID,
				Response: res.Response.Payload, Replayed: res.Cached,
			}}
			if asJSON {
				return writeJSON(env.Stdout, out)
			}
			how := "relayed"
			if res.Cached {
				how = "replayed from the ledger"
			}
			fmt.Fprintf(env.Stdout, "dispatched %s (%s)\n%s\n", id, how, untrusted.EscapeJSON(res.Response.Payload))
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&lease, "lease", "", "the tool-request lease (required)")
	f.StringVar(&id, "request-id", "", "the request id (required)")
	f.IntVar(&waitSeconds, "wait-seconds", 0, "wait up to this many seconds (0-300)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	_ = c.MarkFlagRequired("lease")
	_ = c.MarkFlagRequired("request-id")
	return c
}

// dispatchFailure reports a failed dispatch: 75 only when nothing was
// pending, 1 otherwise.
func dispatchFailure(env *Env, asJSON bool, lease, id string, err error) error {
	var le *launch.Error
	notPending := errors.As(err, &le) && le.Code == launch.CodeNotPending
	if le != nil && le.Code == launch.CodeUsage {
		return launchFailure(env, asJSON, err)
	}
	code := ExitRefused
	out := dispatchOutput{Status: "failed", LeaseID: lease, RequestID: id, Error: err.Error()}
	if notPending {
		code = ExitNotPending
		out = dispatchOutput{Status: "not-pending", Retryable: true, LeaseID: lease, RequestID: id}
	}
	if asJSON {
		if werr := writeJSON(env.Stdout, out); werr != nil {
			return werr
		}
		return &exitError{code: code}
	}
	return &exitError{code: code, msg: err.Error()}
}
