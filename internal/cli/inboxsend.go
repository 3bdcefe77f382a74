package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"agentbox/internal/inbox"
	"agentbox/internal/wire"
)

func newInboxSendCmd(deps Deps) *cobra.Command {
	c := &cobra.Command{
		Use:   "send TYPE ...",
		Short: "Send a manifest to the broker and print its id",
		Long: `Send a manifest to the broker. stdout holds only the request id; a first
status of refused prints its reason on stderr and exits 1.

  --wait             wait for this manifest's status: exit 0 on done, queued or
                     started, 1 on refused or failed
  --timeout DUR|none with --wait (default 30m): exit 3 when no answer came in time`,
	}
	c.AddCommand(newSendMessageCmd())
	return c
}

// sendFlags are the flags every send form shares.
type sendFlags struct {
	id      string
	wait    bool
	timeout string
}

func (f *sendFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.id, "id", "", "manifest id (default: a new random id)")
	c.Flags().BoolVar(&f.wait, "wait", false, "wait for the manifest's status")
	c.Flags().StringVar(&f.timeout, "timeout", DefaultTimeout.String(), "with --wait: give up after this long (exit 3), or none")
}

// newManifestID returns PREFIX-<8 hex>.
func newManifestID(prefix string) string {
	var b [4]byte
	rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

func newSendMessageCmd() *cobra.Command {
	var f sendFlags
	var to, kind, replyTo, text string
	c := &cobra.Command{
		Use:   "message [--to C] [--kind K] [--reply-to ID] (--text T | stdin) [--wait] [--timeout DUR|none]",
		Short: "Send a message to a child (--to) or, from a child, to its orchestrator",
		Long: `Send a message. An orchestrator names the child with --to; a child omits --to
and the message goes to its orchestrator. --kind is note (default), question,
done or blocked. --reply-to takes the id of the inbox message you answer (its
h- id or its origin_id). The text comes from --text or, without it, stdin.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m := map[string]any{"version": 1, "type": "message"}
			if to != "" {
				m["to"] = to
			}
			if kind != "" {
				m["kind"] = kind
			}
			if replyTo != "" {
				m["in_reply_to"] = replyTo
			}
			var body *string
			if cmd.Flags().Changed("text") {
				m["body"] = text
			} else {
				data, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxStdinText+1))
				if err != nil {
					return exitf(ExitUsage, "cannot read the text from stdin")
				}
				if len(data) > maxStdinText {
					return exitf(ExitUsage, "text longer than %d bytes", maxStdinText)
				}
				s := string(data)
				body = &s
			}
			return runSend(cmd, f, "msg", m, body)
		},
	}
	f.add(c)
	c.Flags().StringVar(&to, "to", "", "the child's short name (orchestrators only)")
	c.Flags().StringVar(&kind, "kind", "", "note, question, done or blocked")
	c.Flags().StringVar(&replyTo, "reply-to", "", "id of the message you answer")
	c.Flags().StringVar(&text, "text", "", "message text (default: read stdin)")
	return c
}

// maxStdinText is the most text a send reads from stdin: the protocol's
// 65536-byte text cap.
const maxStdinText = 65536

// runSend completes the manifest (id; body_file when the text travels as
// the request body), sends it and handles the first status and --wait.
func runSend(cmd *cobra.Command, f sendFlags, idPrefix string, m map[string]any, body *string) error {
	id := f.id
	if id == "" {
		id = newManifestID(idPrefix)
	}
	m["id"] = id
	if body != nil {
		m["body_file"] = id + ".md"
	}
	d, err := parseTimeout(f.timeout)
	if err != nil {
		return err
	}
	ctx, cancel := withTimeout(cmd.Context(), d)
	defer cancel()
	c, err := dialInbox(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	manifest, err := json.Marshal(m)
	if err != nil {
		return err
	}
	args := map[string]any{"manifest": json.RawMessage(manifest)}
	if body != nil {
		args["body"] = *body
	}
	var st wire.StatusItem
	if err := c.Call(ctx, "send", args, &st); err != nil {
		if ctx.Err() != nil {
			return exitf(ExitTimeout, "no reply before the timeout; the request may or may not have run: check 'jailbee inbox status %s'", id)
		}
		return protocolExit(err)
	}
	out := cmd.OutOrStdout()
	fmt.Fprintln(out, id)
	if st.State == wire.StateRefused {
		return exitf(ExitFailed, "refused: %s", st.Detail)
	}
	if !f.wait {
		return nil
	}
	for st.State == wire.StateQueued {
		next, err := waitStatus(ctx, c, id)
		if err != nil {
			return err
		}
		st = next
	}
	fmt.Fprintf(out, "%s: %s\n", st.State, st.Detail)
	if st.State == wire.StateFailed {
		return &ExitError{Code: ExitFailed}
	}
	return nil
}

// waitStatus consumes the next status for ref.
func waitStatus(ctx context.Context, c *inbox.Client, ref string) (wire.StatusItem, error) {
	var res nextResult
	if err := c.Call(ctx, "next", map[string]any{"ref": ref, "ack": true}, &res); err != nil {
		if ctx.Err() != nil {
			return wire.StatusItem{}, exitf(ExitTimeout, "timed out waiting for the status of %s", ref)
		}
		return wire.StatusItem{}, protocolExit(err)
	}
	var st wire.StatusItem
	if err := json.Unmarshal(res.Item, &st); err != nil {
		return wire.StatusItem{}, protocolExit(inbox.ErrUnreachable)
	}
	return st, nil
}
