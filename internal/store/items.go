package store

import (
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

// maxNextScan bounds how many unread items one `next` examines.
const maxNextScan = 4096

// Item is a stored inbox item.
type Item struct {
	Seq  int64
	ID   string
	Type string
	Ref  string
	Doc  json.RawMessage
	Read bool
}

// insertItem stores doc (whose "id" it fills) in sandbox's inbox.
func insertItem(ctx context.Context, tx *sql.Tx, sandbox, typ, ref string, read bool, build func(id string) any) (Item, error) {
	for range hostIDAttempts {
		id := newHostID()
		doc, err := json.Marshal(build(id))
		if err != nil {
			return Item{}, err
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO items (id, sandbox, type, ref, doc, read, created_at) VALUES (?,?,?,?,?,?,?)`,
			id, sandbox, typ, ref, string(doc), read, now())
		if err != nil {
			if strings.Contains(err.Error(), "UNIQUE constraint failed: items.id") {
				continue
			}
			return Item{}, err
		}
		seq, _ := res.LastInsertId()
		return Item{Seq: seq, ID: id, Type: typ, Ref: ref, Doc: doc, Read: read}, nil
	}
	return Item{}, errors.New("could not allocate a host id")
}

// journalLookup returns the latest status recorded for (sandbox, manifestID):
// found=false when the id was never journaled; ErrDuplicate when journaled
// without a status.
func journalLookup(ctx context.Context, tx querier, sandbox, manifestID string) (Item, bool, error) {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM journal WHERE sandbox = ? AND manifest_id = ?`, sandbox, manifestID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return Item{}, false, nil
	}
	if err != nil {
		return Item{}, false, err
	}
	it, err := scanItem(tx.QueryRowContext(ctx, `SELECT seq, id, type, ref, doc, read FROM items
		WHERE sandbox = ? AND type = 'status' AND ref = ? ORDER BY seq DESC LIMIT 1`, sandbox, manifestID))
	if errors.Is(err, sql.ErrNoRows) {
		return Item{}, true, ErrDuplicate
	}
	return it, true, err
}

func journalInsert(ctx context.Context, tx *sql.Tx, sandbox, manifestID, typ string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO journal (sandbox, manifest_id, type, created_at) VALUES (?,?,?,?)`,
		sandbox, manifestID, typ, now())
	return err
}

func statusDoc(ref, state, detail string) func(string) any {
	return func(id string) any {
		return wire.StatusItem{Version: 1, ID: id, Type: wire.ItemStatus, Ref: ref, State: state, Detail: detail}
	}
}

func scanItem(row interface{ Scan(...any) error }) (Item, error) {
	var it Item
	var doc string
	err := row.Scan(&it.Seq, &it.ID, &it.Type, &it.Ref, &doc, &it.Read)
	it.Doc = json.RawMessage(doc)
	return it, err
}

// Delivery is one message from one sandbox to another.
type Delivery struct {
	From       string // sender sandbox (the requester)
	To         string // recipient sandbox
	ManifestID string // the sender's manifest id, the copy's origin_id
	Kind       string
	Body       string
	InReplyTo  *string // as the sender wrote it
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
// a journaled id returns its latest status and delivers nothing.
func (s *Store) DeliverMessage(ctx context.Context, d Delivery) (Sent, error) {
	var out Sent
	err := s.withTx(ctx, func(tx *sql.Tx) error {
		prev, found, err := journalLookup(ctx, tx, d.From, d.ManifestID)
		if err != nil || found {
			out = Sent{Status: prev}
			return err
		}
		if err := journalInsert(ctx, tx, d.From, d.ManifestID, wire.ItemMessage); err != nil {
			return err
		}
		inReplyTo, err := mapReply(ctx, tx, d)
		if err != nil {
			return err
		}
		if _, err := insertItem(ctx, tx, d.To, wire.ItemMessage, "", false, func(id string) any {
			return wire.MessageItem{Version: 1, ID: id, Type: wire.ItemMessage, From: d.From, Kind: d.Kind,
				Body: d.Body, InReplyTo: inReplyTo, OriginID: d.ManifestID}
		}); err != nil {
			return err
		}
		st, err := insertItem(ctx, tx, d.From, wire.ItemStatus, d.ManifestID, true,
			statusDoc(d.ManifestID, wire.StateDone, "delivered to "+d.To))
		out = Sent{Status: st, Fresh: true}
		return err
	})
	return out, err
}

// mapReply maps in_reply_to for the recipient: when it names a message in
// the sender's inbox that the recipient sent, the recipient gets that
// message's origin_id (the id it gave its own manifest). Any other id
// passes through unchanged.
func mapReply(ctx context.Context, tx *sql.Tx, d Delivery) (*string, error) {
	if d.InReplyTo == nil {
		return nil, nil
	}
	var doc string
	err := tx.QueryRowContext(ctx, `SELECT doc FROM items WHERE sandbox = ? AND id = ? AND type = 'message'`,
		d.From, *d.InReplyTo).Scan(&doc)
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

// RecordStatus journals (sandbox, manifestID) if needed and appends a
// status for it. A first refusal is stored read (the reply carries it).
// If the id already has a recorded status and this is meant as the first
// one (first=true), the earlier status is returned instead.
func (s *Store) RecordStatus(ctx context.Context, sandbox, manifestID, typ, state, detail string, first bool) (Sent, error) {
	var out Sent
	err := s.withTx(ctx, func(tx *sql.Tx) error {
		prev, found, err := journalLookup(ctx, tx, sandbox, manifestID)
		if first && (err != nil || found) {
			out = Sent{Status: prev}
			return err
		}
		if !found {
			if err := journalInsert(ctx, tx, sandbox, manifestID, typ); err != nil {
				return err
			}
		}
		st, err := insertItem(ctx, tx, sandbox, wire.ItemStatus, manifestID, first, statusDoc(manifestID, state, detail))
		out = Sent{Status: st, Fresh: true}
		return err
	})
	return out, err
}

// MarkUnread returns an item to the unread inbox (a reply that carried it
// could not be written).
func (s *Store) MarkUnread(ctx context.Context, sandbox, id string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE items SET read = 0 WHERE sandbox = ? AND id = ?`, sandbox, id)
	return err
}

// ListItems lists a sandbox's unread items (all=true: read history too),
// oldest first.
func (s *Store) ListItems(ctx context.Context, sandbox string, all bool) ([]Item, error) {
	q := `SELECT seq, id, type, ref, doc, read FROM items WHERE sandbox = ? AND read = 0 ORDER BY seq`
	if all {
		q = `SELECT seq, id, type, ref, doc, read FROM items WHERE sandbox = ? ORDER BY seq`
	}
	rows, err := s.db.QueryContext(ctx, q, sandbox)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Item
	for rows.Next() {
		it, err := scanItem(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, it)
	}
	return out, rows.Err()
}

// ReadItem returns an unread item and, unless keep, marks it read in the
// same durable transaction.
func (s *Store) ReadItem(ctx context.Context, sandbox, id string, keep bool) (Item, error) {
	var it Item
	err := s.withTx(ctx, func(tx *sql.Tx) error {
		var err error
		it, err = scanItem(tx.QueryRowContext(ctx, `SELECT seq, id, type, ref, doc, read FROM items
			WHERE sandbox = ? AND id = ? AND read = 0`, sandbox, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("item %q: %w", id, ErrNotFound)
		}
		if err != nil || keep {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE items SET read = 1 WHERE seq = ?`, it.Seq)
		it.Read = true
		return err
	})
	return it, err
}

// Ack marks an unread item read.
func (s *Store) Ack(ctx context.Context, sandbox, id string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE items SET read = 1 WHERE sandbox = ? AND id = ? AND read = 0`, sandbox, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("item %q: %w", id, ErrNotFound)
	}
	return nil
}

// FirstUnread returns the oldest unread item accepted by match, if any.
func (s *Store) FirstUnread(ctx context.Context, sandbox string, match func(Item) bool) (Item, bool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT seq, id, type, ref, doc, read FROM items
		WHERE sandbox = ? AND read = 0 ORDER BY seq LIMIT ?`, sandbox, maxNextScan)
	if err != nil {
		return Item{}, false, err
	}
	defer rows.Close()
	for rows.Next() {
		it, err := scanItem(rows)
		if err != nil {
			return Item{}, false, err
		}
		if match(it) {
			return it, true, nil
		}
	}
	return Item{}, false, rows.Err()
}

// LatestStatuses returns, per sandbox, the latest status of each manifest
// ref, oldest ref first.
func (s *Store) LatestStatuses(ctx context.Context) (map[string][]Item, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT sandbox, seq, id, type, ref, doc, read FROM items
		WHERE seq IN (SELECT MAX(seq) FROM items WHERE type = 'status' GROUP BY sandbox, ref) ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]Item{}
	for rows.Next() {
		var sb string
		var it Item
		var doc string
		if err := rows.Scan(&sb, &it.Seq, &it.ID, &it.Type, &it.Ref, &doc, &it.Read); err != nil {
			return nil, err
		}
		it.Doc = json.RawMessage(doc)
		out[sb] = append(out[sb], it)
	}
	return out, rows.Err()
}

// LatestStatus returns the latest status recorded for a sandbox's manifest
// id: found=false if the id was never journaled, ErrDuplicate if it was
// journaled without a status.
func (s *Store) LatestStatus(ctx context.Context, sandbox, manifestID string) (Item, bool, error) {
	return journalLookup(ctx, s.db, sandbox, manifestID)
}

// querier is what journalLookup needs: the database or a transaction.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// TransientStatus builds a status that is not stored: the answer to a
// manifest with no valid id to journal it under.
func TransientStatus(ref, state, detail string) Sent {
	id := newHostID()
	doc, _ := json.Marshal(statusDoc(ref, state, detail)(id))
	return Sent{Status: Item{ID: id, Type: wire.ItemStatus, Ref: ref, Doc: doc}}
}
