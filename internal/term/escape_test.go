package term

import (
	"bytes"
	"strings"
	"testing"
)

// TestEscapeFilter feeds each input whole and then one byte at a time:
// where a chunk ends must not change what passes or whether it ends.
func TestEscapeFilter(t *testing.T) {
	cases := []struct {
		in   string
		out  string
		ends bool
	}{
		{"ls\r", "ls\r", false},
		{"~.", "", true},
		{"ls\r~.rm -rf /\r", "ls\r", true},
		{"ls\n~.", "ls\n", true},
		{"a~.", "a~.", false},  // not at a line's start
		{"~~.", "~.", false},   // "~~" sends one "~"
		{"~x", "~x", false},    // any other byte: both pass
		{"~\r~.", "~\r", true}, // "~" then Enter: a new line starts
		{"~", "", false},       // held back until the next byte
		{"vi x\r:q\r~?", "vi x\r:q\r~?", false},
		{"\x03\x03", "\x03\x03", false}, // Ctrl-C passes to the command
		{"~~~.", "~~.", false},
	}
	for _, c := range cases {
		for _, oneByOne := range []bool{false, true} {
			f := NewEscapeFilter()
			var got []byte
			var ended bool
			chunks := []string{c.in}
			if oneByOne {
				chunks = strings.Split(c.in, "")
			}
			for _, ch := range chunks {
				var end bool
				got, end = f.Filter(got, []byte(ch))
				if end {
					ended = true
					break
				}
			}
			if string(got) != c.out || ended != c.ends {
				t.Errorf("%q (one by one %v): passed %q, ended %v; want %q, %v", c.in, oneByOne, got, ended, c.out, c.ends)
			}
		}
	}
}

// TestCopyInputStopsAtTheEscape: what follows "~." is not copied, and
// onEscape is called once.
func TestCopyInputStopsAtTheEscape(t *testing.T) {
	var dst bytes.Buffer
	calls := 0
	CopyInput(&dst, strings.NewReader("echo hi\r~.echo never\r"), func() { calls++ })
	if dst.String() != "echo hi\r" || calls != 1 {
		t.Errorf("copied %q, onEscape called %d times; want %q, once", dst.String(), calls, "echo hi\r")
	}
	dst.Reset()
	calls = 0
	CopyInput(&dst, strings.NewReader("a~.b\r"), func() { calls++ })
	if dst.String() != "a~.b\r" || calls != 0 {
		t.Errorf("copied %q, onEscape called %d times; want all of it, never", dst.String(), calls)
	}
}
