package broker_test

// Benchmarks of the broker's round trips against their bare floors, run in
// one `go test -bench` so the results read as ratios (docs/benchmarks.md):
//
//	BenchmarkList, BenchmarkRead  vs  BenchmarkRawEcho          (target <= 3x)
//	BenchmarkSendMessage          vs  BenchmarkRawSQLiteCommit  (target <= 1.5x)
//	BenchmarkSendConcurrent       vs  BenchmarkRawSQLiteCommit  (throughput >= 3x)
//	BenchmarkListConcurrent       the same request path, no write (CPU per op)
//
// Every temp dir comes from b.TempDir(), so the broker's broker.db and the
// bare SQLite file are on the same filesystem. Benchmarks report; they
// assert nothing about time.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"agentbox/internal/store"
	"agentbox/internal/testutil/serve"
	"agentbox/internal/wire"
)

// benchListLine is a `list` request exactly as the CLI sends it.
var benchListLine = []byte(`{"v":1,"op":"list"}` + "\n")

// benchRoundTrip writes line and reads one reply line.
func benchRoundTrip(b *testing.B, conn net.Conn, r *bufio.Reader, line []byte) []byte {
	if _, err := conn.Write(line); err != nil {
		b.Fatal(err)
	}
	reply, err := wire.ReadLine(r, wire.MaxLineBytes)
	if err != nil {
		b.Fatal(err)
	}
	return reply
}

// benchOK fails unless reply is a success line. The broker encodes
// wire.Response with v and ok first, so a prefix check is exact and cheap.
func benchOK(b *testing.B, reply []byte) {
	if !bytes.HasPrefix(reply, []byte(`{"v":1,"ok":true`)) {
		b.Fatalf("reply is not a success: %s", reply)
	}
}

// BenchmarkRawEcho is the floor for a socket round trip: a Unix-socket echo
// server that reads one line and writes it back, on a warm connection, with
// the same framing code (wire.ReadLine) as the broker.
func BenchmarkRawEcho(b *testing.B) {
	ln, err := net.Listen("unix", filepath.Join(b.TempDir(), "echo.sock"))
	if err != nil {
		b.Fatal(err)
	}
	serve.Serve(b, ln, func(conn net.Conn) {
		r := bufio.NewReaderSize(conn, 4096)
		for {
			line, err := wire.ReadLine(r, wire.MaxLineBytes)
			if err != nil {
				return
			}
			if _, err := conn.Write(append(line, '\n')); err != nil {
				return
			}
		}
	})
	conn, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	benchRoundTrip(b, conn, r, benchListLine) // warm up
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if reply := benchRoundTrip(b, conn, r, benchListLine); len(reply) != len(benchListLine)-1 {
			b.Fatalf("echo: %q", reply)
		}
	}
}

// benchInbox starts a broker with orchestrator "o" and child "c" holding
// one unread message, and returns a warm raw connection of c and the
// message's id.
func benchInbox(b *testing.B) (*testEnv, *rawConn, string) {
	e := newTestEnv(b)
	e.orchestrator("o")
	e.child("c", "o")
	sendMessage(b, e.client("o"), map[string]any{"id": "m-1", "to": "c", "body": "please rebase onto main and run the tests"})
	items := unread(b, e.client("c"))
	if len(items) != 1 {
		b.Fatalf("child inbox: %d unread items, want 1", len(items))
	}
	return e, e.raw("c"), items[0].ID
}

// BenchmarkList: a `list` round trip (one unread message in the inbox) on a
// warm connection against the real broker.
func BenchmarkList(b *testing.B) {
	_, c, id := benchInbox(b)
	reply := benchRoundTrip(b, c, c.r, benchListLine)
	benchOK(b, reply)
	if !bytes.Contains(reply, []byte(id)) {
		b.Fatalf("list does not show %s: %s", id, reply)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		benchOK(b, benchRoundTrip(b, c, c.r, benchListLine))
	}
}

// BenchmarkRead: a `read` with keep=true (the item stays unread, so every
// iteration reads the same item) on a warm connection.
func BenchmarkRead(b *testing.B) {
	_, c, id := benchInbox(b)
	line := []byte(`{"v":1,"op":"read","args":{"id":"` + id + `","keep":true}}` + "\n")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		benchOK(b, benchRoundTrip(b, c, c.r, line))
	}
	b.StopTimer()
	// keep=true must really have kept it.
	if reply := benchRoundTrip(b, c, c.r, benchListLine); !bytes.Contains(reply, []byte(id)) {
		b.Fatalf("read keep=true consumed %s: %s", id, reply)
	}
}

// benchSQLiteDSN is internal/store's DSN: same driver, same pragmas.
func benchSQLiteDSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

// benchDoc is a message document of the size a send stores.
const benchDoc = `{"version":1,"id":"h-0123abcd","type":"message","from":"o","kind":"note","body":"please rebase onto main and run the tests","in_reply_to":null,"origin_id":"m-1"}`

// BenchmarkRawSQLiteCommit is the floor for a durable send: one INSERT in
// one BEGIN IMMEDIATE ... COMMIT at synchronous=FULL in WAL mode, with the
// broker's driver (modernc.org/sqlite), on a file in b.TempDir().
func BenchmarkRawSQLiteCommit(b *testing.B) {
	dir := b.TempDir()
	b.Logf("bare.db on %s (%s)", benchFSType(dir), filepath.Dir(dir))
	db, err := sql.Open("sqlite", benchSQLiteDSN(filepath.Join(dir, "bare.db")))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		b.Fatalf("journal_mode %q, %v", mode, err)
	}
	var sync int
	if err := db.QueryRow("PRAGMA synchronous").Scan(&sync); err != nil || sync != 2 {
		b.Fatalf("synchronous %d (want 2, FULL), %v", sync, err)
	}
	if _, err := db.Exec(`CREATE TABLE t (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, doc TEXT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	i := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		i++
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO t (id, doc) VALUES (?, ?)`, "h-"+strconv.Itoa(i), benchDoc); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawSQLiteCommitSchema is the floor for a send on the broker's
// own schema: the rows a delivered message writes (a journal row, the
// message in the recipient's inbox, the status in the sender's) in one
// durable transaction, with no lookups, on a broker.db that store.Open
// created. The gap between it and BenchmarkRawSQLiteCommit is what the
// schema's indexes cost; the gap between it and BenchmarkSendMessage is
// what the broker adds.
func BenchmarkRawSQLiteCommitSchema(b *testing.B) {
	path := filepath.Join(b.TempDir(), "broker.db")
	st, err := store.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	st.Close()
	db, err := sql.Open("sqlite", benchSQLiteDSN(path))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	for _, name := range []string{"o", "c"} {
		if _, err := db.Exec(`INSERT INTO sandboxes (name, uuid, role, branch, repo, state, created_at) VALUES (?, ?, 'orchestrator', 'main', '/r', 'running', 0)`, name, "u-"+name); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	i := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		i++
		n := strconv.Itoa(i)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO journal (sandbox, manifest_id, type, created_at) VALUES ('o', ?, 'message', 0)`, "m-"+n); err != nil {
			b.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO items (id, sandbox, type, ref, doc, read, created_at) VALUES (?, 'c', 'message', '', ?, 0, 0)`, "h-m"+n, benchDoc); err != nil {
			b.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO items (id, sandbox, type, ref, doc, read, created_at) VALUES (?, 'o', 'status', ?, ?, 1, 0)`, "h-s"+n, "m-"+n, benchDoc); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSendMessage: a durable message send, orchestrator -> its child,
// a new manifest id each iteration, reply (the "done" status) received.
// The child never reads, so its inbox quota is raised far past b.N: every
// send is delivered, and every send still runs the quota check.
func BenchmarkSendMessage(b *testing.B) {
	e := newTestEnvQuota(b, store.Quota{MaxUnreadItems: 1 << 30, MaxUnreadBytes: 1 << 50, TreeMaxUnreadItems: 1 << 30, TreeMaxUnreadBytes: 1 << 50})
	e.orchestrator("o")
	e.child("c", "o")
	c := e.raw("o")
	const prefix = `{"v":1,"op":"send","args":{"manifest":{"version":1,"type":"message","to":"c","body":"please rebase onto main and run the tests","id":"m-`
	buf := make([]byte, 0, 256)
	n := 0
	send := func() []byte {
		n++
		buf = append(strconv.AppendInt(append(buf[:0], prefix...), int64(n), 10), `"}}}`+"\n"...)
		return benchRoundTrip(b, c, c.r, buf)
	}
	if reply := send(); !bytes.Contains(reply, []byte(`"state":"done"`)) {
		b.Fatalf("send: %s", reply)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		benchOK(b, send())
	}
	b.StopTimer()
	// Every send was delivered: the child has one unread message per send.
	items, err := e.b.Store().ListItems(context.Background(), "c", false)
	if err != nil {
		b.Fatal(err)
	}
	if got := len(items); got != n {
		b.Fatalf("child has %d unread messages after %d sends", len(items), n)
	}
}

// benchSenders is how many sandboxes send at once in BenchmarkSendConcurrent.
const benchSenders = 8

// BenchmarkSendConcurrent: benchSenders children of "o", each on its own
// warm connection, send durable messages to "o" at once; one op is one
// send, so RawSQLiteCommit's ns/op over this one is the throughput ratio.
// Concurrent sends share the fsync that makes them durable (group commit
// in internal/store).
func BenchmarkSendConcurrent(b *testing.B) {
	e := newTestEnvQuota(b, store.Quota{MaxUnreadItems: 1 << 30, MaxUnreadBytes: 1 << 50, TreeMaxUnreadItems: 1 << 30, TreeMaxUnreadBytes: 1 << 50})
	e.orchestrator("o")
	conns := make([]*rawConn, benchSenders)
	for i := range conns {
		name := "c" + strconv.Itoa(i)
		e.child(name, "o")
		conns[i] = e.raw(name)
	}
	const prefix = `{"v":1,"op":"send","args":{"manifest":{"version":1,"type":"message","body":"please rebase onto main and run the tests","id":"m-`
	var sent atomic.Int64
	sender := func(c *rawConn, ops int64) {
		buf := make([]byte, 0, 256)
		for n := int64(1); n <= ops; n++ {
			buf = append(strconv.AppendInt(append(buf[:0], prefix...), sent.Add(1), 10), `"}}}`+"\n"...)
			if _, err := c.Write(buf); err != nil {
				b.Error(err)
				return
			}
			reply, err := wire.ReadLine(c.r, wire.MaxLineBytes)
			if err != nil || !bytes.Contains(reply, []byte(`"state":"done"`)) {
				b.Errorf("send: %s %v", reply, err)
				return
			}
		}
	}
	b.ReportAllocs()
	commits0, syncs0 := e.b.Store().Counts()
	cpu0 := processCPU(b)
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, c := range conns {
		// Share b.N out: the first b.N%benchSenders senders send one more.
		ops := int64(b.N / benchSenders)
		if i < b.N%benchSenders {
			ops++
		}
		wg.Go(func() { sender(c, ops) })
	}
	wg.Wait()
	b.StopTimer()
	commits, syncs := e.b.Store().Counts()
	// CPU of the whole process (broker and the senders' sockets) per send:
	// with 2 CPUs, half of it is the shortest a send can take on average.
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-us/send")
	b.ReportMetric(float64(commits-commits0)/float64(b.N), "commits/send")
	b.ReportMetric(float64(syncs-syncs0)/float64(b.N), "syncs/send")
	items, err := e.b.Store().ListItems(context.Background(), "o", false)
	if err != nil {
		b.Fatal(err)
	}
	if got := int64(len(items)); got != sent.Load() {
		b.Fatalf("o has %d unread messages after %d sends", got, sent.Load())
	}
}

// BenchmarkListConcurrent is SendConcurrent's request path without the
// store's write: the same benchSenders children, each on its own warm
// connection, send `list` (an empty inbox) at once. Its cpu-us/op against
// SendConcurrent's cpu-us/send is how much of a send's CPU the request
// path (framing, decoding, dispatch, the reply) can account for.
func BenchmarkListConcurrent(b *testing.B) {
	e := newTestEnv(b)
	e.orchestrator("o")
	conns := make([]*rawConn, benchSenders)
	for i := range conns {
		name := "c" + strconv.Itoa(i)
		e.child(name, "o")
		conns[i] = e.raw(name)
	}
	lister := func(c *rawConn, ops int) {
		for range ops {
			if _, err := c.Write(benchListLine); err != nil {
				b.Error(err)
				return
			}
			reply, err := wire.ReadLine(c.r, wire.MaxLineBytes)
			if err != nil || !bytes.HasPrefix(reply, []byte(`{"v":1,"ok":true`)) {
				b.Errorf("list: %s %v", reply, err)
				return
			}
		}
	}
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, c := range conns {
		ops := b.N / benchSenders
		if i < b.N%benchSenders {
			ops++
		}
		wg.Go(func() { lister(c, ops) })
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchFSType names the filesystem holding dir (statfs magic), so the
// log says whether the commit floor was measured on tmpfs or a disk.
func benchFSType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	names := map[int64]string{0xEF53: "ext2/3/4", 0x01021994: "tmpfs", 0x794c7630: "overlayfs",
		0x9123683E: "btrfs", 0x58465342: "xfs", 0x2FC12FC1: "zfs", 0x65735546: "fuse"}
	if n, ok := names[int64(st.Type)]; ok {
		return n
	}
	return fmt.Sprintf("statfs type %#x", st.Type)
}

// BenchmarkSendFairness: a quiet orchestrator's durable send, alone
// (unloaded) and while another orchestrator floods the broker with sends
// on 7 connections (flood7). It reports the quiet send's p50 and p99
// (ns); docs/benchmarks.md reads flood7's p99 against unloaded's (target
// <= 2x). The flood's own sends are not measured.
func BenchmarkSendFairness(b *testing.B) {
	for _, flooders := range []int{0, 7} {
		name := "unloaded"
		if flooders > 0 {
			name = fmt.Sprintf("flood%d", flooders)
		}
		b.Run(name, func(b *testing.B) {
			e := newTestEnvQuota(b, store.Quota{MaxUnreadItems: 1 << 30, MaxUnreadBytes: 1 << 50, TreeMaxUnreadItems: 1 << 30, TreeMaxUnreadBytes: 1 << 50})
			e.orchestrator("quiet")
			e.child("qc", "quiet")
			e.orchestrator("flood")
			e.child("fc", "flood")
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for i := range flooders {
				c := e.raw("flood")
				wg.Go(func() {
					for n := 0; ; n++ {
						select {
						case <-stop:
							return
						default:
						}
						line := fmt.Sprintf(`{"v":1,"op":"send","args":{"manifest":{"version":1,"type":"message","to":"fc","body":"flood","id":"f-%d-%d"}}}`+"\n", i, n)
						if _, err := c.Write([]byte(line)); err != nil {
							return
						}
						if _, err := wire.ReadLine(c.r, wire.MaxLineBytes); err != nil {
							return
						}
					}
				})
			}
			c := e.raw("quiet")
			var lat []time.Duration
			n := 0
			b.ResetTimer()
			for b.Loop() {
				n++
				line := `{"v":1,"op":"send","args":{"manifest":{"version":1,"type":"message","to":"qc","body":"quiet","id":"q-` + strconv.Itoa(n) + `"}}}` + "\n"
				t0 := time.Now()
				benchOK(b, benchRoundTrip(b, c, c.r, []byte(line)))
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			close(stop)
			wg.Wait()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
		})
	}
}
