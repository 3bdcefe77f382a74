package broker

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// fail turns err into a reply, logging errors that are not protocol errors
// (their detail on the wire is generic).
func (b *Broker) fail(op string, c *call, err error) *reply {
	var we *wire.Error
	if !errors.As(err, &we) {
		b.log.Error("request failed", "op", op, "caller", c.caller.Sandbox, "err", err)
	}
	return replyErr(err)
}

// ListArgs are list's arguments.
type ListArgs struct {
	All bool `json:"all"`
}

// ListResult is list's result: inbox items oldest first, each shaped as in
// the spec's Inbox section. ReadIDs names the items already read (only
// with all=true). More is true when items were left out to keep the reply
// within the 1 MiB line limit (read some, then list again).
type ListResult struct {
	Items   []json.RawMessage `json:"items"`
	ReadIDs []string          `json:"read_ids,omitempty"`
	More    bool              `json:"more,omitempty"`
}

func (b *Broker) opList(ctx context.Context, c *call) *reply {
	var args ListArgs
	if werr := decodeArgs(c.args, &args); werr != nil {
		return replyErr(werr)
	}
	var items []store.Item
	var qerr error
	if err := b.runQuery(ctx, c.srv, "list", func() {
		items, qerr = b.store.ListItems(ctx, c.caller.Sandbox, args.All)
	}); err != nil {
		return b.fail("list", c, err)
	}
	if qerr != nil {
		return b.fail("list", c, qerr)
	}
	return &reply{resp: &wire.Response{V: wire.Version, OK: true, Result: listResult(items)}}
}

// maxResultBytes is the most a result may take so its reply line stays
// within wire.MaxLineBytes (the envelope around it is small).
const maxResultBytes = wire.MaxLineBytes - 1024

// listResult writes the ListResult of items by hand: the items are stored
// JSON documents, so they are spliced in rather than re-encoded. Items that
// would push the reply past the line limit are left out, oldest kept, and
// "more" says so.
func listResult(items []store.Item) json.RawMessage {
	out := make([]byte, 0, 256)
	out = append(out, `{"items":[`...)
	var readIDs []string
	budget := maxResultBytes
	more := false
	for i, it := range items {
		cost := len(it.Doc) + 1
		if it.Read {
			cost += len(it.ID) + 3
		}
		if budget -= cost; budget < 0 {
			more = true
			break
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, it.Doc...)
		if it.Read {
			readIDs = append(readIDs, it.ID)
		}
	}
	out = append(out, ']')
	if len(readIDs) > 0 {
		ids, _ := json.Marshal(readIDs)
		out = append(append(out, `,"read_ids":`...), ids...)
	}
	if more {
		out = append(out, `,"more":true`...)
	}
	return append(out, '}')
}

// ReadArgs are read's arguments.
type ReadArgs struct {
	ID   string `json:"id"`
	Keep bool   `json:"keep"`
}

func (b *Broker) opRead(ctx context.Context, c *call) *reply {
	var args ReadArgs
	if werr := decodeArgs(c.args, &args); werr != nil {
		return replyErr(werr)
	}
	var it store.Item
	var qerr error
	if err := b.runQuery(ctx, c.srv, "read", func() {
		it, qerr = b.store.ReadItem(ctx, c.caller.Sandbox, args.ID, args.Keep)
	}); err != nil {
		return b.fail("read", c, err)
	}
	if qerr != nil {
		return b.fail("read", c, storeErr(qerr, "no unread item '"+truncate(args.ID, 64)+"'"))
	}
	return &reply{resp: &wire.Response{V: wire.Version, OK: true, Result: it.Doc}}
}

// AckArgs are ack's arguments.
type AckArgs struct {
	ID string `json:"id"`
}

func (b *Broker) opAck(ctx context.Context, c *call) *reply {
	var args AckArgs
	if werr := decodeArgs(c.args, &args); werr != nil {
		return replyErr(werr)
	}
	var qerr error
	if err := b.runQuery(ctx, c.srv, "ack", func() {
		qerr = b.store.Ack(ctx, c.caller.Sandbox, args.ID)
	}); err != nil {
		return b.fail("ack", c, err)
	}
	if qerr != nil {
		return b.fail("ack", c, storeErr(qerr, "no unread item '"+truncate(args.ID, 64)+"'"))
	}
	return replyOK(map[string]any{"id": args.ID, "read": true})
}

// NextArgs are next's arguments. Empty filters match every item.
type NextArgs struct {
	Ref          string   `json:"ref,omitempty"`           // only statuses of this manifest id
	MsgKinds     []string `json:"msg_kinds,omitempty"`     // message kinds that wake
	StatusStates []string `json:"status_states,omitempty"` // status states that wake
	Ack          bool     `json:"ack,omitempty"`           // mark the returned item read
	QuietAfterMS int64    `json:"quiet_after_ms,omitempty"`
}

// NextResult is next's result: an item, or quiet=true when no item of any
// kind arrived for quiet_after_ms.
type NextResult struct {
	Item  json.RawMessage `json:"item,omitempty"`
	Quiet bool            `json:"quiet,omitempty"`
}

func (a *NextArgs) match(it store.Item) bool {
	if a.Ref != "" {
		return it.Type == wire.ItemStatus && it.Ref == a.Ref
	}
	if len(a.MsgKinds) == 0 && len(a.StatusStates) == 0 {
		return true
	}
	var doc struct {
		Kind  string `json:"kind"`
		State string `json:"state"`
	}
	if json.Unmarshal(it.Doc, &doc) != nil {
		return false
	}
	switch it.Type {
	case wire.ItemMessage:
		return contains(a.MsgKinds, doc.Kind)
	case wire.ItemStatus:
		return contains(a.StatusStates, doc.State)
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// opNext parks until an unread item matching the filter exists. At most one
// next is parked per sandbox; a second gets busy. The client hanging up
// ends the wait.
func (b *Broker) opNext(ctx context.Context, c *call) *reply {
	var args NextArgs
	if werr := decodeArgs(c.args, &args); werr != nil {
		return replyErr(werr)
	}
	// The one park slot is for general waits. A wait for one manifest's
	// status (send --wait) is bounded by the connection cap instead, so it
	// does not collide with an agent's `inbox wait`.
	if args.Ref == "" {
		if !c.srv.parked.CompareAndSwap(false, true) {
			return replyErr(wire.Errorf(wire.CodeBusy, "another next is already waiting for this sandbox"))
		}
		defer c.srv.parked.Store(false)
	}
	ctx, stop := c.cc.watchHangup(ctx)
	defer stop()
	var quiet <-chan time.Time
	var quietTimer *time.Timer
	if args.QuietAfterMS > 0 {
		quietTimer = time.NewTimer(time.Duration(args.QuietAfterMS) * time.Millisecond)
		defer quietTimer.Stop()
		quiet = quietTimer.C
	}
	for {
		changed := c.srv.inboxChanged()
		it, found, err := b.store.FirstUnread(ctx, c.caller.Sandbox, args.match)
		if err != nil {
			if ctx.Err() != nil {
				return &reply{hangup: true}
			}
			return b.fail("next", c, err)
		}
		if found {
			if args.Ack {
				if err := b.store.Ack(ctx, c.caller.Sandbox, it.ID); err != nil {
					return b.fail("next", c, err)
				}
			}
			rep := replyOK(NextResult{Item: it.Doc})
			if args.Ack {
				rep.onLost = func() { b.store.MarkUnread(context.Background(), c.caller.Sandbox, it.ID) }
			}
			return rep
		}
		select {
		case <-ctx.Done():
			return &reply{hangup: true}
		case <-b.conns.drained:
			return &reply{hangup: true} // shutting down: the client reconnects
		case <-quiet:
			return replyOK(NextResult{Quiet: true})
		case <-changed:
			if quietTimer != nil {
				quietTimer.Reset(time.Duration(args.QuietAfterMS) * time.Millisecond)
			}
		}
	}
}
