package orchestrate

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentbox/internal/store"
)

// TestWorkerLogsBounded: opening a worker log keeps at most MaxWorkerLogs
// in the directory, removing the oldest: at the bound nothing goes, one
// past it the oldest does; the log just opened stays even when, a name
// and id used again, it is the oldest.
func TestWorkerLogsBounded(t *testing.T) {
	dir := t.TempDir()
	o := &Orchestrator{LogDir: dir}
	old := time.Now().Add(-time.Hour)
	for i := range MaxWorkerLogs - 1 {
		path := filepath.Join(dir, fmt.Sprintf("kid%d.s-1.log", i))
		if err := os.WriteFile(path, []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		at := old.Add(time.Duration(i) * time.Second)
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	names := func() []string {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	o.workerLog(store.Sandbox{Name: "new"}, spawnDoc{Ref: "s-1"}).Close()
	if got := names(); len(got) != MaxWorkerLogs || !slices.Contains(got, "kid0.s-1.log") {
		t.Fatalf("at the bound: %d logs, the oldest kept %v", len(got), slices.Contains(got, "kid0.s-1.log"))
	}
	o.workerLog(store.Sandbox{Name: "newer"}, spawnDoc{Ref: "s-1"}).Close()
	if got := names(); len(got) != MaxWorkerLogs || slices.Contains(got, "kid0.s-1.log") || !slices.Contains(got, "kid1.s-1.log") || !slices.Contains(got, "newer.s-1.log") {
		t.Fatalf("one past the bound: %d logs, the oldest removed %v", len(got), !slices.Contains(got, "kid0.s-1.log"))
	}
	// kid1's log is now the oldest; opened again, it stays.
	o.workerLog(store.Sandbox{Name: "kid1"}, spawnDoc{Ref: "s-1"}).Close()
	if got := names(); len(got) != MaxWorkerLogs || !slices.Contains(got, "kid1.s-1.log") {
		t.Fatalf("the log opened again was removed")
	}
}

// TestWorkerLogCapped: a worker log takes MaxWorkerLogBytes and then one
// line saying it was cut; a log opened again counts what it holds.
func TestWorkerLogCapped(t *testing.T) {
	dir := t.TempDir()
	o := &Orchestrator{LogDir: dir}
	log := o.workerLog(store.Sandbox{Name: "kid"}, spawnDoc{Ref: "s-1"})
	chunk := strings.Repeat("y", 1000) + "\n"
	for range MaxWorkerLogBytes/len(chunk) + 10 {
		if n, err := log.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	log.Close()
	data, err := os.ReadFile(filepath.Join(dir, "kid.s-1.log"))
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < MaxWorkerLogBytes || len(data) > MaxWorkerLogBytes+200 || !strings.HasSuffix(string(data), fmt.Sprintf("the worker log is cut here: it reached %d bytes\n", MaxWorkerLogBytes)) {
		t.Fatalf("the capped log: %d bytes, ends %q", len(data), data[max(0, len(data)-120):])
	}
	before := len(data)
	again := o.workerLog(store.Sandbox{Name: "kid"}, spawnDoc{Ref: "s-1"})
	again.Write([]byte(chunk))
	again.Close()
	data, _ = os.ReadFile(filepath.Join(dir, "kid.s-1.log"))
	if len(data) > before+200 || strings.HasSuffix(string(data), chunk) {
		t.Fatalf("opened again, the full log grew from %d to %d bytes", before, len(data))
	}
}
