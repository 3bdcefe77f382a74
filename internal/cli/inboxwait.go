package cli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/inbox"
	"agentbox/internal/wire"
)

// Reconnect backoff of `inbox wait` after a dropped connection.
const (
	reconnectFirst = 100 * time.Millisecond
	reconnectMax   = 5 * time.Second
)

// busyGrace is how long wait retries a next answered busy: the broker
// frees a sandbox's park slot when it sees the previous waiter's
// connection close, which can trail that waiter's exit by a moment.
const busyGrace = 2 * time.Second

// DefaultTimeout is the default of --timeout for wait and send --wait.
const DefaultTimeout = 30 * time.Minute

var wakeValuePattern = regexp.MustCompile(`^[a-z][a-z_]{0,31}$`)

// parseWakeOn parses --wake-on: comma-separated msg:KIND and status:STATE
// entries; an entry without a prefix takes the previous entry's, so
// "msg:done,question,status:failed" wakes on done and question messages and
// failed statuses.
func parseWakeOn(spec string) (kinds, states []string, err error) {
	if spec == "" {
		return nil, nil, nil
	}
	prefix := ""
	for _, tok := range strings.Split(spec, ",") {
		if p, v, ok := strings.Cut(tok, ":"); ok {
			prefix, tok = p, v
		}
		if !wakeValuePattern.MatchString(tok) {
			return nil, nil, exitf(ExitUsage, "--wake-on: bad entry %q", truncateArg(tok))
		}
		switch prefix {
		case "msg":
			kinds = append(kinds, tok)
		case "status":
			switch tok {
			case wire.StateQueued, wire.StateStarted, wire.StateDone, wire.StateFailed, wire.StateRefused:
			default:
				return nil, nil, exitf(ExitUsage, "--wake-on: status %q is not one of queued, started, done, failed, refused", truncateArg(tok))
			}
			states = append(states, tok)
		default:
			return nil, nil, exitf(ExitUsage, "--wake-on entries are msg:KIND or status:STATE")
		}
	}
	return kinds, states, nil
}

func truncateArg(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

func newInboxWaitCmd() *cobra.Command {
	var wakeOn, quietAfter, timeout string
	c := &cobra.Command{
		Use:   "wait [--wake-on SPEC] [--quiet-after DUR] [--timeout DUR|none]",
		Short: "Wait until an unread inbox item arrives",
		Long: `Wait until the inbox holds an unread item that matches --wake-on, then print
it on one line (the item stays unread: 'jailbee inbox read ID' takes it).
Without --wake-on any unread item wakes.

  --wake-on SPEC      e.g. msg:done,question,blocked,idle,status:failed,status:refused
  --quiet-after DUR   also return (printing "quiet") when no inbox item of any
                      kind arrived for DUR
  --timeout DUR|none  give up after DUR (default 30m) with exit 3; none waits forever

A dropped connection is retried with backoff until the timeout (exit 4 if the
broker does not come back); a first connection that fails exits 4 at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kinds, states, err := parseWakeOn(wakeOn)
			if err != nil {
				return err
			}
			var quiet time.Duration
			if quietAfter != "" {
				if quiet, err = time.ParseDuration(quietAfter); err != nil || quiet <= 0 {
					return exitf(ExitUsage, "--quiet-after takes a positive duration")
				}
			}
			d, err := parseTimeout(timeout)
			if err != nil {
				return err
			}
			ctx, cancel := withTimeout(cmd.Context(), d)
			defer cancel()
			// wire.NextArgs's fields; a map sends every key (empty filters
			// as null), where the struct would omit them.
			args := map[string]any{"msg_kinds": kinds, "status_states": states, "quiet_after_ms": quiet.Milliseconds()}
			res, err := callNextRetrying(ctx, args)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if res.Quiet {
				fmt.Fprintf(out, "quiet: no inbox activity for %s\n", quietAfter)
				return nil
			}
			fmt.Fprintln(out, summary(res.Item, false))
			return nil
		},
	}
	c.Flags().StringVar(&wakeOn, "wake-on", "", "which items wake: msg:KIND,...,status:STATE,...")
	c.Flags().StringVar(&quietAfter, "quiet-after", "", "return after this long without any inbox activity")
	c.Flags().StringVar(&timeout, "timeout", DefaultTimeout.String(), "give up after this long (exit 3), or none")
	return c
}

// callNextRetrying parks a next until it answers. The first connection
// failing exits 4 at once; a connection that drops later is re-dialled with
// backoff until ctx ends (exit 4 if it never came back, 3 on timeout while
// connected).
func callNextRetrying(ctx context.Context, args any) (wire.NextResult, error) {
	path := socketPath()
	c, err := inbox.Dial(ctx, path)
	if err != nil {
		return wire.NextResult{}, unreachable(path, err)
	}
	backoff := reconnectFirst
	busyUntil := time.Now().Add(busyGrace)
	for {
		var res wire.NextResult
		err := c.Call(ctx, "next", args, &res)
		var we *wire.Error
		switch {
		case err == nil:
			c.Close()
			return res, nil
		case ctx.Err() != nil:
			c.Close()
			return wire.NextResult{}, exitf(ExitTimeout, "timed out waiting")
		case errors.As(err, &we) && we.Code == wire.CodeBusy && time.Now().Before(busyUntil):
			time.Sleep(reconnectFirst)
			continue
		case !errors.Is(err, inbox.ErrUnreachable):
			c.Close()
			return wire.NextResult{}, protocolExit(err)
		}
		c.Close()
		for {
			select {
			case <-ctx.Done():
				return wire.NextResult{}, exitf(ExitUnreachable, "the broker connection dropped and did not come back")
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, reconnectMax)
			if c, err = inbox.Dial(ctx, path); err == nil {
				break
			}
		}
	}
}
