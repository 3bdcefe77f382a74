package cli

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"agentbox/internal/agent"
)

// TestPaneFollowerForgetsGoneWindows: a sandbox that renames its tmux
// windows at every capture does not grow what logs --agent -f keeps; what
// it keeps of a window is a copy, not the capture's memory.
func TestPaneFollowerForgetsGoneWindows(t *testing.T) {
	var out strings.Builder
	p := paneFollower{out: &out, seen: map[string][]string{}}
	for i := range 1000 {
		p.print([]agent.Pane{
			{Window: "claude", Lines: []string{"steady"}},
			{Window: fmt.Sprintf("w%d", i), Lines: []string{"x"}},
		})
		if len(p.seen) > 2 {
			t.Fatalf("after %d captures of 2 windows, %d windows kept", i+1, len(p.seen))
		}
	}
	if _, ok := p.seen["w999"]; !ok {
		t.Errorf("the latest window is not kept: %v", p.seen)
	}
	if got := strings.Count(out.String(), "steady"); got != 1 {
		t.Errorf("an unchanged window's line printed %d times, want 1", got)
	}

	// A window that goes and comes back is new again: printed in full.
	out.Reset()
	p.print([]agent.Pane{{Window: "other", Lines: []string{"y"}}})
	p.print([]agent.Pane{{Window: "claude", Lines: []string{"steady"}}})
	if want := "== window other\ny\n== window claude\nsteady\n"; out.String() != want {
		t.Errorf("printed %q, want %q", out.String(), want)
	}

	// The capture's text is one string the lines are cut from, and its
	// slice of lines may be longer than what is kept.
	text := strings.Repeat("line\n", 100) + "last"
	lines := strings.Split(text, "\n")
	p.print([]agent.Pane{{Window: "big", Lines: lines[95:]}})
	kept := p.seen["big"]
	if len(kept) != 6 || cap(kept) != 6 || kept[5] != "last" {
		t.Fatalf("kept %q (cap %d), want the 6 lines in a slice of their own", kept, cap(kept))
	}
	base := uintptr(unsafe.Pointer(unsafe.StringData(text)))
	for _, l := range kept {
		if a := uintptr(unsafe.Pointer(unsafe.StringData(l))); a >= base && a < base+uintptr(len(text)) {
			t.Fatalf("kept line %q points into the capture's text", l)
		}
	}
}

// sharedLinesReference is the definition sharedLines computes, in
// len(old)*len(cur) time: the longest prefix of cur that is a run of old.
func sharedLinesReference(old, cur []string) int {
	best := 0
	for d := range old {
		k := 0
		for d+k < len(old) && k < len(cur) && old[d+k] == cur[k] {
			k++
		}
		best = max(best, k)
	}
	return best
}

func TestSharedLines(t *testing.T) {
	l := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, " ")
	}
	for _, tc := range []struct {
		old, cur string
		want     int
	}{
		{"", "a b", 0},
		{"a b", "", 0},
		{"a b", "a b", 2},               // unchanged
		{"a b", "a b c", 2},             // lines added
		{"a b c", "b c d", 2},           // history trimmed at the top, a line added
		{"b c d", "b c e", 2},           // the last line redrawn
		{"a b c d", "b c", 2},           // a run inside old
		{"x y", "a b", 0},               // nothing shared
		{"a b x a b c", "a b c d", 3},   // a first partial match, then the longer one
		{"a b c x a b", "a b c d", 3},   // the longer match first
		{"a a a b", "a a b c", 3},       // the automaton falls back
		{"a b a b a c", "a b a c x", 4}, // falls back inside a match
		{"a a a a", "a a a a a", 4},     // old ends with cur's start
		{"z a b", "a b a b", 2},         // a repeated prefix
		{"a b c", "c a b c", 1},
	} {
		if got := sharedLines(l(tc.old), l(tc.cur)); got != tc.want {
			t.Errorf("sharedLines(%q, %q) = %d, want %d", tc.old, tc.cur, got, tc.want)
		}
		if ref := sharedLinesReference(l(tc.old), l(tc.cur)); ref != tc.want {
			t.Errorf("reference(%q, %q) = %d, want %d (bad case)", tc.old, tc.cur, ref, tc.want)
		}
	}
	// Random panes over few distinct lines, where runs repeat.
	r := rand.New(rand.NewPCG(1, 2))
	gen := func() []string {
		out := make([]string, r.IntN(12))
		for i := range out {
			out[i] = string(rune('a' + r.IntN(3)))
		}
		return out
	}
	for range 20000 {
		old, cur := gen(), gen()
		if got, want := sharedLines(old, cur), sharedLinesReference(old, cur); got != want {
			t.Fatalf("sharedLines(%q, %q) = %d, want %d", old, cur, got, want)
		}
	}
}

// BenchmarkSharedLinesWorstCase is the case the quadratic search was
// slowest on (every line alike but the last, a full pane of history):
// 237-417 ms an op before the linear search, about 1 ms after (2 CPUs).
func BenchmarkSharedLinesWorstCase(b *testing.B) {
	n := agent.MaxPaneLines
	old := make([]string, n)
	cur := make([]string, n)
	for i := range n {
		old[i], cur[i] = "same", "same"
	}
	old[n-1] = "other"
	for b.Loop() {
		if got := sharedLines(old, cur); got != n-1 {
			b.Fatalf("got %d, want %d", got, n-1)
		}
	}
}
