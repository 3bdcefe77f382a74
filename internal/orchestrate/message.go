package orchestrate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"agentbox/internal/manifest"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// Message is a validated message manifest.
type Message struct {
	ID        string
	To        string // child short name; "" from a child (goes to its orchestrator)
	Kind      string
	Body      string
	InReplyTo *string
}

// SendMessage delivers a message: orchestrator to its child (`to`), or a
// child to its orchestrator. Delivery goes to the store whether or not the
// recipient is running; the first status is done "delivered to <name>".
func (o *Orchestrator) SendMessage(ctx context.Context, req wire.Caller, m Message) (store.Sent, error) {
	var to string
	switch req.Role {
	case wire.RoleOrchestrator:
		child, err := o.childOf(ctx, req, m.To)
		if err != nil {
			return store.Sent{}, err
		}
		to = child.Name
	case wire.RoleChild:
		if m.Kind == manifest.MsgDone {
			return o.childDone(ctx, req, m)
		}
		parent, err := o.Store.Sandbox(ctx, req.Parent)
		if errors.Is(err, store.ErrNotFound) {
			return store.Sent{}, refusef("your orchestrator `%s` no longer exists", req.Parent)
		}
		if err != nil {
			return store.Sent{}, err
		}
		to = parent.Name
	default:
		return store.Sent{}, refusef("only orchestrators and children may send messages")
	}
	sent, err := o.Store.DeliverMessage(ctx, store.Delivery{
		From: req.Sandbox, To: to, ManifestID: m.ID, Kind: m.Kind, Body: m.Body, InReplyTo: m.InReplyTo,
	})
	if err != nil {
		return sent, quotaRefusal(err)
	}
	if sent.Fresh {
		o.notify(to, req.Sandbox)
	}
	return sent, nil
}

// quotaRefusal is the refusal of a message the recipient's inbox or its
// tree has no room for (err from DeliverMessage or CheckRoom); any other
// err is returned as it is.
func quotaRefusal(err error) error {
	if full, ok := errors.AsType[*store.InboxFullError](err); ok {
		return &Refusal{Detail: inboxFullDetail(full)}
	}
	if full, ok := errors.AsType[*store.TreeFullError](err); ok {
		return &Refusal{Detail: treeFullDetail(full)}
	}
	return err
}

// inboxFullDetail is the refusal of a message the recipient's inbox quota
// has no room for (docs/protocol.md):
//
//	the inbox of `lead` is full: 1000 unread items (at most 1000) and 2.1 MiB unread (at most 32 MiB); send again with a new id once `lead` has read its messages
//
// When the byte bound refuses it, ", no room for this message (SIZE)"
// follows the counts. A message larger than the whole byte bound could
// never be delivered, and says so instead.
func inboxFullDetail(e *store.InboxFullError) string {
	q := e.Quota
	if e.NeverFits() {
		return fmt.Sprintf("the message (%s) is larger than the inbox of `%s` may hold unread (at most %s)",
			formatSize(e.MessageBytes), e.Sandbox, formatSize(q.MaxUnreadBytes))
	}
	var b strings.Builder
	if e.Sender != "" {
		fmt.Fprintf(&b, "your unread messages use up your share of the inbox of `%s` (1/%d of its quota, so its other children keep room): %d %s (at most %d) and %s (at most %s)",
			e.Sandbox, store.ChildShare, e.Items, plural(e.Items, "message", "messages"), q.MaxUnreadItems, formatSize(e.Bytes), formatSize(q.MaxUnreadBytes))
		if !e.ItemsFull() {
			fmt.Fprintf(&b, ", no room for this message (%s)", formatSize(e.MessageBytes))
		}
		fmt.Fprintf(&b, "; send again with a new id once `%s` has read your messages", e.Sandbox)
		return b.String()
	}
	fmt.Fprintf(&b, "the inbox of `%s` is full: %d unread %s", e.Sandbox, e.Items, plural(e.Items, "item", "items"))
	if q.MaxUnreadItems > 0 {
		fmt.Fprintf(&b, " (at most %d)", q.MaxUnreadItems)
	}
	fmt.Fprintf(&b, " and %s unread", formatSize(e.Bytes))
	if q.MaxUnreadBytes > 0 {
		fmt.Fprintf(&b, " (at most %s)", formatSize(q.MaxUnreadBytes))
	}
	if !e.ItemsFull() {
		fmt.Fprintf(&b, ", no room for this message (%s)", formatSize(e.MessageBytes))
	}
	fmt.Fprintf(&b, "; send again with a new id once `%s` has read its messages", e.Sandbox)
	return b.String()
}

// treeFullDetail is the refusal of a message to a child that the tree
// budget (the unread messages of its orchestrator's inbox and all its
// children's) has no room for; it names the inboxes that hold the most
// (docs/protocol.md):
//
//	the inboxes of `lead` and its children are full: 2000 unread messages (at most 2000) and 63.9 MiB unread (at most 64 MiB), held by `kid-1` (1000 messages, 32 MiB), `kid-2` (999 messages, 31.9 MiB) and 1 more; send again with a new id once they have read their messages, or destroy children that never will
func treeFullDetail(e *store.TreeFullError) string {
	q := e.Quota
	var b strings.Builder
	fmt.Fprintf(&b, "the inboxes of `%s` and its children are full: %d unread %s (at most %d) and %s unread (at most %s)",
		e.Root, e.Items, plural(e.Items, "message", "messages"), q.TreeMaxUnreadItems, formatSize(e.Bytes), formatSize(q.TreeMaxUnreadBytes))
	if !e.ItemsFull() {
		fmt.Fprintf(&b, ", no room for this message (%s)", formatSize(e.MessageBytes))
	}
	named := e.Holders[:min(len(e.Holders), maxHoldersNamed)]
	for i, h := range named {
		sep := ", held by "
		if i > 0 {
			sep = ", "
		}
		fmt.Fprintf(&b, "%s`%s` (%d %s, %s)", sep, h.Sandbox, h.Items, plural(h.Items, "message", "messages"), formatSize(h.Bytes))
	}
	if more := len(e.Holders) - len(named); more > 0 {
		fmt.Fprintf(&b, " and %d more", more)
	}
	b.WriteString("; send again with a new id once they have read their messages, or destroy children that never will")
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// formatSize writes a byte count for people: "512 B", then KiB, MiB, GiB
// or TiB with one decimal, rounded down, and no ".0" ("2.1 MiB",
// "32 MiB").
func formatSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div := int64(unit)
	for _, u := range []string{"KiB", "MiB", "GiB"} {
		if n/div < unit {
			return formatUnit(n, div, u)
		}
		div *= unit
	}
	return formatUnit(n, div, "TiB")
}

func formatUnit(n, div int64, unit string) string {
	whole, tenths := n/div, n%div*10/div
	if tenths == 0 {
		return fmt.Sprintf("%d %s", whole, unit)
	}
	return fmt.Sprintf("%d.%d %s", whole, tenths, unit)
}
