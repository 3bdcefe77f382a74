package store

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"

	"agentbox/internal/wire"
)

// Quota bounds each sandbox's unread inbox. A message delivery
// (DeliverMessage) that would put its recipient past either bound is
// refused with an *InboxFullError and writes nothing; statuses are never
// refused, so an inbox can pass its bounds through them.
//
// What counts is every unread item of the inbox, messages and statuses
// alike. The bytes of an item are the length in bytes of its stored
// document (items.doc: the JSON text that list and read return, escapes
// included).
//
// A child of an orchestrator with more than one child is also held to its
// share of the orchestrator's inbox (ChildShare): its own unread messages
// there, counted only once the inbox is past that share as a whole.
//
// A bound of zero (or less) is not checked, so the zero Quota checks
// nothing; the broker always sets every bound.
//
// The tree bounds (TreeMax...) check a message to a child against the
// unread messages of its orchestrator and all the orchestrator's children
// together; a message that would pass one is refused with a
// *TreeFullError. Statuses do not count there: each inbox's statuses are
// its own sandbox's news, which a child could otherwise put back unread
// (a send whose reply it never takes) until its siblings had no room.
// Messages to an orchestrator are held by its own inbox bounds alone, so
// a child's done report never waits on its siblings.
type Quota struct {
	MaxUnreadItems     int
	MaxUnreadBytes     int64
	TreeMaxUnreadItems int
	TreeMaxUnreadBytes int64
}

// InboxFullError is a delivery refused by the quota: the recipient's
// unread inbox before the delivery, and the size of the refused message.
//
// With Sender set, the sender's share refused it (ChildShare): Items and
// Bytes are the sender's own unread messages in the inbox, and Quota its
// share.
type InboxFullError struct {
	Sandbox      string // the recipient
	Sender       string // the child whose share is used up, or ""
	Items        int    // unread items it holds
	Bytes        int64  // unread bytes it holds
	MessageBytes int64  // the refused message's stored document
	Quota        Quota
}

func (e *InboxFullError) Error() string {
	if e.Sender != "" {
		return fmt.Sprintf("inbox of %s: %s's share full: %d unread messages, %d bytes unread, message of %d bytes (share %d items, %d bytes)",
			e.Sandbox, e.Sender, e.Items, e.Bytes, e.MessageBytes, e.Quota.MaxUnreadItems, e.Quota.MaxUnreadBytes)
	}
	return fmt.Sprintf("inbox of %s full: %d unread items, %d bytes unread, message of %d bytes (quota %d items, %d bytes)",
		e.Sandbox, e.Items, e.Bytes, e.MessageBytes, e.Quota.MaxUnreadItems, e.Quota.MaxUnreadBytes)
}

// TreeFullError is a message to a child refused by the tree bounds: the
// unread messages of the tree (the orchestrator Root and its children)
// before the delivery, and the inboxes that hold them, most bytes first.
type TreeFullError struct {
	Root         string
	Items        int   // unread messages of the tree
	Bytes        int64 // their stored documents' bytes
	MessageBytes int64
	Quota        Quota
	Holders      []Holder
}

// Holder is one inbox of a tree and the messages it holds unread.
type Holder struct {
	Sandbox string
	Items   int   // unread messages
	Bytes   int64 // their stored documents' bytes
}

func (e *TreeFullError) Error() string {
	return fmt.Sprintf("inboxes of %s's tree full: %d unread messages, %d bytes unread, message of %d bytes (quota %d items, %d bytes)",
		e.Root, e.Items, e.Bytes, e.MessageBytes, e.Quota.TreeMaxUnreadItems, e.Quota.TreeMaxUnreadBytes)
}

// ItemsFull reports whether the item bound refused the delivery.
func (e *TreeFullError) ItemsFull() bool {
	return e.Quota.TreeMaxUnreadItems > 0 && e.Items+1 > e.Quota.TreeMaxUnreadItems
}

// NeverFits reports whether the message is larger than the inbox may
// hold unread at all: no amount of reading makes room for it. (A share
// always lets in a child with nothing unread.)
func (e *InboxFullError) NeverFits() bool {
	return e.Sender == "" && e.Quota.MaxUnreadBytes > 0 && e.MessageBytes > e.Quota.MaxUnreadBytes
}

// ItemsFull reports whether the item bound refused the delivery.
func (e *InboxFullError) ItemsFull() bool {
	return e.Quota.MaxUnreadItems > 0 && e.Items+1 > e.Quota.MaxUnreadItems
}

// SetQuota sets the inbox quota checked by every later delivery.
func (s *Store) SetQuota(q Quota) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.quota = q
}

// unreadTotals is the size of a sandbox's unread inbox: every item (the
// inbox quota), and its messages alone (the tree bounds).
type unreadTotals struct {
	items    int
	bytes    int64
	msgs     int
	msgBytes int64
}

// add counts n items (n < 0: uncounts) of type typ and size bytes each
// time: size is already negative for n < 0.
func (t *unreadTotals) add(typ string, size int64, n int) {
	t.items += n
	t.bytes += size
	if typ == wire.ItemMessage {
		t.msgs += n
		t.msgBytes += size
	}
}

// CheckRoom refuses, as a delivery would, a message of msgBytes from
// sender to sandbox that the inbox quota or the tree bounds have no room
// for now (an *InboxFullError or a *TreeFullError); it writes nothing. An
// unmetered delivery (one reporting a change already made) is checked
// with it before the change is made.
func (s *Store) CheckRoom(ctx context.Context, sender, sandbox string, msgBytes int64) error {
	return s.withTx(ctx, func(w *writer, _ *cacheUpdate) error {
		return s.checkQuota(ctx, w, sender, sandbox, msgBytes)
	})
}

// checkQuota refuses a message of msgBytes from sender to sandbox when it
// would put the sandbox's unread inbox past the quota, or the sender's
// share of it past ChildShare. It runs inside the delivery's write
// transaction, before the message is inserted. Call with s.wmu held.
func (s *Store) checkQuota(ctx context.Context, w *writer, sender, sandbox string, msgBytes int64) error {
	q := s.quota
	if q.MaxUnreadItems > 0 || q.MaxUnreadBytes > 0 {
		t, err := s.unreadTotalsTx(ctx, w, sandbox)
		if err != nil {
			return err
		}
		if q.over(t.items, t.bytes, msgBytes) {
			return &InboxFullError{Sandbox: sandbox, Items: t.items, Bytes: t.bytes, MessageBytes: msgBytes, Quota: q}
		}
		share := q.childShare()
		// Under its share as a whole, the inbox holds no sender past it:
		// only a fuller one is counted by sender.
		if share.over(t.items, t.bytes, msgBytes) {
			if err := s.checkChildShare(ctx, w, sender, sandbox, msgBytes, share); err != nil {
				return err
			}
		}
	}
	if q.TreeMaxUnreadItems <= 0 && q.TreeMaxUnreadBytes <= 0 {
		return nil
	}
	return s.checkTree(ctx, w, sandbox, msgBytes)
}

// ChildShare is the part of an orchestrator's inbox quota (items and
// bytes alike) the unread messages of one of its children may take, when
// it has more than one: 1/ChildShare. Without it, one child could fill the
// inbox, and every sibling's message to the orchestrator would be refused
// until it read.
const ChildShare = 2

// childShare is the bounds of one child's unread messages in its
// orchestrator's inbox.
func (q Quota) childShare() Quota {
	return Quota{MaxUnreadItems: q.MaxUnreadItems / ChildShare, MaxUnreadBytes: q.MaxUnreadBytes / ChildShare}
}

// over reports whether a message of msgBytes, added to items and bytes,
// passes q's inbox bounds.
func (q Quota) over(items int, bytes, msgBytes int64) bool {
	return (q.MaxUnreadItems > 0 && items+1 > q.MaxUnreadItems) ||
		(q.MaxUnreadBytes > 0 && bytes+msgBytes > q.MaxUnreadBytes)
}

// checkChildShare refuses a message of msgBytes from sender to sandbox when
// sender is one of sandbox's children, it has siblings, and its own unread
// messages there would pass share. (An only child has nobody to leave
// room for: it may fill the inbox.) Call with s.wmu held, inside the
// delivery's transaction.
func (s *Store) checkChildShare(ctx context.Context, w *writer, sender, sandbox string, msgBytes int64, share Quota) error {
	var parent string
	err := w.parentOf.QueryRowContext(ctx, sender).Scan(&parent)
	if errors.Is(err, sql.ErrNoRows) || err == nil && parent != sandbox {
		return nil
	}
	if err != nil {
		return err
	}
	var children int
	if err := w.childCount.QueryRowContext(ctx, sandbox).Scan(&children); err != nil || children < 2 {
		return err
	}
	var items int
	var bytes int64
	if err := w.unreadFrom.QueryRowContext(ctx, sandbox, sender).Scan(&items, &bytes); err != nil {
		return err
	}
	// A child with nothing unread there is always let in (to the inbox's
	// own bounds): a message larger than the share still gets through,
	// once the orchestrator has read the child's others.
	if items > 0 && share.over(items, bytes, msgBytes) {
		return &InboxFullError{Sandbox: sandbox, Sender: sender, Items: items, Bytes: bytes, MessageBytes: msgBytes, Quota: share}
	}
	return nil
}

// checkTree refuses a message of msgBytes to sandbox, when it is a child,
// that would put its tree's unread messages past the tree bounds. Call with
// s.wmu held, inside the delivery's transaction.
func (s *Store) checkTree(ctx context.Context, w *writer, sandbox string, msgBytes int64) error {
	q := s.quota
	var root string
	err := w.parentOf.QueryRowContext(ctx, sandbox).Scan(&root)
	if errors.Is(err, sql.ErrNoRows) || err == nil && root == "" {
		return nil // an orchestrator, or no such sandbox (the insert fails)
	}
	if err != nil {
		return err
	}
	holders, err := s.treeHolders(ctx, w, root)
	if err != nil {
		return err
	}
	e := &TreeFullError{Root: root, MessageBytes: msgBytes, Quota: q, Holders: holders}
	for _, h := range holders {
		e.Items += h.Items
		e.Bytes += h.Bytes
	}
	if (q.TreeMaxUnreadItems > 0 && e.Items+1 > q.TreeMaxUnreadItems) ||
		(q.TreeMaxUnreadBytes > 0 && e.Bytes+msgBytes > q.TreeMaxUnreadBytes) {
		return e
	}
	return nil
}

// treeHolders is the unread messages of root and each of its children
// (from the cache once counted), those holding most bytes first, inboxes
// without unread messages left out.
func (s *Store) treeHolders(ctx context.Context, w *writer, root string) ([]Holder, error) {
	rows, err := w.treeMembers.QueryContext(ctx, root, root)
	if err != nil {
		return nil, err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []Holder
	for _, n := range names {
		t, err := s.unreadTotalsTx(ctx, w, n)
		if err != nil {
			return nil, err
		}
		if t.msgs > 0 {
			out = append(out, Holder{Sandbox: n, Items: t.msgs, Bytes: t.msgBytes})
		}
	}
	slices.SortFunc(out, func(a, b Holder) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.Sandbox, b.Sandbox))
	})
	return out, nil
}

// unreadTotalsTx returns a sandbox's unread totals from the cache, or
// counts them in the database and caches them. Call with s.wmu held, in a
// writer's savepoint before it writes: what it counts is the committed
// state and the open transaction's writers before it (batch.go), which
// the cache then follows writer by writer.
//
// The count reads at most MaxUnreadItems+1 unread rows; only an inbox
// already past its item bound (through statuses, or a lowered quota) is
// counted in full, once.
func (s *Store) unreadTotalsTx(ctx context.Context, w *writer, sandbox string) (unreadTotals, error) {
	if t, ok := s.totals[sandbox]; ok {
		return t, nil
	}
	limit := int64(-1) // SQLite: no limit
	if s.quota.MaxUnreadItems > 0 && s.quota.MaxUnreadItems < math.MaxInt {
		limit = int64(s.quota.MaxUnreadItems) + 1
	}
	var t unreadTotals
	for {
		if err := w.unreadTotals.QueryRowContext(ctx, sandbox, limit).Scan(&t.items, &t.bytes, &t.msgs, &t.msgBytes); err != nil {
			return unreadTotals{}, err
		}
		if limit < 0 || int64(t.items) < limit {
			break
		}
		limit = -1
	}
	s.totals[sandbox] = t
	return t, nil
}
