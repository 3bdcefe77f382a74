package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"

	"agentbox/internal/wire"
)

// A manifest whose handler acts outside the store (import, stop, destroy)
// is journaled before it acts and given its first status after, so a
// resend of its id returns the status and never acts twice; a broker that
// dies in between leaves the id journaled without a status, which the
// next broker gives one (InterruptedManifests, FinishInterrupted).

// BeginManifest journals manifestID for sandbox. found is true, with the
// recorded status, when the id was handled before; ErrDuplicate when it is
// journaled without a status.
func (s *Store) BeginManifest(ctx context.Context, sandbox, manifestID, typ string) (prev Sent, found bool, err error) {
	err = s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		st, ok, err := journalLookup(ctx, w.journalGet, sandbox, manifestID)
		if err != nil || ok {
			prev, found = Sent{Status: st}, ok
			return err
		}
		_, err = w.journalPut.ExecContext(ctx, sandbox, manifestID, typ, nil, now())
		return err
	})
	return prev, found, err
}

// FinishManifest records the first status of a manifest BeginManifest
// journaled, stored read: the send's reply carries it.
func (s *Store) FinishManifest(ctx context.Context, sandbox, manifestID, state, detail string) (Sent, error) {
	var out Sent
	err := s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		if _, _, err := journalLookup(ctx, w.journalGet, sandbox, manifestID); !errors.Is(err, ErrDuplicate) {
			if err == nil {
				err = errors.New("finish manifest: the id is not journaled without a status")
			}
			return err
		}
		st, err := insertItem(ctx, w, cu, sandbox, wire.ItemStatus, manifestID, true, statusDoc(manifestID, state, detail), nil)
		if err != nil {
			return err
		}
		if _, err := w.journalSetSt.ExecContext(ctx, st.Seq, sandbox, manifestID); err != nil {
			return err
		}
		out = Sent{Status: st, Fresh: true}
		return nil
	})
	return out, err
}

// DeliverHostMessage puts a message the broker writes itself (a child's
// agent ended: kind blocked) in an inbox: from names the sandbox it is
// about, there is no origin_id, and nothing is journaled. Host messages
// are not refused by the inbox quota: they are the broker's own news.
func (s *Store) DeliverHostMessage(ctx context.Context, to, from, kind, body string) (Item, error) {
	return s.DeliverHostReply(ctx, to, from, kind, body, "")
}

// DeliverHostReply is DeliverHostMessage with in_reply_to set to
// inReplyTo ("" for none): an idle report answers the spawn or restart
// that started the agent.
func (s *Store) DeliverHostReply(ctx context.Context, to, from, kind, body, inReplyTo string) (Item, error) {
	var reply *string
	if inReplyTo != "" {
		reply = &inReplyTo
	}
	var out Item
	err := s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		it, err := insertItem(ctx, w, cu, to, wire.ItemMessage, "", false, func(id string) any {
			return wire.MessageItem{Version: 1, ID: id, Type: wire.ItemMessage, From: from, Kind: kind, Body: body, InReplyTo: reply}
		}, nil)
		out = it
		return err
	})
	return out, err
}

// Interrupted is a manifest id journaled without a status: a broker died
// while it ran the manifest (at start, no request runs).
type Interrupted struct {
	Sandbox, ManifestID, Type string
}

// InterruptedManifests lists the ids journaled without a status.
func (s *Store) InterruptedManifests(ctx context.Context) (_ []Interrupted, err error) {
	defer s.settle(&err)
	rows, err := s.db.QueryContext(detach(ctx), `SELECT sandbox, manifest_id, type FROM journal WHERE status_seq IS NULL ORDER BY created_at`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Interrupted
	for rows.Next() {
		var in Interrupted
		if err := rows.Scan(&in.Sandbox, &in.ManifestID, &in.Type); err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, rows.Err()
}

// FinishInterrupted records the status of an interrupted manifest,
// unread (no reply carried it), if it still has none; false when it has.
func (s *Store) FinishInterrupted(ctx context.Context, in Interrupted, state, detail string) (bool, error) {
	done := false
	err := s.withTx(ctx, func(w *writer, cu *cacheUpdate) error {
		if _, _, err := journalLookup(ctx, w.journalGet, in.Sandbox, in.ManifestID); !errors.Is(err, ErrDuplicate) {
			return err // a status came meanwhile, or the journal failed
		}
		st, err := insertItem(ctx, w, cu, in.Sandbox, wire.ItemStatus, in.ManifestID, false, statusDoc(in.ManifestID, state, detail), nil)
		if err != nil {
			return err
		}
		if _, err := w.journalSetSt.ExecContext(ctx, st.Seq, in.Sandbox, in.ManifestID); err != nil {
			return err
		}
		done = true
		return nil
	})
	return done, err
}

// LatestStatus returns the latest status of a manifest in sandbox's inbox
// (found false when the id has none).
func (s *Store) LatestStatus(ctx context.Context, sandbox, manifestID string) (_ wire.StatusItem, _ bool, err error) {
	defer s.settle(&err)
	var doc string
	err = s.db.QueryRowContext(detach(ctx), `SELECT i.doc FROM journal j JOIN items i ON i.seq = j.status_seq
		WHERE j.sandbox = ? AND j.manifest_id = ?`, sandbox, manifestID).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return wire.StatusItem{}, false, nil
	}
	if err != nil {
		return wire.StatusItem{}, false, err
	}
	var st wire.StatusItem
	if err := json.Unmarshal([]byte(doc), &st); err != nil {
		return wire.StatusItem{}, false, err
	}
	return st, true, nil
}

// ChildMessage is the last message a child sent its orchestrator that was
// accepted (delivered): host messages about the child are not its own.
type ChildMessage struct {
	Seq  int64 // 0: none yet
	Kind string
	Body string
}

// LastChildMessage returns the last message child sent that parent's
// inbox accepted, read or not.
func (s *Store) LastChildMessage(ctx context.Context, parent, child string) (_ ChildMessage, err error) {
	defer s.settle(&err)
	var m ChildMessage
	err = s.db.QueryRowContext(detach(ctx), lastChildMessageSQL, parent, child).Scan(&m.Seq, &m.Kind, &m.Body)
	if errors.Is(err, sql.ErrNoRows) {
		return ChildMessage{}, nil
	}
	return m, err
}
