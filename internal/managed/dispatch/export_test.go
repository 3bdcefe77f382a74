package dispatch

import (
	"context"
	"time"
)

// SetClockForTest replaces the clock Dispatch waits on until the test
// ends.
func SetClockForTest(t interface{ Cleanup(func()) }, clock func() time.Time, wait func(context.Context, time.Duration) error) {
	oldNow, oldPause := now, pause
	now, pause = clock, wait
	t.Cleanup(func() { now, pause = oldNow, oldPause })
}
