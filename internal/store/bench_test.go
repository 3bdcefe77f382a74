package store_test

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// BenchmarkDeliverMessage is the store's part of a durable send: one
// transaction that journals the id and writes the message and its status.
// BenchmarkBareCommit beside it is the floor: one INSERT and COMMIT at
// synchronous=FULL in WAL mode with the same driver and pragmas.
func BenchmarkDeliverMessage(b *testing.B) {
	st, err := store.Open(filepath.Join(b.TempDir(), "broker.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for _, sb := range []store.Sandbox{
		{Name: "o", UUID: "u1", Role: wire.RoleOrchestrator, Branch: "main", Repo: "/r", State: "running"},
		{Name: "c", UUID: "u2", Role: wire.RoleChild, Parent: "o", Branch: "c", Repo: "/r", State: "running"},
	} {
		if err := st.CreateSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		i++
		if _, err := st.DeliverMessage(ctx, store.Delivery{From: "o", To: "c", ManifestID: "m-" + strconv.Itoa(i),
			Kind: "note", Body: "please rebase onto main and run the tests"}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDeliverConcurrent is BenchmarkDeliverMessage from 8 senders
// at once (8 children of o, each sending to o): one op is one durable
// delivery, so BenchmarkBareCommit's ns/op over this one is the throughput
// ratio. Concurrent deliveries share the fsync that makes them durable.
func BenchmarkDeliverConcurrent(b *testing.B) {
	const senders = 8
	st, err := store.Open(filepath.Join(b.TempDir(), "broker.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	st.SetQuota(store.Quota{MaxUnreadItems: 1 << 30, MaxUnreadBytes: 1 << 50, TreeMaxUnreadItems: 1 << 30, TreeMaxUnreadBytes: 1 << 50})
	ctx := context.Background()
	if err := st.CreateSandbox(ctx, store.Sandbox{Name: "o", UUID: "u", Role: wire.RoleOrchestrator, Branch: "main", Repo: "/r", State: "running"}); err != nil {
		b.Fatal(err)
	}
	for i := range senders {
		n := "c" + strconv.Itoa(i)
		if err := st.CreateSandbox(ctx, store.Sandbox{Name: n, UUID: "u" + n, Role: wire.RoleChild, Parent: "o", Branch: n, Repo: "/r", State: "running"}); err != nil {
			b.Fatal(err)
		}
	}
	var sent atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range senders {
		ops := b.N / senders
		if i < b.N%senders {
			ops++
		}
		from := "c" + strconv.Itoa(i)
		wg.Go(func() {
			for range ops {
				id := "m-" + strconv.FormatInt(sent.Add(1), 10)
				if _, err := st.DeliverMessage(ctx, store.Delivery{From: from, To: "o", ManifestID: id,
					Kind: "note", Body: "please rebase onto main and run the tests"}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkAddUsage is the store's part of recording one model response:
// one transaction that adds to the sandbox's totals and to its tree's
// output bucket of the minute (a new bucket, with its prune, once a
// minute). Read it against BenchmarkBareCommit.
func BenchmarkAddUsage(b *testing.B) {
	st, err := store.Open(filepath.Join(b.TempDir(), "broker.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	u := store.Usage{Requests: 1, InputTokens: 1200, OutputTokens: 350, CacheReadInputTokens: 40000, CacheCreationInputTokens: 800}
	for b.Loop() {
		if err := st.AddUsage(ctx, "c", "u2", "o", u, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTreeOutputSince is an hourly budget's check before a request:
// the last hour of a tree whose buckets fill a whole day, beside three
// other trees as busy.
func BenchmarkTreeOutputSince(b *testing.B) {
	st, err := store.Open(filepath.Join(b.TempDir(), "broker.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	now := time.Now()
	for m := range 24 * 60 {
		for tree := range 4 {
			name := "o" + strconv.Itoa(tree)
			if err := st.AddUsage(ctx, name, "u"+name, name, store.Usage{Requests: 1, OutputTokens: 10}, now.Add(-time.Duration(m)*time.Minute)); err != nil {
				b.Fatal(err)
			}
		}
	}
	for b.Loop() {
		n, err := st.TreeOutputSince(ctx, "o3", now.Add(-time.Hour))
		if err != nil || n != 610 {
			b.Fatal(n, err)
		}
	}
}

func BenchmarkBareCommit(b *testing.B) {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+filepath.Join(b.TempDir(), "bare.db")+"?"+q.Encode())
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE t (seq INTEGER PRIMARY KEY, doc TEXT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	ins, err := db.Prepare(`INSERT INTO t (doc) VALUES (?)`)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		tx, err := db.Begin()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.Stmt(ins).Exec(`{"version":1,"id":"h-0123abcd","type":"message","from":"o","kind":"note","body":"please rebase onto main and run the tests","in_reply_to":null,"origin_id":"m-1"}`); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}
