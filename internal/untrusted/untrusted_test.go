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
