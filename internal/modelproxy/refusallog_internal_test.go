package modelproxy

import (
	"testing"
	"time"
)

// TestRefusalLogBurst: RefusalLogBurst refusals of a period are logged
// one by one; the next are only counted, and the summary's flush is armed
// once, for the period's end; the next period logs again.
func TestRefusalLogBurst(t *testing.T) {
	var l refusalLog
	flushed := make(chan struct{}, 10)
	flush := func() { flushed <- struct{}{} }
	t0 := time.Now()
	for i := range RefusalLogBurst {
		if !l.admit(t0.Add(time.Duration(i)*time.Millisecond), time.Hour, flush) {
			t.Fatalf("refusal %d of the period was not logged", i+1)
		}
	}
	for i := range 3 {
		if l.admit(t0.Add(time.Second), time.Hour, flush) {
			t.Fatalf("refusal %d past the burst was logged", RefusalLogBurst+i+1)
		}
	}
	if l.timer == nil {
		t.Fatal("no summary armed for the period's end")
	}
	if n := l.take(); n != 3 {
		t.Fatalf("%d counted, want 3", n)
	}
	if n := l.take(); n != 0 {
		t.Fatalf("the count was given twice: %d", n)
	}
	if !l.admit(t0.Add(time.Hour), time.Hour, flush) {
		t.Fatal("the next period's first refusal was not logged")
	}
	if len(flushed) != 0 {
		t.Fatal("the disarmed summary ran")
	}
}
