package broker

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"agentbox/internal/manifest"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// fail turns err into a reply, logging errors that are not protocol errors
// (their detail on the wire is generic).
func (b *Broker) fail(op string, c *call, err error) *reply {
	var we *wire.Error
	if !errors.As(err, &we) {
		b.log.Error("request failed", "op", op, "sandbox", c.caller.Sandbox, "err", err)
	}
	return replyErr(err)
}

func (b *Broker) opList(ctx context.Context, c *call) *reply {
	var args wire.ListArgs
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

// listResult writes the wire.ListResult of items by hand: the items are
// stored JSON documents, so they are spliced in rather than re-encoded.
// Items that would push the reply past the line limit are left out, oldest
// kept, and "more" says so. TestListResultMatchesWireType holds it to the
// encoding of wire.ListResult.
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

func (b *Broker) opRead(ctx context.Context, c *call) *reply {
	var args wire.ReadArgs
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

func (b *Broker) opAck(ctx context.Context, c *call) *reply {
	var args wire.AckArgs
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
	return replyOK(wire.AckResult{ID: args.ID, Read: true})
}

// nextMatch reports whether it passes next's filter a.
// MaxNextFilter bounds each of next's filter lists. A line of 1 MiB
// could carry some 350,000 kinds, which would be held, decoded to several
// times their size, for as long as the next waits, and compared against
// every unread item on each wake; there are a handful of kinds and states.
const MaxNextFilter = 32

// checkNextArgs refuses a filter no item could need: a ref longer than
// any manifest id, or a list past MaxNextFilter.
func checkNextArgs(a *wire.NextArgs) *wire.Error {
	if len(a.Ref) > manifest.MaxIDLen {
		return wire.Errorf(wire.CodeBadRequest, "ref is longer than %d bytes, the longest manifest id", manifest.MaxIDLen)
	}
	if len(a.MsgKinds) > MaxNextFilter || len(a.StatusStates) > MaxNextFilter {
		return wire.Errorf(wire.CodeBadRequest, "msg_kinds and status_states hold at most %d entries each", MaxNextFilter)
	}
	return nil
}

// nextFilter matches a parked next's unread items, each wake a new scan
// of the inbox. A filter by kind or state decodes each document, and a
// document never changes: an item found not to match is not decoded again
// on a later scan. Without that, every change to the inbox (an ack, a
// message) decoded the whole unread inbox again, up to its 32 MiB quota.
// Only the items still unread at the last scan are remembered.
type nextFilter struct {
	args     *wire.NextArgs
	rejected map[int64]bool // by seq, at the last scan
	decodes  int            // documents decoded (tests)
}

func newNextFilter(a *wire.NextArgs) *nextFilter { return &nextFilter{args: a} }

// scan returns the match function of one scan of the inbox.
func (f *nextFilter) scan() func(store.Item) bool {
	if f.args.Ref != "" || len(f.args.MsgKinds)+len(f.args.StatusStates) == 0 {
		return func(it store.Item) bool { return nextMatch(f.args, it) } // no decoding
	}
	last, seen := f.rejected, make(map[int64]bool, len(f.rejected))
	f.rejected = seen
	return func(it store.Item) bool {
		if !last[it.Seq] {
			f.decodes++
			if nextMatch(f.args, it) {
				return true
			}
		}
		seen[it.Seq] = true
		return false
	}
}

func nextMatch(a *wire.NextArgs, it store.Item) bool {
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
	var args wire.NextArgs
	if werr := decodeArgs(c.args, &args); werr != nil {
		return replyErr(werr)
	}
	if werr := checkNextArgs(&args); werr != nil {
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
	filter := newNextFilter(&args)
	for {
		changed := c.srv.inboxChanged()
		it, found, err := b.store.FirstUnread(ctx, c.caller.Sandbox, filter.scan())
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
			rep := replyOK(wire.NextResult{Item: it.Doc})
			if args.Ack {
				rep.onLost = func() {
					b.store.MarkUnread(context.Background(), c.caller.Sandbox, it.ID)
					b.notify(c.caller.Sandbox) // a next parked meanwhile takes it
				}
			}
			return rep
		}
		select {
		case <-ctx.Done():
			return &reply{hangup: true}
		case <-b.conns.drained:
			return &reply{hangup: true} // shutting down: the client reconnects
		case <-quiet:
			return replyOK(wire.NextResult{Quiet: true})
		case <-changed:
			if quietTimer != nil {
				quietTimer.Reset(time.Duration(args.QuietAfterMS) * time.Millisecond)
			}
		}
	}
}
