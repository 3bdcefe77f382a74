package broker

import (
	"context"
	"encoding/json"
	"errors"

	"agentbox/internal/manifest"
	"agentbox/internal/orchestrate"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// manifestID returns the manifest's id when it is a valid id, so a refusal
// can be journaled under it; "" otherwise.
func manifestID(raw json.RawMessage) string {
	var probe struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(raw, &probe) != nil {
		return ""
	}
	id, _ := probe.ID.(string)
	if !manifest.IDPattern.MatchString(id) {
		return ""
	}
	return id
}

// opSend validates a manifest and runs it on the executor. The reply is the
// manifest's first status; that status is stored as read history because
// the reply carries it, and put back unread if the reply cannot be written.
func (b *Broker) opSend(ctx context.Context, c *call) *reply {
	var args wire.SendArgs
	if werr := decodeArgs(c.args, &args); werr != nil {
		return replyErr(werr)
	}
	var sent store.Sent
	var serr error
	err := b.runExec(ctx, c.cc, c.srv.sends, func(ctx context.Context) {
		// Handling has begun: it runs to the end even if the client leaves.
		sent, serr = b.send(context.WithoutCancel(ctx), c.caller, args)
	})
	if errors.Is(err, errDropped) {
		return &reply{hangup: true}
	}
	if err != nil {
		return b.fail("send", c, err)
	}
	if serr != nil {
		return b.fail("send", c, serr)
	}
	if sent.Fresh && c.cc.hungUp() {
		// The client closed its side while the send ran (a half-close is a
		// disconnect): no reply, and the status stays unread news.
		b.store.MarkUnread(context.Background(), c.caller.Sandbox, sent.Status.ID)
		b.notify(c.caller.Sandbox)
		return &reply{hangup: true}
	}
	var st wire.StatusItem
	json.Unmarshal(sent.Status.Doc, &st)
	b.log.Info("send", "sandbox", c.caller.Sandbox, "manifest", st.Ref, "state", st.State, "resent", !sent.Fresh)
	rep := &reply{resp: &wire.Response{V: wire.Version, OK: true, Result: sent.Status.Doc}}
	if sent.Fresh {
		// The client left before taking its reply: leave the status unread.
		id := sent.Status.ID
		rep.onLost = func() {
			b.store.MarkUnread(context.Background(), c.caller.Sandbox, id)
			b.notify(c.caller.Sandbox)
		}
	}
	return rep
}

// send runs one manifest. Idempotency lives in the store: the handler's
// transaction and the refusal's both look the id up first, so an id with a
// recorded status gets that status back and nothing runs again.
func (b *Broker) send(ctx context.Context, caller wire.Caller, args wire.SendArgs) (store.Sent, error) {
	id := manifestID(args.Manifest)
	if id == "" {
		// No valid id to journal under: refused, and not stored.
		return store.TransientStatus("", wire.StateRefused, "id must match ^[a-z0-9][a-z0-9-]{0,63}$"), nil
	}
	sent, err := b.orchestrator.Send(ctx, caller, args.Manifest, args.Body)
	if r, ok := orchestrate.AsRefusal(err); ok {
		sent, err = b.store.RecordStatus(ctx, caller.Sandbox, id, "", wire.StateRefused, r.Detail, true)
	}
	if errors.Is(err, store.ErrDuplicate) {
		return store.Sent{}, wire.Errorf(wire.CodeDuplicate, "manifest id '%s' was already received and has no status yet", id)
	}
	return sent, err
}
