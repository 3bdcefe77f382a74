package store

import (
	"agentbox/internal/wire"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// schemaV1 is broker.db's schema version 1, as commit 4b7a053 created it.
const schemaV1 = `
CREATE TABLE IF NOT EXISTS sandboxes (
	name       TEXT PRIMARY KEY,
	uuid       TEXT NOT NULL UNIQUE,
	role       TEXT NOT NULL CHECK (role IN ('orchestrator','child')),
	parent     TEXT NOT NULL DEFAULT '',
	branch     TEXT NOT NULL,
	repo       TEXT NOT NULL,
	state      TEXT NOT NULL,
	socket_dir TEXT NOT NULL DEFAULT '',
	grant_doc  TEXT NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS items (
	seq        INTEGER PRIMARY KEY,
	id         TEXT NOT NULL,
	sandbox    TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
	type       TEXT NOT NULL,
	ref        TEXT NOT NULL DEFAULT '',
	doc        TEXT NOT NULL,
	read       INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS items_by_sandbox ON items(sandbox, id);
CREATE TABLE IF NOT EXISTS journal (
	sandbox     TEXT NOT NULL REFERENCES sandboxes(name) ON DELETE CASCADE,
	manifest_id TEXT NOT NULL,
	type        TEXT NOT NULL,
	status_seq  INTEGER,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (sandbox, manifest_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS socket_dirs (
	dir TEXT PRIMARY KEY
) WITHOUT ROWID;
PRAGMA user_version = 1;
`

// The rows of a version 1 broker.db: an orchestrator o and its child c;
// c has one unread message from o, o the read status of that send.
const (
	v1Message = `{"version":1,"id":"h-0000000a","type":"message","from":"o","kind":"note","body":"hello","in_reply_to":null,"origin_id":"m-1"}`
	v1Status  = `{"version":1,"id":"h-0000000b","type":"status","ref":"m-1","state":"done","detail":"delivered to c"}`
)

var v1Rows = []string{
	`INSERT INTO sandboxes (name, uuid, role, parent, branch, repo, state, socket_dir, grant_doc, created_at) VALUES
		('o', 'uuid-o', 'orchestrator', '', 'main', '/r', 'running', '/state/sock/uuid-o.00', '{"version":1}', 1),
		('c', 'uuid-c', 'child', 'o', 'work/c', '/r', 'stopped', '/state/sock/uuid-c.00', '', 2)`,
	`INSERT INTO socket_dirs (dir) VALUES ('/state/sock/uuid-o.00'), ('/state/sock/uuid-c.00')`,
	`INSERT INTO items (seq, id, sandbox, type, ref, doc, read, created_at) VALUES
		(1, 'h-0000000a', 'c', 'message', '', '` + v1Message + `', 0, 3),
		(2, 'h-0000000b', 'o', 'status', 'm-1', '` + v1Status + `', 1, 3)`,
	`INSERT INTO journal (sandbox, manifest_id, type, status_seq, created_at) VALUES ('o', 'm-1', 'message', 2, 3)`,
}

// makeV1 writes a version 1 broker.db at path, mode 0644 as a broker of
// that version could leave it.
func makeV1(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range append([]string{schemaV1}, v1Rows...) {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

func userVersion(t *testing.T, s *Store) int {
	t.Helper()
	var v int
	if err := s.db.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func columns(t *testing.T, s *Store, table string) []string {
	t.Helper()
	rows, err := s.db.Query(`SELECT name FROM pragma_table_info(?)`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

func TestOpenMigratesSchemaV1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "broker.db")
	makeV1(t, path)
	ctx := context.Background()
	for _, pass := range []string{"migrated", "reopened"} {
		s, err := Open(path)
		if err != nil {
			t.Fatalf("%s: open: %v", pass, err)
		}
		if v := userVersion(t, s); v != schemaVersion {
			t.Fatalf("%s: user_version %d, want %d", pass, v, schemaVersion)
		}
		if cols := columns(t, s, "sandboxes"); !slices.Contains(cols, "host_uid") || !slices.Contains(cols, "imported") {
			t.Fatalf("%s: sandboxes columns %v", pass, cols)
		}
		if cols := columns(t, s, "finishes"); !slices.Contains(cols, "manifest_id") {
			t.Fatalf("%s: finishes columns %v", pass, cols)
		}
		if cols := columns(t, s, "usage"); !slices.Contains(cols, "output_tokens") {
			t.Fatalf("%s: usage columns %v", pass, cols)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: broker.db mode %v, %v", pass, fi.Mode(), err)
		}
		// The rows are kept; the new columns read as their defaults.
		sbs, err := s.Sandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []Sandbox{
			{Name: "c", UUID: "uuid-c", Role: wire.RoleChild, Parent: "o", Branch: "work/c", Repo: "/r", State: StateStopped, SocketDir: "/state/sock/uuid-c.00"},
			{Name: "o", UUID: "uuid-o", Role: wire.RoleOrchestrator, Branch: "main", Repo: "/r", State: StateRunning, SocketDir: "/state/sock/uuid-o.00", Grant: `{"version":1}`},
		}
		if pass == "reopened" {
			want[1].HostUID, want[1].Imported = 4242, "abc"
		}
		if !slices.Equal(sbs, want) {
			t.Fatalf("%s: sandboxes\n%+v\nwant\n%+v", pass, sbs, want)
		}
		items, err := s.ListItems(ctx, "c", false)
		if err != nil || len(items) != 1 || items[0].ID != "h-0000000a" || string(items[0].Doc) != v1Message {
			t.Fatalf("%s: c's unread %+v, %v", pass, items, err)
		}
		hist, err := s.ListItems(ctx, "o", true)
		if err != nil || len(hist) != 1 || !hist[0].Read || string(hist[0].Doc) != v1Status {
			t.Fatalf("%s: o's history %+v, %v", pass, hist, err)
		}
		// The journal is kept: a resend of m-1 returns its status.
		sent, err := s.DeliverMessage(ctx, Delivery{From: "o", To: "c", ManifestID: "m-1", Kind: "note", Body: "again"})
		if err != nil || sent.Fresh || sent.Status.ID != "h-0000000b" {
			t.Fatalf("%s: resend of m-1: %+v, %v", pass, sent, err)
		}
		// Socket dirs claimed under version 1 stay claimed.
		if err := s.ClaimSocketDir(ctx, "o", "/state/sock/uuid-c.00"); !errors.Is(err, ErrExists) {
			t.Fatalf("%s: claiming a version 1 socket dir again: %v", pass, err)
		}
		if pass == "migrated" {
			// The new columns and table work.
			if err := s.ClaimHostUID(ctx, 4242); err != nil {
				t.Fatal(err)
			}
			if err := s.updateOne(ctx, `UPDATE sandboxes SET host_uid = ? WHERE name = ?`, 4242, "o"); err != nil {
				t.Fatal(err)
			}
			if err := s.SetImported(ctx, "o", "abc"); err != nil {
				t.Fatal(err)
			}
		} else if err := s.ClaimHostUID(ctx, 4242); !errors.Is(err, ErrExists) {
			t.Fatalf("%s: claiming host uid 4242 again: %v", pass, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOpenMigratesSchemaV3: a version 3 broker.db (the last without
// usage) gains the usage tables, keeps its rows, and its usage survives a
// reopen.
func TestOpenMigratesSchemaV3(t *testing.T) {
	path := filepath.Join(t.TempDir(), "broker.db")
	makeV1(t, path)
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for v := 1; v < 3; v++ {
		if _, err := db.Exec(migrations[v]); err != nil {
			t.Fatalf("to version %d: %v", v+1, err)
		}
	}
	var tables int
	db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name IN ('usage', 'tree_output')`).Scan(&tables)
	db.Close()
	if tables != 0 {
		t.Fatalf("the version 3 database has %d usage tables", tables)
	}
	ctx := context.Background()
	for _, pass := range []string{"migrated", "reopened"} {
		s, err := Open(path)
		if err != nil {
			t.Fatalf("%s: open: %v", pass, err)
		}
		if v := userVersion(t, s); v != schemaVersion {
			t.Fatalf("%s: user_version %d, want %d", pass, v, schemaVersion)
		}
		if sbs, err := s.Sandboxes(ctx); err != nil || len(sbs) != 2 {
			t.Fatalf("%s: sandboxes %+v, %v", pass, sbs, err)
		}
		if pass == "migrated" {
			if err := s.AddUsage(ctx, "c", "uuid-c", "o", Usage{Requests: 1, OutputTokens: 9}, t0); err != nil {
				t.Fatalf("%s: %v", pass, err)
			}
		}
		rows, err := s.UsageRows(ctx)
		if err != nil || len(rows) != 1 || rows[0].UUID != "uuid-c" || rows[0].OutputTokens != 9 {
			t.Fatalf("%s: usage rows %+v, %v", pass, rows, err)
		}
		if n, err := s.TreeOutputSince(ctx, "o", t0); err != nil || n != 9 {
			t.Fatalf("%s: o's output %d, %v", pass, n, err)
		}
		s.Close()
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "broker.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	newer := schemaVersion + 1
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", newer)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(path)
	if err == nil {
		s.Close()
		t.Fatalf("opened a broker.db of schema version %d", newer)
	}
	if want := fmt.Sprintf("broker.db has schema version %d; this jailbee knows %d", newer, schemaVersion); !strings.Contains(err.Error(), want) {
		t.Fatalf("open: %v", err)
	}
}

// TestHostUIDClaimsAreForever: a host uid is given once, ever: deleting
// the sandbox that had it, or reopening broker.db, does not free it.
func TestHostUIDClaimsAreForever(t *testing.T) {
	s, path := openTestStore(t)
	ctx := context.Background()
	if err := s.ClaimHostUID(ctx, 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := s.ClaimHostUID(ctx, 1<<30); !errors.Is(err, ErrExists) {
		t.Fatalf("second claim: %v", err)
	}
	if err := s.CreateSandbox(ctx, Sandbox{Name: "x", UUID: "ux", Role: wire.RoleOrchestrator, Branch: "main", Repo: "/r", State: StateRunning, HostUID: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if sb, err := s.Sandbox(ctx, "x"); err != nil || sb.HostUID != 1<<30 {
		t.Fatalf("x: %+v, %v", sb, err)
	}
	if err := s.DeleteSandbox(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if err := s.ClaimHostUID(ctx, 1<<30); !errors.Is(err, ErrExists) {
		t.Fatalf("claim after the sandbox was deleted: %v", err)
	}
	s.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.ClaimHostUID(ctx, 1<<30); !errors.Is(err, ErrExists) {
		t.Fatalf("claim after reopening: %v", err)
	}
	if err := s.ClaimHostUID(ctx, 1<<30+1); err != nil {
		t.Fatalf("another uid: %v", err)
	}
}
