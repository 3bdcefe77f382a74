package orchestrate

import (
	"context"
	"errors"

	"agentbox/internal/store"
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
func (o *Orchestrator) SendMessage(ctx context.Context, req Requester, m Message) (store.Sent, error) {
	var to string
	switch req.Role {
	case store.RoleOrchestrator:
		child, err := o.childOf(ctx, req, m.To)
		if err != nil {
			return store.Sent{}, err
		}
		to = child.Name
	case store.RoleChild:
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
	if err == nil && sent.Fresh {
		o.notify(to, req.Sandbox)
	}
	return sent, err
}
