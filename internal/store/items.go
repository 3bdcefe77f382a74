package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"agentbox/internal/wire"
)

// ErrDuplicate: the manifest id is journaled but has no recorded status.
var ErrDuplicate = errors.New("duplicate manifest id")

// Item is a stored inbox item.
type Item struct {
	Seq  int64
	ID   string
	Type string
	Ref  string
	Doc  json.RawMessage
	Read bool
}

func scanItem(row interface{ Scan(...any) error }) (Item, error) {
	var it Item
	var doc string
	err := row.Scan(&it.Seq, &it.ID, &it.Type, &it.Ref, &doc, &it.Read)
	it.Doc = json.RawMessage(doc)
	return it, err
}

// insertItem stores doc (whose "id" it fills) in sandbox's inbox and queues
// it for the unread cache. admit, if not nil, sees the document's length
// before it is stored and may refuse it.
func insertItem(ctx context.Context, w *writer, cu *cacheUpdate, sandbox, typ, ref string, read bool, build func(id string) any, admit func(docLen int64) error) (Item, error) {
	for range hostIDAttempts {
		id := hostID()
		doc, err := json.Marshal(build(id))
		if err != nil {
			return Item{}, err
		}
		if admit != nil {
			if err := admit(int64(len(doc))); err != nil {
				return Item{}, err
			}
		}
		res, err := w.insertItem.ExecContext(ctx, id, sandbox, typ, ref, string(doc), read, now())
		if err != nil {
			if strings.Contains(err.Error(), "UNIQUE constraint failed: items.sandbox, items.id") {
				continue
			}
			return Item{}, err
		}
		seq, err := res.LastInsertId()
		if err != nil {
			return Item{}, err
		}
		it := Item{Seq: seq, ID: id, Type: typ, Ref: ref, Doc: doc, Read: read}
		if !read {
			cu.add(sandbox, it)
		}
		return it, nil
	}
	return Item{}, errors.New("could not allocate a host id")
}

// journalLookup returns the latest status recorded for (sandbox,
// manifestID): found=false when the id was never journaled; ErrDuplicate
// when it is journaled without a status.
func journalLookup(ctx context.Context, stmt *sql.Stmt, sandbox, manifestID string) (Item, bool, error) {
	var statusSeq sql.NullInt64
	var seq sql.NullInt64
	var id, typ, ref, doc sql.NullString
	var read sql.NullBool
	err := stmt.QueryRowContext(ctx, sandbox, manifestID).Scan(&statusSeq, &seq, &id, &typ, &ref, &doc, &read)
	if errors.Is(err, sql.ErrNoRows) {
		return Item{}, false, nil
	}
	if err != nil {
		return Item{}, false, err
	}
	if !statusSeq.Valid || !seq.Valid {
		return Item{}, true, ErrDuplicate
	}
	return Item{Seq: seq.Int64, ID: id.String, Type: typ.String, Ref: ref.String, Doc: json.RawMessage(doc.String), Read: read.Bool}, true, nil
}

func statusDoc(ref, state, detail string) func(string) any {
	return func(id string) any {
		return wire.StatusItem{Version: 1, ID: id, Type: wire.ItemStatus, Ref: ref, State: state, Detail: detail}
	}
}

// Delivery is one message from one sandbox to another.
type Delivery struct {
	From       string // sender sandbox (the requester)
	To         string // recipient sandbox
	ManifestID string // the sender's manifest id, the copy's origin_id
	Kind       string
	Body       string
	InReplyTo  *string // as the sender wrote it
	// Import is a done report's import outcome (nil for other messages).
	Import *ImportResult
	// Journaled: BeginManifest journaled the id already.
	Journaled bool
	// StatusDetail is the sender's done detail ("" = "delivered to <To>").
	StatusDetail string
	// Unmetered: the inbox quota does not refuse it (an update's message
	// reports a change already made to the recipient's repository).
	Unmetered bool
	// DoneHead, for a child's done report, is recorded as the sender's
	// DoneHead (with Cleanup) in the delivery's transaction: a report is
	// accepted exactly when it is delivered.
	DoneHead string
	Cleanup  bool
	// Finish, when not 0, is the pending finish (QueueFinish) this
	// delivery completes: its row goes in the same transaction, and the
	// status is stored unread (the send's reply was the queued status).
	Finish int64
}

// ImportResult is what a done report's message carries of its import.
type ImportResult struct {
	Ref, SHA, Error      string
	OnDone, OnDoneReason string
	MergedHead           string // an update merged: the recipient's new HEAD
}

// Sent is the outcome of a send: the manifest's first status, and whether
// this call created it (false: an earlier send of the same id did).
type Sent struct {
	Status Item
	Fresh  bool
}

// DeliverMessage journals the sender's manifest id, puts the message in
// the recipient's inbox and the "delivered" status in the sender's, in one
// durable transaction. The status is stored read: the send's reply carries
// it (MarkUnread undoes that when the reply cannot be written). A resend of
// a journaled id returns its latest status and delivers nothing. A message
// that would put the recipient's unread inbox past the quota is refused
// with an *InboxFullError, checked in the same transaction, and nothing
// is written (the caller journals the refusal). Concurrent deliveries share
// a COMMIT (batch.go).
func (s *Store) DeliverMessage(ctx context.Context, d Delivery) (Sent, error) {
	var out Sent
	err := s.withSharedTx(ctx, func(w *writer, cu *cacheUpdate) error {
		prev, found, err := journalLookup(ctx, w.journalGet, d.From, d.ManifestID)
		if d.Journaled && errors.Is(err, ErrDuplicate) {
			err = nil // journaled by BeginManifest, no status yet: ours to give
		}
		if err != nil || found && !d.Journaled {
			out = Sent{Status: prev}
			return err
		}
		inReplyTo, err := s.mapReply(ctx, w, d)
		if err != nil {
			return err
		}
		quota := func(docLen int64) error { return s.checkQuota(ctx, w, d.From, d.To, docLen) }
		if d.Unmetered {
			quota = nil
		}
		if _, err := insertItem(ctx, w, cu, d.To, wire.ItemMessage, "", false, func(id string) any {
			m := wire.MessageItem{Version: 1, ID: id, Type: wire.ItemMessage, From: d.From, Kind: d.Kind,
				Body: d.Body, InReplyTo: inReplyTo, OriginID: d.ManifestID}
			if im := d.Import; im != nil {
				m.ImportedRef, m.ImportedSHA, m.ImportError, m.OnDone, m.OnDoneReason = im.Ref, im.SHA, im.Error, im.OnDone, im.OnDoneReason
				m.MergedHead = im.MergedHead
			}
			return m
		}, quota); err != nil {
			return err
		}
		if d.DoneHead != "" {
			if _, err := w.conn.ExecContext(ctx, `UPDATE sandboxes SET done_head = ?, cleanup = ? WHERE name = ?`, d.DoneHead, d.Cleanup, d.From); err != nil {
				return err
			}
			cu.sandboxesChanged = true
		}
		if d.Finish != 0 {
			res, err := w.conn.ExecContext(ctx, `DELETE FROM finishes WHERE seq = ?`, d.Finish)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return cmp.Or(err, ErrNotFound)
			}
		}
		detail := d.StatusDetail
		if detail == "" {
			detail = "delivered to " + d.To
		}
		st, err := insertItem(ctx, w, cu, d.From, wire.ItemStatus, d.ManifestID, d.Finish == 0,
			statusDoc(d.ManifestID, wire.StateDone, detail), nil)
		if err != nil {
			return err
		}
		if d.Journaled {
			_, err = w.journalSetSt.ExecContext(ctx, st.Seq, d.From, d.ManifestID)
		} else {
			_, err = w.journalPut.ExecContext(ctx, d.From, d.ManifestID, wire.ItemMessage, st.Seq, now())
		}
		if err != nil {
			return err
		}
		out = Sent{Status: st, Fresh: true}
		return nil
	})
	return out, err
}

// mapReply maps in_reply_to for the recipient: when it names a message in
// the sender's inbox that the recipient sent, the recipient gets that
// message's origin_id (the id it gave its own manifest). Any other id
// passes through unchanged.
func (s *Store) mapReply(ctx context.Context, w *writer, d Delivery) (*string, error) {
	if d.InReplyTo == nil {
		return nil, nil
	}
	var doc string
	err := w.messageDoc.QueryRowContext(ctx, *d.InReplyTo, d.From).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return d.InReplyTo, nil
	}
	if err != nil {
		return nil, err
	}
	var m wire.MessageItem
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		return nil, err
	}
	if m.From == d.To && m.OriginID != "" {
		return &m.OriginID, nil
	}
	return d.InReplyTo, nil
}

// RecordStatus appends a status for (sandbox, manifestID), journaling the
// id if needed. With first=true it is the manifest's first status: if the
// id already has a status, that one is returned instead and nothing is
// written, and the new status is stored read (the reply carries it).
func (s *Store) RecordStatus(ctx context.Context, sandbox, manifestID, typ, state, detail string, first bool) (Sent, error) {
	var out Sent
	err := s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		prev, found, err := journalLookup(ctx, w.journalGet, sandbox, manifestID)
		if errors.Is(err, ErrDuplicate) && !first {
			err = nil // journaled by the handler that now reports
		}
		if err != nil || (first && found) {
			out = Sent{Status: prev}
			return err
		}
		st, err := insertItem(ctx, w, cu, sandbox, wire.ItemStatus, manifestID, first, statusDoc(manifestID, state, detail), nil)
		if err != nil {
			return err
		}
		if found {
			_, err = w.journalSetSt.ExecContext(ctx, st.Seq, sandbox, manifestID)
		} else {
			_, err = w.journalPut.ExecContext(ctx, sandbox, manifestID, typ, st.Seq, now())
		}
		out = Sent{Status: st, Fresh: true}
		return err
	})
	return out, err
}

// TransientStatus builds a status that is not stored: the answer to a
// manifest with no valid id to journal it under.
func TransientStatus(ref, state, detail string) Sent {
	id := newHostID()
	doc, _ := json.Marshal(statusDoc(ref, state, detail)(id))
	return Sent{Status: Item{ID: id, Type: wire.ItemStatus, Ref: ref, Doc: doc}}
}

// MarkUnread returns a read item to the unread inbox (a reply that carried
// it could not be written).
func (s *Store) MarkUnread(ctx context.Context, sandbox, id string) error {
	return s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		it, err := scanItem(w.markUnread.QueryRowContext(ctx, id, sandbox))
		if errors.Is(err, sql.ErrNoRows) {
			return nil // already unread, or gone
		}
		if err != nil {
			return err
		}
		cu.add(sandbox, it)
		return nil
	})
}

// MaxHistoryBytes bounds the documents ListItems reads of a sandbox's
// history (all=true): the list's reply holds at most a line
// (wire.MaxLineBytes), and read items are kept for days and not counted
// by the inbox quota, so a sandbox acking what its children send could
// make its history gigabytes that each list would load whole.
const MaxHistoryBytes = wire.MaxLineBytes

// minItemDoc is less than any stored item's document takes: its id
// alone ("h-" and 2*hostIDBytes hex digits) is 10 bytes, and the JSON
// around it (version, type, ...) more than 22.
const minItemDoc = 32

// maxHistoryItems is the most items ListItems reads of a history: that
// many documents take more than MaxHistoryBytes.
const maxHistoryItems = MaxHistoryBytes/minItemDoc + 1

// historyChunk is how many items of a history one query reads.
const historyChunk = 256

// ListItems lists a sandbox's unread items (all=true: read history too),
// oldest first. The unread list comes from the cache; callers must not
// modify the returned slice. The history stops at the first item that
// takes its documents past MaxHistoryBytes (that item included, so the
// caller sees there is more). It is read in two steps, the oldest
// maxHistoryItems seqs from the index and then their rows a chunk at a
// time, so no list sorts or reads the rows of a whole history (read
// items are kept for days and not counted by the inbox quota); the first
// step still walks the history's index entries.
func (s *Store) ListItems(ctx context.Context, sandbox string, all bool) (_ []Item, err error) {
	defer s.settle(&err)
	ctx = detach(ctx)
	if !all {
		return s.unread(ctx, sandbox)
	}
	seqs, err := s.historySeqs(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	var out []Item
	size := 0
	for len(seqs) > 0 && size <= MaxHistoryBytes {
		chunk := seqs[:min(len(seqs), historyChunk)]
		seqs = seqs[len(chunk):]
		list, err := json.Marshal(chunk)
		if err != nil {
			return nil, err
		}
		rows, err := s.q.itemsBySeq.QueryContext(ctx, string(list), sandbox)
		if err != nil {
			return nil, err
		}
		for size <= MaxHistoryBytes && rows.Next() {
			it, err := scanItem(rows)
			if err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, it)
			size += len(it.Doc)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// historySeqs returns the seqs of sandbox's oldest maxHistoryItems items,
// oldest first. (An item removed before its row is read is left out.)
func (s *Store) historySeqs(ctx context.Context, sandbox string) ([]int64, error) {
	rows, err := s.q.historySeqs.QueryContext(ctx, sandbox, maxHistoryItems)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, err
		}
		seqs = append(seqs, seq)
	}
	return seqs, rows.Err()
}

// DeliveredImport reports whether sandbox's inbox holds, read or not, a
// done report that imported commit sha at ref: a commit the broker
// itself brought into that sandbox's repository for it (publish's
// sources).
func (s *Store) DeliveredImport(ctx context.Context, sandbox, ref, sha string) (found bool, err error) {
	defer s.settle(&err)
	err = s.db.QueryRowContext(detach(ctx), deliveredImportSQL, sandbox, ref, sha).Scan(&found)
	return found, err
}

// unreadByID finds an unread item in the cache.
func (s *Store) unreadByID(ctx context.Context, sandbox, id string) (Item, error) {
	items, err := s.unread(ctx, sandbox)
	if err != nil {
		return Item{}, err
	}
	for _, it := range items {
		if it.ID == id {
			return it, nil
		}
	}
	return Item{}, fmt.Errorf("item %q: %w", id, ErrNotFound)
}

// ReadItem returns an unread item and, unless keep, marks it read durably
// before returning.
func (s *Store) ReadItem(ctx context.Context, sandbox, id string, keep bool) (Item, error) {
	it, err := s.unreadByID(ctx, sandbox, id)
	if err != nil || keep {
		return it, err
	}
	if err := s.Ack(ctx, sandbox, id); err != nil {
		return Item{}, err
	}
	it.Read = true
	return it, nil
}

// Ack marks an unread item read.
func (s *Store) Ack(ctx context.Context, sandbox, id string) error {
	return s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		var size int64
		var typ string
		err := w.markRead.QueryRowContext(ctx, id, sandbox).Scan(&size, &typ)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("item %q: %w", id, ErrNotFound)
		}
		if err != nil {
			return err
		}
		cu.remove(sandbox, id, typ, size)
		return nil
	})
}

// FirstUnread returns the oldest unread item accepted by match, if any.
func (s *Store) FirstUnread(ctx context.Context, sandbox string, match func(Item) bool) (Item, bool, error) {
	items, err := s.unread(ctx, sandbox)
	if err != nil {
		return Item{}, false, err
	}
	for _, it := range items {
		if match(it) {
			return it, true, nil
		}
	}
	return Item{}, false, nil
}

// StatusesSince returns every status item with seq > after, oldest first,
// with the sandbox it belongs to; rounds fold them into their snapshot.
func (s *Store) StatusesSince(ctx context.Context, after int64) (_ []SandboxItem, err error) {
	defer s.settle(&err)
	ctx = detach(ctx)
	rows, err := s.db.QueryContext(ctx, `SELECT sandbox, `+itemCols+` FROM items
		WHERE seq > ? AND type = 'status' ORDER BY seq`, after)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SandboxItem
	for rows.Next() {
		var si SandboxItem
		var doc string
		if err := rows.Scan(&si.Sandbox, &si.Seq, &si.ID, &si.Type, &si.Ref, &doc, &si.Read); err != nil {
			return nil, err
		}
		si.Doc = json.RawMessage(doc)
		out = append(out, si)
	}
	return out, rows.Err()
}

// SandboxItem is an item with the sandbox whose inbox holds it.
type SandboxItem struct {
	Sandbox string
	Item
}
