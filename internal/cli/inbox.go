package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/grant"
	"agentbox/internal/inbox"
	"agentbox/internal/untrusted"
	"agentbox/internal/wire"
)

func newInboxCmd(deps Deps) *cobra.Command {
	c := &cobra.Command{
		Use:   "inbox",
		Short: "Talk to the orchestration broker from inside a sandbox",
		Long: `The inbox client, for agents inside sandboxes. It connects to
/run/jailbee/orchestration/broker.sock (override with $JAILBEE_ORCHESTRATION_SOCKET).
On the host, where that socket does not exist, run it in a sandbox:
jb exec NAME -- jailbee inbox ...

Exit statuses: 0 success; 1 refused or failed; 2 usage error; 3 timeout;
4 broker unreachable (socket missing, connection refused or dropped without
an answer) or protocol version mismatch.`,
		RunE: groupUsage,
	}
	c.AddCommand(newInboxLsCmd(), newInboxReadCmd(), newInboxWaitCmd(), newInboxSendCmd(deps),
		newInboxStatusCmd(), newInboxGrantCmd(), newInboxChildrenCmd(), newInboxRunnersCmd())
	return c
}

// groupUsage answers a command group run without a known subcommand:
// exit 2 with the list of subcommands.
func groupUsage(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return exitf(ExitUsage, "unknown command %q for '%s' (see '%s --help')", truncateArg(args[0]), cmd.CommandPath(), cmd.CommandPath())
	}
	return exitf(ExitUsage, "'%s' needs a subcommand (see '%s --help')", cmd.CommandPath(), cmd.CommandPath())
}

// defaultSocket is where the inbox client looks for its broker without
// $JAILBEE_ORCHESTRATION_SOCKET: inbox.DefaultSocket, unless a test
// replaced it.
var defaultSocket = inbox.DefaultSocket

// SetDefaultSocketForTest replaces the default broker socket path (the
// override $JAILBEE_ORCHESTRATION_SOCKET still wins) and returns a restore
// function.
func SetDefaultSocketForTest(path string) (restore func()) {
	old := defaultSocket
	defaultSocket = path
	return func() { defaultSocket = old }
}

// socketPath is $JAILBEE_ORCHESTRATION_SOCKET, else defaultSocket.
func socketPath() string {
	if p := os.Getenv(inbox.SocketEnv); p != "" {
		return p
	}
	return defaultSocket
}

// dialInbox connects to the sandbox's broker socket (exit 4 on failure).
func dialInbox(ctx context.Context) (*inbox.Client, error) {
	path := socketPath()
	c, err := inbox.Dial(ctx, path)
	if err != nil {
		return nil, unreachable(path, err)
	}
	return c, nil
}

// unreachable is the exit-4 error for a first connection to path that
// failed. The default socket missing (ENOENT) with no override set means
// the client runs where no broker socket is mounted, most likely on the
// host: say where it belongs. A socket that exists but refuses
// connections, or an override, keeps the plain message.
func unreachable(path string, err error) error {
	if os.Getenv(inbox.SocketEnv) == "" && path == defaultSocket {
		if _, serr := os.Stat(path); errors.Is(serr, fs.ErrNotExist) {
			return exitf(ExitUnreachable, "jailbee inbox runs inside a sandbox: no broker socket at %s (from the host, run it in a sandbox: jb exec NAME -- jailbee inbox ...)", path)
		}
	}
	return exitf(ExitUnreachable, "cannot reach the broker: %v", err)
}

// inboxCall runs one op on a fresh connection.
func inboxCall(ctx context.Context, op string, args any) (json.RawMessage, error) {
	c, err := dialInbox(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	raw, err := c.CallRaw(ctx, op, args)
	if err != nil {
		return nil, protocolExit(err)
	}
	return raw, nil
}

// item is the union of inbox item fields, for display.
type item struct {
	ID          string  `json:"id"`
	Type        string  `json:"type"`
	From        string  `json:"from"`
	Kind        string  `json:"kind"`
	Body        string  `json:"body"`
	InReplyTo   *string `json:"in_reply_to"`
	OriginID    string  `json:"origin_id"`
	Ref         string  `json:"ref"`
	State       string  `json:"state"`
	Detail      string  `json:"detail"`
	ImportedRef string  `json:"imported_ref"`
	ImportError string  `json:"import_error"`
}

// summaryLen bounds the first line shown by ls and wait.
const summaryLen = 80

// firstLine is s's first line, cut at summaryLen bytes, with every
// character a terminal acts on blanked: a body or detail is another
// sandbox's text, and a summary is only a view of it (read shows it whole).
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > summaryLen {
		s = s[:summaryLen] + "..."
	}
	return untrusted.Printable(s)
}

// summary is one line per item for ls and wait.
func summary(raw json.RawMessage, read bool) string {
	var it item
	json.Unmarshal(raw, &it)
	mark := ""
	if read {
		mark = " (read)"
	}
	if it.Type == wire.ItemStatus {
		return fmt.Sprintf("%s  status   %s  %s: %s%s", untrusted.Printable(it.ID), untrusted.Printable(it.Ref), untrusted.Printable(it.State), firstLine(it.Detail), mark)
	}
	extra := ""
	switch {
	case it.ImportError != "":
		extra = " [import failed]"
	case it.ImportedRef != "":
		extra = " [imported]"
	}
	return fmt.Sprintf("%s  message  from %s  %s: %s%s%s", untrusted.Printable(it.ID), untrusted.Printable(it.From), untrusted.Printable(it.Kind), firstLine(it.Body), extra, mark)
}

func newInboxLsCmd() *cobra.Command {
	var all, asJSON bool
	c := &cobra.Command{
		Use:   "ls [--all] [--json]",
		Short: "List unread inbox items (--all: read history too)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := inboxCall(cmd.Context(), "list", wire.ListArgs{All: all})
			if err != nil {
				return err
			}
			var res wire.ListResult
			if err := json.Unmarshal(raw, &res); err != nil {
				return protocolExit(inbox.ErrUnreachable)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, res.Items)
			}
			read := map[string]bool{}
			for _, id := range res.ReadIDs {
				read[id] = true
			}
			for _, it := range res.Items {
				var head item
				json.Unmarshal(it, &head)
				fmt.Fprintln(out, summary(it, read[head.ID]))
			}
			if res.More {
				fmt.Fprintln(cmd.ErrOrStderr(), "more items than one reply holds: read some, then ls again")
			}
			return nil
		},
	}
	c.Flags().BoolVar(&all, "all", false, "include read items")
	c.Flags().BoolVar(&asJSON, "json", false, "print the items as JSON, bodies and details whole (the list cuts them to one line)")
	return c
}

func newInboxReadCmd() *cobra.Command {
	var keep, asJSON bool
	c := &cobra.Command{
		Use:   "read ID [--keep] [--json]",
		Short: "Show an unread item and mark it read (--keep leaves it unread)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := inboxCall(cmd.Context(), "read", wire.ReadArgs{ID: args[0], Keep: keep})
			if err != nil {
				return err
			}
			return printItem(cmd.OutOrStdout(), raw, asJSON)
		},
	}
	c.Flags().BoolVar(&keep, "keep", false, "leave the item unread")
	c.Flags().BoolVar(&asJSON, "json", false, "print the item as JSON")
	return c
}

// printItem prints every field of an item: as JSON, or one "key: value"
// per line with the body last. A value is another sandbox's text (a
// detail quotes what it sent, an import error what its branch held), so
// each of its lines is made printable; the body alone is printed as
// sent (docs/protocol.md: an agent may need it exactly; --json escapes it).
func printItem(w io.Writer, raw json.RawMessage, asJSON bool) error {
	if asJSON {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return protocolExit(inbox.ErrUnreachable)
		}
		buf.WriteByte('\n')
		_, err := w.Write(untrusted.EscapeJSON(buf.Bytes()))
		return err
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return protocolExit(inbox.ErrUnreachable)
	}
	order := []string{"id", "type", "from", "kind", "ref", "state", "detail", "in_reply_to", "origin_id",
		"imported_ref", "imported_sha", "import_error", "on_done", "on_done_reason", "merged_head"}
	for _, k := range order {
		v, ok := fields[k]
		if !ok {
			continue
		}
		if v == nil {
			v = "null"
		}
		fmt.Fprintf(w, "%s: %s\n", k, untrusted.PrintableLines(fmt.Sprint(v)))
	}
	if body, ok := fields["body"].(string); ok {
		fmt.Fprintf(w, "\n%s\n", body)
	}
	return nil
}

func newInboxStatusCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "status [REF] [--json]",
		Short: "Show the latest status of your manifests (or of REF)",
		Long: `Show the latest status of each manifest you sent, or of the manifest REF.
Read from the broker's last completed round, so a status may trail by about a
second. The list shows the first line of each detail, cut at 80 characters;
REF, and --json, show details whole.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var a wire.StatusArgs
			if len(args) == 1 {
				a.Ref = args[0]
			}
			raw, err := inboxCall(cmd.Context(), "status", a)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(args) == 1 {
				if asJSON {
					return printItem(out, raw, true)
				}
				var st wire.StatusItem
				json.Unmarshal(raw, &st)
				fmt.Fprintf(out, "%s  %s: %s\n", untrusted.Printable(st.Ref), untrusted.Printable(st.State), untrusted.PrintableLines(st.Detail))
				return nil
			}
			var res wire.StatusResult
			json.Unmarshal(raw, &res)
			if asJSON {
				return writeJSON(out, res.Statuses)
			}
			for _, s := range res.Statuses {
				var st wire.StatusItem
				json.Unmarshal(s, &st)
				fmt.Fprintf(out, "%s  %s: %s\n", untrusted.Printable(st.Ref), untrusted.Printable(st.State), firstLine(st.Detail))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newInboxGrantCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "grant [--json]",
		Short: "Show this orchestrator's effective grant",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := inboxCall(cmd.Context(), "grant", nil)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			var g grant.Grant
			if asJSON || json.Unmarshal(raw, &g) != nil {
				return printItem(out, raw, true)
			}
			fmt.Fprintf(out, "max_running_children: %d\noperations: %s\ngrantable mounts: %s\ngrantable loose: %v\ngrantable egress: %s\n",
				g.MaxRunningChildren, strings.Join(g.Operations, ", "), listOrNone(g.Grantable.Mounts), g.Grantable.Loose, listOrNone(g.Grantable.Egress))
			printPublishRights(out, g.Publish)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the grant document")
	return c
}

// printPublishRights prints a grant's publish rights, "none" when it
// has none.
func printPublishRights(out io.Writer, p *grant.Publish) {
	if p == nil {
		fmt.Fprintln(out, "publish: none")
		return
	}
	repos, actions := "none", "none"
	if p.Issues != nil {
		repos, actions = listOrNone(p.Issues.Repos), listOrNone(p.Issues.Actions)
	}
	fmt.Fprintf(out, "publish issues repos: %s\npublish issues actions: %s\npublish pull_requests: %v\npublish pr_reviews: %v\n",
		repos, actions, p.PullRequests, p.PRReviews)
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

func newInboxChildrenCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "children [--json]",
		Short: "List this orchestrator's children",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := inboxCall(cmd.Context(), "children", nil)
			if err != nil {
				return err
			}
			var res wire.ChildrenResult
			json.Unmarshal(raw, &res)
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, res.Children)
			}
			for _, ch := range res.Children {
				fmt.Fprintf(out, "%s  %s  %s\n", untrusted.Printable(ch.Name), untrusted.Printable(ch.State), untrusted.Printable(ch.Branch))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// parseTimeout parses DUR or "none" (0 = no deadline).
func parseTimeout(s string) (time.Duration, error) {
	if s == "none" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, exitf(ExitUsage, "--timeout takes a positive duration such as 30m, or none")
	}
	return d, nil
}

func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d == 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
