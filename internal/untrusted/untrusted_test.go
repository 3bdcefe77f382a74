package untrusted

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestBuffer: at its bound everything is kept; one byte past it, the
// bound is kept, the overflow is reported once, and every write still
// succeeds in full (a command writing on is drained, never stuck).
func TestBuffer(t *testing.T) {
	const bound = 64 << 10
	for _, tc := range []struct {
		name  string
		max   int
		write int
		kept  int
		over  int
	}{
		{"at the bound", bound, bound, bound, 0},
		{"one past", bound, bound + 1, bound, 1},
		{"far past", bound, 4 * bound, bound, 1},
		{"unbounded", -1, bound + 1, bound + 1, 0},
		{"zero keeps nothing", 0, 10, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			overs := 0
			b := &Buffer{Max: tc.max, OnOverflow: func() { overs++ }}
			data := bytes.Repeat([]byte("x"), tc.write)
			for len(data) > 0 {
				piece := data[:min(len(data), 4000)]
				if n, err := b.Write(piece); n != len(piece) || err != nil {
					t.Fatalf("write of %d: %d, %v", len(piece), n, err)
				}
				data = data[len(piece):]
			}
			if b.Len() != tc.kept || len(b.Bytes()) != tc.kept || len(b.String()) != tc.kept {
				t.Errorf("kept %d bytes, want %d", b.Len(), tc.kept)
			}
			if b.Total() != int64(tc.write) || b.Truncated() != (tc.write > tc.kept) {
				t.Errorf("total %d, truncated %v after writing %d", b.Total(), b.Truncated(), tc.write)
			}
			if overs != tc.over {
				t.Errorf("OnOverflow ran %d times, want %d", overs, tc.over)
			}
		})
	}
}

func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain text, ünïcode 日本", "plain text, ünïcode 日本"},
		{"\x1b[31mred\x1b[0m", " [31mred [0m"},
		{"a\tb\nc\rd", "a b c d"},
		{"c1:\u009b2J", "c1: 2J"},
		{"bidi:\u202eevil", "bidi: evil"},
		{"zero width:\u200b.", "zero width: ."},
		{"bad utf-8:\xff\xfe.", "bad utf-8:  ."},
	} {
		if got := Printable(tc.in); got != tc.want {
			t.Errorf("Printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzPrintable: whatever the input, the output is valid UTF-8 made only
// of printable characters.
func FuzzPrintable(f *testing.F) {
	f.Add("\x1b]0;title\x07")
	f.Add("\u202e\u0085\xc0")
	f.Fuzz(func(t *testing.T, s string) {
		out := Printable(s)
		if !utf8.ValidString(out) {
			t.Fatalf("invalid UTF-8 out of %q", s)
		}
		if i := strings.IndexFunc(out, func(r rune) bool { return !unicode.IsPrint(r) }); i >= 0 {
			t.Fatalf("unprintable %q out of %q", out[i:], s)
		}
	})
}

func TestEscapeJSON(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"a":"plain ü 日本"}`, `{"a":"plain ü 日本"}`},
		{"{\"a\":\"csi\u009b2J\"}", `{"a":"csi\u009b2J"}`},
		{"{\"a\":\"bidi\u202eevil\"}", `{"a":"bidi\u202eevil"}`},
		{"{\"a\":\"tag\U000E0041\"}", `{"a":"tag\udb40\udc41"}`},
		{"{\"a\":\"bad\x9b\"}", `{"a":"bad\ufffd"}`},
	} {
		if got := string(EscapeJSON([]byte(tc.in))); got != tc.want {
			t.Errorf("EscapeJSON(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// FuzzEscapeJSON: for any valid JSON, the escaped text is JSON of the
// same value (invalid UTF-8 aside, which decodes to U+FFFD either way),
// with no C1 control or format character left in it.
func FuzzEscapeJSON(f *testing.F) {
	f.Add([]byte("{\"a\":\"\u009b\u202e\U000E0041\"}"))
	f.Add([]byte(`["x",1,null]`))
	f.Fuzz(func(t *testing.T, js []byte) {
		if !json.Valid(js) {
			return
		}
		out := EscapeJSON(js)
		var a, b any
		if err := json.Unmarshal(js, &a); err != nil {
			return
		}
		if err := json.Unmarshal(out, &b); err != nil {
			t.Fatalf("%q escaped to invalid JSON %q: %v", js, out, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%q escaped to another value: %q", js, out)
		}
		if i := bytes.IndexFunc(out, needsEscape); i >= 0 || !utf8.Valid(out) {
			t.Fatalf("left in %q: %q", out, out[max(i, 0):])
		}
	})
}

// terminalOut writes data through a TerminalWriter in chunks of n bytes
// (n <= 0: whole) and flushes.
func terminalOut(data []byte, n int) string {
	var b strings.Builder
	w := NewTerminalWriter(&b)
	if n <= 0 {
		n = len(data) + 1
	}
	for len(data) > 0 {
		k := min(n, len(data))
		w.Write(data[:k])
		data = data[k:]
	}
	w.Flush()
	return b.String()
}

func TestTerminalWriter(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text\n\tindented\n", "plain text\n\tindented\n"},
		{"\x1b]52;c;SGVsbG8=\x07copied\n", " ]52;c;SGVsbG8= copied\n"},
		{"\x1b[2J\x1b[Hcleared", " [2J [Hcleared"},
		{"fake\rbranchbox: ok", "fake branchbox: ok"},
		{"\u009b31mred \u202eeulav", " 31mred  eulav"},
		{"caf\u00e9 \u2713 \U0001F600", "caf\u00e9 \u2713 \U0001F600"},
		{"bad \xff\xfe byte", "bad    byte"},
		{"cut \xe2\x9c", "cut  "}, // a character the stream never completes
	} {
		for _, n := range []int{0, 1, 2, 3} {
			if got := terminalOut([]byte(c.in), n); got != c.want {
				t.Errorf("%q in chunks of %d: %q, want %q", c.in, n, got, c.want)
			}
		}
	}
}

func FuzzTerminalWriter(f *testing.F) {
	f.Add([]byte("\x1b]52;c;x\x07ok\n\u00e9\u202e\xe2\x9c"), 2)
	f.Fuzz(func(t *testing.T, data []byte, n int) {
		whole := terminalOut(data, 0)
		if got := terminalOut(data, n%7+1); got != whole {
			t.Fatalf("chunks change the output: %q against %q", got, whole)
		}
		for _, r := range whole {
			if r != '\n' && r != '\t' && (r == utf8.RuneError || !unicode.IsPrint(r)) {
				t.Fatalf("passed %U: %q", r, whole)
			}
		}
	})
}
