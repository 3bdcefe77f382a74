package broker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentbox/internal/orchestrate"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// BenchmarkStorageFlood runs the storage flood patterns against a broker
// with the default budgets (scripts/bench-storage.sh, docs/benchmarks.md).
// One op: an orchestrator with DefaultMaxChildren failed children; 60 KiB
// messages to them round-robin until the tree budget refuses one; a child
// sends 12 MiB its orchestrator reads; the retention sweep runs as if 7
// days had passed; every sandbox is deleted (a destroy's store part) and
// the sweep runs again. It reports what the budgets let in and broker.db's
// size against its empty size, measured in the same op.
func BenchmarkStorageFlood(b *testing.B) {
	body := strings.Repeat("x", 60<<10)
	for b.Loop() {
		m := storageFlood(b, body)
		b.ReportMetric(m.treeMiB, "tree-MiB")
		b.ReportMetric(m.readLeftMiB, "read-left-MiB")
		b.ReportMetric(float64(m.full)/float64(m.empty), "full/empty")
		b.ReportMetric(float64(m.after)/float64(m.empty), "after/empty")
	}
}

type floodFigures struct {
	treeMiB, readLeftMiB float64
	empty, full, after   int64
}

func storageFlood(b *testing.B, body string) floodFigures {
	dir := b.TempDir()
	br, err := Open(Config{StateDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	ctx := context.Background()
	st := br.store
	db := filepath.Join(dir, DBFile)
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(st.CreateSandbox(ctx, store.Sandbox{Name: "lead", UUID: "u-lead", Role: wire.RoleOrchestrator, Branch: "main", Repo: "/r", State: store.StateRunning}))
	kids := make([]string, orchestrate.DefaultMaxChildren)
	for i := range kids {
		kids[i] = fmt.Sprintf("kid-%02d", i)
		must(st.CreateSandbox(ctx, store.Sandbox{Name: kids[i], UUID: "u-" + kids[i], Role: wire.RoleChild, Parent: "lead",
			Branch: kids[i], Repo: "/r", State: store.StateFailed}))
	}
	br.sweepStorage(time.Now())
	var f floodFigures
	f.empty = fileBytes(b, db)
	var delivered int64
	for i := 0; ; i++ {
		_, err := st.DeliverMessage(ctx, store.Delivery{From: "lead", To: kids[i%len(kids)], ManifestID: fmt.Sprintf("m-%d", i), Kind: "note", Body: body})
		if _, full := errors.AsType[*store.TreeFullError](err); full {
			break
		}
		must(err)
		delivered += int64(len(body))
	}
	f.treeMiB = float64(delivered) / (1 << 20)
	for i := range 200 {
		_, err := st.DeliverMessage(ctx, store.Delivery{From: kids[0], To: "lead", ManifestID: fmt.Sprintf("up-%d", i), Kind: "note", Body: body})
		must(err)
		it, ok, err := st.FirstUnread(ctx, "lead", func(store.Item) bool { return true })
		must(err)
		if ok {
			must(st.Ack(ctx, "lead", it.ID))
		}
	}
	f.full = fileBytes(b, db)
	br.sweepStorage(time.Now().Add(DefaultReadRetention + time.Hour))
	all, err := st.ListItems(ctx, "lead", true)
	must(err)
	for _, it := range all {
		if it.Read && it.Type == wire.ItemMessage {
			f.readLeftMiB += float64(len(it.Doc)) / (1 << 20)
		}
	}
	for _, k := range kids {
		must(st.DeleteSandbox(ctx, k))
	}
	must(st.DeleteSandbox(ctx, "lead"))
	br.sweepStorage(time.Now())
	f.after = fileBytes(b, db)
	return f
}

// fileBytes is the size of a database file with its WAL, once
// checkpointed (as the sweep's Shrink does), so the pages count once.
func fileBytes(b *testing.B, path string) int64 {
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		b.Fatal(err)
	}
	_, err = db.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
	db.Close()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}
