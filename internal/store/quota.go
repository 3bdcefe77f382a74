package store

import (
	"context"
	"fmt"
	"math"
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
// A bound of zero (or less) is not checked, so the zero Quota checks
// nothing; the broker always sets both bounds.
type Quota struct {
	MaxUnreadItems int
	MaxUnreadBytes int64
}

// InboxFullError is a delivery refused by the quota: the recipient's
// unread inbox before the delivery, and the size of the refused message.
type InboxFullError struct {
	Sandbox      string // the recipient
	Items        int    // unread items it holds
	Bytes        int64  // unread bytes it holds
	MessageBytes int64  // the refused message's stored document
	Quota        Quota
}

func (e *InboxFullError) Error() string {
	return fmt.Sprintf("inbox of %s full: %d unread items, %d bytes unread, message of %d bytes (quota %d items, %d bytes)",
		e.Sandbox, e.Items, e.Bytes, e.MessageBytes, e.Quota.MaxUnreadItems, e.Quota.MaxUnreadBytes)
}

// NeverFits reports whether the message is larger than the inbox may
// hold unread at all: no amount of reading makes room for it.
func (e *InboxFullError) NeverFits() bool {
	return e.Quota.MaxUnreadBytes > 0 && e.MessageBytes > e.Quota.MaxUnreadBytes
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

// unreadTotals is the size of a sandbox's unread inbox.
type unreadTotals struct {
	items int
	bytes int64
}

// checkQuota refuses a message of msgBytes to sandbox when it would put
// the sandbox's unread inbox past the quota. It runs inside the delivery's
// write transaction, before the message is inserted. Call with s.wmu held.
func (s *Store) checkQuota(ctx context.Context, w *writer, sandbox string, msgBytes int64) error {
	q := s.quota
	if q.MaxUnreadItems <= 0 && q.MaxUnreadBytes <= 0 {
		return nil
	}
	t, err := s.unreadTotalsTx(ctx, w, sandbox)
	if err != nil {
		return err
	}
	if (q.MaxUnreadItems > 0 && t.items+1 > q.MaxUnreadItems) ||
		(q.MaxUnreadBytes > 0 && t.bytes+msgBytes > q.MaxUnreadBytes) {
		return &InboxFullError{Sandbox: sandbox, Items: t.items, Bytes: t.bytes, MessageBytes: msgBytes, Quota: q}
	}
	return nil
}

// unreadTotalsTx returns a sandbox's unread totals from the cache, or
// counts them in the database and caches them. Call with s.wmu held and a
// write transaction open that has written nothing yet: what it counts is
// the committed state, which the cache then follows commit by commit.
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
		if err := w.unreadTotals.QueryRowContext(ctx, sandbox, limit).Scan(&t.items, &t.bytes); err != nil {
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
