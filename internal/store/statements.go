package store

import (
	"context"
	"database/sql"
	"errors"
)

// statements are the hot queries, prepared once: modernc.org/sqlite would
// otherwise parse and plan each one on every call.
type statements struct {
	all []*sql.Stmt

	// On the pool, for reads.
	unreadItems *sql.Stmt
	historySeqs *sql.Stmt
	itemsBySeq  *sql.Stmt
	sandboxByNm *sql.Stmt
	treeOutput  *sql.Stmt
	treeInput   *sql.Stmt
}

// writer is the one connection every write transaction uses, with its
// statements prepared on it. Writes are serialized anyway (SQLite has one
// writer); a dedicated connection with explicit BEGIN IMMEDIATE / COMMIT
// also spares database/sql's per-transaction watcher goroutine.
type writer struct {
	conn         *sql.Conn
	insertItem   *sql.Stmt
	journalGet   *sql.Stmt
	journalPut   *sql.Stmt
	journalSetSt *sql.Stmt
	markRead     *sql.Stmt
	markUnread   *sql.Stmt
	messageDoc   *sql.Stmt
	unreadTotals *sql.Stmt
	unreadFrom   *sql.Stmt
	childCount   *sql.Stmt
	parentOf     *sql.Stmt
	treeMembers  *sql.Stmt
	usageAdd     *sql.Stmt
	bucketAdd    *sql.Stmt
	bucketNew    *sql.Stmt
	bucketPrune  *sql.Stmt
	// The same for tree_input.
	inputBucketAdd, inputBucketNew, inputBucketPrune *sql.Stmt
}

const itemCols = `seq, id, type, ref, doc, read`

// A history is read in two steps (ListItems). First its oldest seqs, from
// the index alone: ordered by seq, a query reading the rows would sort
// every one of them, documents and all, before the first came back. Then
// their rows by seq (+sandbox: not through the index, which would walk
// the whole history for each chunk). TestListHistoryPlan holds the plans.
const (
	historySeqsSQL = `SELECT seq FROM items WHERE sandbox = ? ORDER BY seq LIMIT ?`
	itemsBySeqSQL  = `SELECT ` + itemCols + ` FROM items WHERE seq IN (SELECT value FROM json_each(?)) AND +sandbox = ? ORDER BY seq`
	// The queries below look in one inbox through an index of their own
	// (store.go's schema), never through its read history.
	unreadItemsSQL = `SELECT ` + itemCols + ` FROM items WHERE sandbox = ? AND read = 0 ORDER BY seq`
	// octet_length reads a document's length without loading it.
	// m: the length of a message's document, NULL for a status.
	unreadTotalsSQL = `SELECT count(*), coalesce(sum(n), 0), count(m), coalesce(sum(m), 0) FROM
			(SELECT octet_length(doc) AS n, CASE WHEN type = 'message' THEN octet_length(doc) END AS m
			FROM items WHERE sandbox = ? AND read = 0 LIMIT ?)`
	unreadFromSQL = `SELECT count(*), coalesce(sum(octet_length(doc)), 0) FROM items
			WHERE sandbox = ? AND read = 0 AND type = 'message' AND json_extract(doc, '$.from') = ?`
	lastChildMessageSQL = `SELECT seq, json_extract(doc, '$.kind'), json_extract(doc, '$.body') FROM items
		WHERE sandbox = ? AND type = 'message' AND json_extract(doc, '$.from') = ? AND json_extract(doc, '$.origin_id') IS NOT NULL
		ORDER BY seq DESC LIMIT 1`
	deliveredImportSQL = `SELECT EXISTS (SELECT 1 FROM items WHERE sandbox = ? AND type = 'message'
		AND json_extract(doc, '$.imported_ref') = ? AND json_extract(doc, '$.imported_sha') = ?)`
)

const journalGetSQL = `SELECT j.status_seq, i.seq, i.id, i.type, i.ref, i.doc, i.read
	FROM journal j LEFT JOIN items i ON i.seq = j.status_seq
	WHERE j.sandbox = ? AND j.manifest_id = ?`

func (s *Store) prepare(ctx context.Context) error {
	var all []*sql.Stmt
	prep := func(p interface {
		PrepareContext(context.Context, string) (*sql.Stmt, error)
	}) func(dst **sql.Stmt, query string) error {
		return func(dst **sql.Stmt, query string) error {
			st, err := p.PrepareContext(ctx, query)
			if err != nil {
				return err
			}
			*dst = st
			all = append(all, st)
			return nil
		}
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	s.w.conn = conn
	r, w := prep(s.db), prep(conn)
	err = errors.Join(
		r(&s.q.unreadItems, unreadItemsSQL),
		r(&s.q.historySeqs, historySeqsSQL),
		r(&s.q.itemsBySeq, itemsBySeqSQL),
		r(&s.q.sandboxByNm, `SELECT `+sandboxCols+` FROM sandboxes WHERE name = ?`),
		r(&s.q.treeOutput, `SELECT coalesce(sum(output_tokens), 0) FROM tree_output WHERE tree = ? AND minute >= ?`),
		r(&s.q.treeInput, `SELECT coalesce(sum(input_tokens), 0) FROM tree_input WHERE tree = ? AND minute >= ?`),
		w(&s.w.insertItem, `INSERT INTO items (id, sandbox, type, ref, doc, read, created_at) VALUES (?,?,?,?,?,?,?)`),
		w(&s.w.journalGet, journalGetSQL),
		w(&s.w.journalPut, `INSERT INTO journal (sandbox, manifest_id, type, status_seq, created_at) VALUES (?,?,?,?,?)`),
		w(&s.w.journalSetSt, `UPDATE journal SET status_seq = ? WHERE sandbox = ? AND manifest_id = ?`),
		w(&s.w.markRead, `UPDATE items SET read = 1 WHERE id = ? AND sandbox = ? AND read = 0 RETURNING octet_length(doc), type`),
		w(&s.w.markUnread, `UPDATE items SET read = 0 WHERE id = ? AND sandbox = ? AND read = 1 RETURNING `+itemCols),
		w(&s.w.messageDoc, `SELECT doc FROM items WHERE id = ? AND sandbox = ? AND type = 'message'`),
		w(&s.w.unreadTotals, unreadTotalsSQL),
		w(&s.w.unreadFrom, unreadFromSQL),
		w(&s.w.childCount, `SELECT count(*) FROM sandboxes WHERE parent = ?`),
		w(&s.w.parentOf, `SELECT parent FROM sandboxes WHERE name = ?`),
		w(&s.w.treeMembers, `SELECT name FROM sandboxes WHERE name = ? OR parent = ?`),
		w(&s.w.usageAdd, usageAddSQL),
		w(&s.w.bucketAdd, bucketAddSQL),
		w(&s.w.bucketNew, bucketNewSQL),
		w(&s.w.bucketPrune, bucketPruneSQL),
		w(&s.w.inputBucketAdd, inputBucketAddSQL),
		w(&s.w.inputBucketNew, inputBucketNewSQL),
		w(&s.w.inputBucketPrune, inputBucketPruneSQL),
	)
	s.q.all = all
	return err
}

func (s *Store) closeStatements() {
	for _, st := range s.q.all {
		st.Close()
	}
	if s.w.conn != nil {
		s.w.conn.Close()
	}
}
