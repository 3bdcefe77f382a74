package store

import (
	"database/sql"
	"errors"
)

// statements are the hot queries, prepared once: modernc.org/sqlite would
// otherwise parse and plan each one on every call.
type statements struct {
	all []*sql.Stmt

	unreadItems  *sql.Stmt
	allItems     *sql.Stmt
	itemByID     *sql.Stmt
	markRead     *sql.Stmt
	markUnread   *sql.Stmt
	insertItem   *sql.Stmt
	journalGet   *sql.Stmt
	journalPut   *sql.Stmt
	journalSetSt *sql.Stmt
	messageDoc   *sql.Stmt
	sandboxByNm  *sql.Stmt
}

const itemCols = `seq, id, type, ref, doc, read`

func (s *Store) prepare() error {
	prep := func(dst **sql.Stmt, query string) error {
		st, err := s.db.Prepare(query)
		if err != nil {
			return err
		}
		*dst = st
		s.q.all = append(s.q.all, st)
		return nil
	}
	return errors.Join(
		prep(&s.q.unreadItems, `SELECT `+itemCols+` FROM items WHERE sandbox = ? AND read = 0 ORDER BY seq`),
		prep(&s.q.allItems, `SELECT `+itemCols+` FROM items WHERE sandbox = ? ORDER BY seq`),
		prep(&s.q.itemByID, `SELECT `+itemCols+` FROM items WHERE id = ? AND sandbox = ?`),
		prep(&s.q.markRead, `UPDATE items SET read = 1 WHERE id = ? AND sandbox = ? AND read = 0`),
		prep(&s.q.markUnread, `UPDATE items SET read = 0 WHERE id = ? AND sandbox = ? AND read = 1 RETURNING `+itemCols),
		prep(&s.q.insertItem, `INSERT INTO items (id, sandbox, type, ref, doc, read, created_at) VALUES (?,?,?,?,?,?,?)`),
		prep(&s.q.journalGet, `SELECT j.status_seq, i.seq, i.id, i.type, i.ref, i.doc, i.read
			FROM journal j LEFT JOIN items i ON i.seq = j.status_seq
			WHERE j.sandbox = ? AND j.manifest_id = ?`),
		prep(&s.q.journalPut, `INSERT INTO journal (sandbox, manifest_id, type, status_seq, created_at) VALUES (?,?,?,?,?)`),
		prep(&s.q.journalSetSt, `UPDATE journal SET status_seq = ? WHERE sandbox = ? AND manifest_id = ?`),
		prep(&s.q.messageDoc, `SELECT doc FROM items WHERE id = ? AND sandbox = ? AND type = 'message'`),
		prep(&s.q.sandboxByNm, `SELECT `+sandboxCols+` FROM sandboxes WHERE name = ?`),
	)
}

func (q *statements) close() {
	for _, st := range q.all {
		st.Close()
	}
}
