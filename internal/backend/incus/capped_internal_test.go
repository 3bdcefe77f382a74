package incus

import (
	"bytes"
	"testing"

	"agentbox/internal/untrusted"
)

// TestCappedBuffer: the bounds incusMax reads output with
// (maxInsideOutput, maxState for lookInit): at a bound everything is
// kept; one byte past it, the bound is kept, the overflow noted once, and
// every write still succeeds (a client writing on is drained, never
// stuck).
func TestCappedBuffer(t *testing.T) {
	for _, tc := range []struct {
		max, n int
		over   bool
	}{{maxInsideOutput, maxInsideOutput, false}, {maxInsideOutput, maxInsideOutput + 1, true}, {maxState, maxState, false}, {maxState, maxState + 1, true}} {
		overs := 0
		c := &untrusted.Buffer{Max: tc.max, OnOverflow: func() { overs++ }}
		data := bytes.Repeat([]byte("x"), tc.n)
		for len(data) > 0 {
			piece := data[:min(len(data), 4096)]
			if n, err := c.Write(piece); n != len(piece) || err != nil {
				t.Fatalf("write: %d, %v", n, err)
			}
			data = data[len(piece):]
		}
		if tc.over {
			c.Write([]byte("more")) // after an overflow: dropped, noted once
		}
		if tc.over != c.Truncated() || c.Len() != tc.max || (tc.over && overs != 1) {
			t.Fatalf("%d bytes: overflow %v, kept %d, over called %d times", tc.n, c.Truncated(), c.Len(), overs)
		}
	}
}
