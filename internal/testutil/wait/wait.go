// Package wait holds the small synchronization helpers tests of several
// packages share: polling a condition with a hang guard, and a buffer a
// process writes while the test reads it.
package wait

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// Guard is how long For polls: a hang guard, never a timing assertion.
const Guard = 30 * time.Second

// pollInterval paces For.
const pollInterval = 10 * time.Millisecond

// For polls cond until it holds, failing t (naming what) after Guard.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Guard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(pollInterval)
	}
}

// Buffer is a bytes.Buffer safe for a writer goroutine (a process's
// output, a log) and a reader.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
