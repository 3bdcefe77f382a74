package loglimit

import (
	"slices"
	"testing"
	"time"
)

// TestBurstThenCounted: the period's first burst events are logged; the
// next are counted by kind, Count never takes a place in the burst, the
// summary is armed once for the period's end, and the next period logs
// again.
func TestBurstThenCounted(t *testing.T) {
	var got [][]int
	l := New(3, time.Hour, 2, func(c []int) { got = append(got, c) })
	t0 := time.Now()
	l.admit(t0, 1, false) // a Count before the burst
	for i := range 3 {
		if !l.admit(t0.Add(time.Duration(i)*time.Millisecond), 0, true) {
			t.Fatalf("event %d of the burst was not logged", i+1)
		}
	}
	if l.admit(t0.Add(time.Second), 0, true) || l.admit(t0.Add(time.Second), 1, true) {
		t.Fatal("an event past the burst was logged")
	}
	if l.timer == nil {
		t.Fatal("no summary armed for the period's end")
	}
	l.Flush()
	l.Flush()
	if want := [][]int{{1, 2}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("summaries %v, want %v (once, by kind)", got, want)
	}
	if l.timer != nil {
		t.Fatal("Flush left the timer armed")
	}
	if !l.admit(t0.Add(time.Hour), 0, true) {
		t.Fatal("the next period's first event was not logged")
	}
}

// TestSummaryAtPeriodEnd: with nobody calling Flush, what was counted is
// summed up when the period ends.
func TestSummaryAtPeriodEnd(t *testing.T) {
	done := make(chan []int, 1)
	l := New(1, 50*time.Millisecond, 1, func(c []int) { done <- c })
	t0 := time.Now()
	if !l.admit(t0, 0, true) {
		t.Fatal("the first event was not logged")
	}
	l.admit(t0, 0, true)
	l.admit(t0, 0, true)
	select {
	case c := <-done:
		if c[0] != 2 {
			t.Fatalf("summary counted %d, want 2", c[0])
		}
	case <-time.After(time.Minute):
		t.Fatal("no summary at the period's end")
	}
}

// TestNothingCountedNoSummary: a period that logged everything says
// nothing more.
func TestNothingCountedNoSummary(t *testing.T) {
	l := New(2, time.Hour, 1, func([]int) { t.Fatal("summary with nothing counted") })
	l.Admit(0)
	l.Admit(0)
	l.Flush()
}
