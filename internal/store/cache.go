package store

import (
	"context"
	"slices"
)

// The unread cache: each sandbox's unread items, loaded on first use and
// then kept in step with every commit (applyInboxes, after the commit,
// under the write lock). list, read with keep and next are
// served from it without touching SQLite. Beside it, the unread totals
// (item count and document bytes) of each inbox counted so far, which the
// quota check of every delivery reads.

// cacheUpdate collects what a transaction changed in the unread inboxes.
type cacheUpdate struct {
	added   []cachedItem // became unread
	removed []cachedItem // became read (only sandbox, item.ID, item.Type and size set)
	dropped []string     // sandboxes deleted
	// sandboxesChanged: a sandboxes row was written; clear the row cache.
	sandboxesChanged bool
}

type cachedItem struct {
	sandbox string
	item    Item
	size    int64 // removed items: the length of the document
}

// add queues an item that became unread (it was not before).
func (cu *cacheUpdate) add(sandbox string, it Item) {
	cu.added = append(cu.added, cachedItem{sandbox: sandbox, item: it})
}

// remove queues an unread item of type typ and size bytes that became
// read.
func (cu *cacheUpdate) remove(sandbox, id, typ string, size int64) {
	cu.removed = append(cu.removed, cachedItem{sandbox: sandbox, item: Item{ID: id, Type: typ}, size: size})
}

// applyTotals applies cu to the unread totals counted so far: the
// writers' view, updated when a writer's savepoint succeeds (batch.go).
func (s *Store) applyTotals(cu *cacheUpdate) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	for _, a := range cu.added {
		if t, ok := s.totals[a.sandbox]; ok {
			t.add(a.item.Type, int64(len(a.item.Doc)), 1)
			s.totals[a.sandbox] = t
		}
	}
	for _, r := range cu.removed {
		if t, ok := s.totals[r.sandbox]; ok {
			t.add(r.item.Type, -r.size, -1)
			s.totals[r.sandbox] = t
		}
	}
	for _, name := range cu.dropped {
		delete(s.totals, name)
	}
}

// forgetTotals drops every unread total after a transaction whose
// writers' changes were applied to them was rolled back: each is counted
// again on its next use.
func (s *Store) forgetTotals() {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	clear(s.totals)
}

// applyInboxes applies a committed cu to the inboxes already loaded; an
// inbox not loaded yet will read the committed state when it is. Each
// inbox changed out of order is copied once per commit, not once per
// item: a prune may remove thousands of one inbox's items in a commit,
// and a copy of the inbox for each would cost the square of its length
// under the write lock.
func (s *Store) applyInboxes(cu *cacheUpdate) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	late := map[string][]Item{} // added items that are not the newest
	for _, a := range cu.added {
		items, ok := s.inboxes[a.sandbox]
		if !ok {
			continue
		}
		if n := len(items); n == 0 || items[n-1].Seq < a.item.Seq {
			// The usual case, a new item: appending never changes what
			// readers holding the shorter slice see.
			s.inboxes[a.sandbox] = append(items, a.item)
			continue
		}
		late[a.sandbox] = append(late[a.sandbox], a.item)
	}
	for sandbox, added := range late {
		// Copy on write: readers hold the old slice. The inbox's own
		// copy of an item comes first and is the one kept.
		items := append(slices.Clone(s.inboxes[sandbox]), added...)
		slices.SortStableFunc(items, func(a, b Item) int { return cmpInt(a.Seq, b.Seq) })
		s.inboxes[sandbox] = slices.CompactFunc(items, func(a, b Item) bool { return a.Seq == b.Seq })
	}
	gone := map[string]map[string]bool{} // ids that became read, by inbox
	for _, r := range cu.removed {
		if _, ok := s.inboxes[r.sandbox]; !ok {
			continue
		}
		if gone[r.sandbox] == nil {
			gone[r.sandbox] = map[string]bool{}
		}
		gone[r.sandbox][r.item.ID] = true
	}
	for sandbox, ids := range gone {
		s.inboxes[sandbox] = slices.DeleteFunc(slices.Clone(s.inboxes[sandbox]), func(it Item) bool { return ids[it.ID] })
	}
	for _, name := range cu.dropped {
		delete(s.inboxes, name)
	}
	if cu.sandboxesChanged {
		clear(s.sandboxes)
		s.sandboxGen++
	}
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// unread returns a sandbox's unread items, oldest first, loading them from
// the database on first use. The slice is shared: callers must not modify
// it.
func (s *Store) unread(ctx context.Context, sandbox string) (_ []Item, err error) {
	defer s.settle(&err)
	ctx = detach(ctx)
	s.cmu.Lock()
	items, ok := s.inboxes[sandbox]
	s.cmu.Unlock()
	if ok {
		return items, nil
	}
	// Load under the write lock, so no commit lands between the query and
	// the cache install.
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.cmu.Lock()
	items, ok = s.inboxes[sandbox]
	s.cmu.Unlock()
	if ok {
		return items, nil
	}
	rows, err := s.q.unreadItems.QueryContext(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	items = []Item{}
	for rows.Next() {
		it, err := scanItem(rows)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var t unreadTotals
	for _, it := range items {
		t.add(it.Type, int64(len(it.Doc)), 1)
	}
	s.totals[sandbox] = t // under wmu, like every use of totals
	s.cmu.Lock()
	s.inboxes[sandbox] = items
	s.cmu.Unlock()
	return items, nil
}
