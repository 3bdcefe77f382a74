package modelproxy

import (
	"testing"
	"time"
)

// TestRefusalLogBurst: RefusalLogBurst refusals of a period are logged
// one by one, the next is only counted; the next period's first is
// logged, with the count of those that were not.
func TestRefusalLogBurst(t *testing.T) {
	var l refusalLog
	t0 := time.Unix(1_000_000, 0)
	for i := range RefusalLogBurst {
		if log, dropped := l.admit(t0.Add(time.Duration(i)*time.Millisecond), time.Second); !log || dropped != 0 {
			t.Fatalf("refusal %d of the period: log %v, dropped %d; want logged", i+1, log, dropped)
		}
	}
	for i := range 3 {
		if log, _ := l.admit(t0.Add(500*time.Millisecond), time.Second); log {
			t.Fatalf("refusal %d past the burst was logged", RefusalLogBurst+i+1)
		}
	}
	if log, dropped := l.admit(t0.Add(time.Second), time.Second); !log || dropped != 3 {
		t.Fatalf("the next period's first: log %v, dropped %d; want logged with 3 dropped", log, dropped)
	}
	if log, dropped := l.admit(t0.Add(time.Second), time.Second); !log || dropped != 0 {
		t.Fatalf("the summary was given twice: log %v, dropped %d", log, dropped)
	}
}
