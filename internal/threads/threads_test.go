package threads

import (
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"agentbox/internal/testutil/wait"
)

func threadCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestReserve: the threads are made at once and kept; goroutines that then
// block in system calls, up to what was reserved, need no new one.
func TestReserve(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	const n = 12
	Reserve(2, n)
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("GOMAXPROCS %d, want 2", got)
	}
	made := threadCount(t)
	if made < n {
		t.Fatalf("%d threads after Reserve(2, %d)", made, n)
	}
	// n-4 goroutines blocked in read(2) on pipes, each holding a thread.
	const blocked = n - 4
	var fds [blocked][2]int
	var wg sync.WaitGroup
	for i := range fds {
		if err := syscall.Pipe2(fds[i][:], syscall.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [1]byte
			syscall.Read(fds[i][0], b[:])
		}()
	}
	for i := range fds {
		defer syscall.Close(fds[i][0])
		defer syscall.Close(fds[i][1])
	}
	// Wait until every reader is in its read, then let them go.
	wait.For(t, "every reader in its read", func() bool {
		in := 0
		ents, _ := os.ReadDir("/proc/self/task")
		for _, e := range ents {
			if b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/wchan"); err == nil && strings.Contains(string(b), "pipe_read") {
				in++
			}
		}
		return in == blocked
	})
	for i := range fds {
		syscall.Write(fds[i][1], []byte{0})
	}
	wg.Wait()
	if got := threadCount(t); got > made {
		t.Errorf("%d threads after %d blocking reads, %d reserved before", got, blocked, made)
	}
}
