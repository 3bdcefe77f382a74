package dispatch_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"agentbox/internal/managed/dispatch"
)

// TestDispatchEntriesBound: requests/ may hold dispatch.MaxRequestEntries
// entries in all (hidden temporary files included); one more is
// terminal.
func TestDispatchEntriesBound(t *testing.T) {
	for _, n := range []int{dispatch.MaxRequestEntries, dispatch.MaxRequestEntries + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w := newWorld(t, false)
			w.serve()
			w.put("e.json", envelope("e", `{}`))
			for i := 1; i < n; i++ {
				p := filepath.Join(w.s.Dir, dispatch.RequestsDir, fmt.Sprintf(".tmp%d", i))
				if err := os.WriteFile(p, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(p, consumer, consumer); err != nil {
					t.Fatal(err)
				}
			}
			_, err := w.dispatch("e", 0)
			if n == dispatch.MaxRequestEntries {
				if err != nil {
					t.Fatalf("%d entries: %v", n, err)
				}
				return
			}
			terminal(t, err)
			if w.count("e") != 0 {
				t.Fatal("the endpoint was reached")
			}
		})
	}
}

// TestDispatchHugeRequestsDirectory: a consumer that fills requests/
// with entries (here 50,000 of long names) does not make the dispatcher
// read them all before it refuses: it reads past the bound and stops,
// its memory independent of the directory's size.
func TestDispatchHugeRequestsDirectory(t *testing.T) {
	w := newWorld(t, false)
	w.serve()
	dir := filepath.Join(w.s.Dir, dispatch.RequestsDir)
	long := strings.Repeat("n", 200)
	for i := range 50_000 {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf(".%s%d", long, i)), os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := w.dispatch("e", 0)
	runtime.ReadMemStats(&after)
	terminal(t, err)
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Fatalf("the dispatcher allocated %d bytes to refuse a large requests/", got)
	}
}
