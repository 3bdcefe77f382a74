package cli

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"agentbox/internal/manifest"
	"agentbox/internal/untrusted"
	"agentbox/internal/wire"
)

func newInboxSendCmd(deps Deps) *cobra.Command {
	c := &cobra.Command{
		Use:   "send TYPE ...",
		Short: "Send a manifest to the broker and print its id",
		Long: `Send a manifest to the broker. stdout holds only the request id; a first
status of refused prints its reason on stderr and exits 1.

The text of message, spawn and restart (--text, --file or stdin) is at most
65536 bytes of UTF-8, whatever its source: longer text, or text that is not
UTF-8, exits 2 before any id is printed or the broker is contacted.

  --wait             print this manifest's first status after the id (state:
                     detail): exit 0 on done, queued or started, 1 on refused or
                     failed; later statuses come to the inbox. A queued spawn
                     or restart returns at once: its detail names its place
                     and the children that hold the slots
  --timeout DUR|none with --wait (default 30m): exit 3 when no answer came in time`,
		RunE: groupUsage,
	}
	c.AddCommand(newSendMessageCmd(), newSendSpawnCmd(), newSendImportCmd(), newSendUpdateCmd(),
		newSendRestartCmd(), newSendRefreshCmd(), newSendStopCmd(), newSendDestroyCmd(),
		newSendRightsCmd(), newSendPublishCmd())
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
	c.Flags().BoolVar(&f.wait, "wait", false, "print the manifest's first status (exit 0 on done, queued, started)")
	c.Flags().StringVar(&f.timeout, "timeout", DefaultTimeout.String(), "with --wait: give up after this long (exit 3), or none")
}

// newManifestID returns PREFIX-<8 hex>.
func newManifestID(prefix string) string {
	var b [4]byte
	rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// runSend sends a manifest built by a send form: it picks the id, encodes
// the manifest (text from stdin or a file travels as the request body),
// prints the id, and handles the first status and --wait.
func runSend(cmd *cobra.Command, f sendFlags, m *manifest.Manifest) error {
	if m.ID == "" {
		m.ID = f.id
	}
	if m.ID == "" {
		m.ID = newManifestID(idPrefix(m.Type))
	}
	m.Version = max(m.Version, 1)
	setTextLabel(m)
	raw, body, err := m.Encode()
	if err != nil {
		return exitf(ExitUsage, "%v", err)
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
	// The shape of wire.SendArgs, kept a map so the request's keys go out
	// sorted ("body" before "manifest"), as the send forms' tests pin them.
	args := map[string]any{"manifest": json.RawMessage(raw)}
	if body != nil {
		args["body"] = *body
	}
	id := m.ID
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
		return exitf(ExitFailed, "refused: %s", untrusted.PrintableLines(st.Detail))
	}
	if !f.wait {
		return nil
	}
	// The first status is the answer, queued too: a queued spawn may wait
	// for a slot as long as a child holds it, and its detail says which.
	fmt.Fprintf(out, "%s: %s\n", untrusted.Printable(st.State), untrusted.PrintableLines(st.Detail))
	if st.State == wire.StateFailed {
		return &ExitError{Code: ExitFailed}
	}
	return nil
}
