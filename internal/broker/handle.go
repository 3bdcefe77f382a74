package broker

import (
	"context"
	"encoding/json"
	"fmt"

	"agentbox/internal/orchestrate"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// handle decodes and validates a manifest and runs its type's handler.
func (b *Broker) handle(ctx context.Context, req orchestrate.Requester, args SendArgs) (store.Sent, error) {
	var m struct {
		Version   int             `json:"version"`
		ID        string          `json:"id"`
		Type      string          `json:"type"`
		To        string          `json:"to"`
		Body      *string         `json:"body"`
		BodyFile  string          `json:"body_file"`
		Kind      string          `json:"kind"`
		InReplyTo json.RawMessage `json:"in_reply_to"`
	}
	if err := wire.DecodeStrict(args.Manifest, &m); err != nil {
		return store.Sent{}, &orchestrate.Refusal{Detail: "invalid manifest"}
	}
	if m.Type != "message" {
		return store.Sent{}, &orchestrate.Refusal{Detail: fmt.Sprintf("operation `%s` is not available in this broker yet", m.Type)}
	}
	msg := orchestrate.Message{ID: m.ID, To: m.To, Kind: m.Kind}
	if m.Body != nil {
		msg.Body = *m.Body
	} else if args.Body != nil {
		msg.Body = *args.Body
	}
	if msg.Kind == "" {
		msg.Kind = "note"
	}
	var irt *string
	if json.Unmarshal(m.InReplyTo, &irt) == nil {
		msg.InReplyTo = irt
	}
	return b.orch().SendMessage(ctx, req, msg)
}

func (b *Broker) orch() *orchestrate.Orchestrator {
	return &orchestrate.Orchestrator{Store: b.store, Backend: b.cfg.Backend, Notify: b.notify}
}
