// Package untrusted holds what every reader of sandbox-controlled bytes
// needs: a buffer that keeps a bounded prefix of a command's output, and
// the filters that make text and JSON safe for the host's terminal.
package untrusted

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Buffer keeps the first Max bytes written to it (Max < 0: all) and counts
// every byte. Writes always succeed, so a writer that goes on past the
// bound is drained, never stuck. The zero Buffer keeps nothing.
type Buffer struct {
	Max int
	// OnOverflow, when set, runs once, at the first byte past Max (a
	// caller cancels the command that floods it).
	OnOverflow func()

	buf   bytes.Buffer
	total int64
}

func (b *Buffer) Write(p []byte) (int, error) {
	n := len(p)
	b.total += int64(n)
	if b.Max >= 0 {
		room := max(b.Max-b.buf.Len(), 0)
		if n > room {
			if b.OnOverflow != nil && b.total-int64(n) <= int64(b.Max) {
				b.OnOverflow()
			}
			p = p[:room]
		}
	}
	b.buf.Write(p)
	return n, nil
}

// Bytes is what was kept.
func (b *Buffer) Bytes() []byte { return b.buf.Bytes() }

// String is what was kept.
func (b *Buffer) String() string { return b.buf.String() }

// Len is the number of bytes kept.
func (b *Buffer) Len() int { return b.buf.Len() }

// Total is the number of bytes written, kept or not.
func (b *Buffer) Total() int64 { return b.total }

// Truncated reports whether bytes were dropped.
func (b *Buffer) Truncated() bool { return b.total > int64(b.buf.Len()) }

// Printable is s with every character a terminal may act on (C0 and C1
// controls, escapes, format characters such as bidi overrides) and every
// invalid UTF-8 byte replaced by a space.
func Printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, s)
}

// PrintableLines is s with each line made Printable, the newlines
// between them kept: a multi-line error that may quote sandbox- or
// repository-controlled bytes.
func PrintableLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Printable(l)
	}
	return strings.Join(lines, "\n")
}

// EscapeJSON writes each C1 control and format character of JSON
// text js as a \u escape (a pair for one past U+FFFF), and a byte that is
// not UTF-8 (a lone 0x9b is a CSI to a terminal that is not in UTF-8) as
// \ufffd. Every one of them is inside a string: JSON's structure is
// ASCII, so the result is the same JSON, with nothing in it a terminal
// acts on.
func EscapeJSON(js []byte) []byte {
	if utf8.Valid(js) && !bytes.ContainsFunc(js, needsEscape) {
		return js
	}
	out := make([]byte, 0, len(js)+64)
	for _, r := range string(js) { // a byte that is not UTF-8: RuneError
		switch {
		case !needsEscape(r) && r != utf8.RuneError:
			out = utf8.AppendRune(out, r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return out
}

func needsEscape(r rune) bool { return r >= 0x80 && r < 0xa0 || unicode.Is(unicode.Cf, r) }

// TerminalWriter passes a stream on to a terminal with what Printable
// replaces replaced by a space, newlines and tabs kept: a command's output
// read on the user's terminal cannot act on it (an escape sequence, a
// carriage return rewriting a line). A character split between two writes
// is held until the next; Flush writes what is held at the end.
type TerminalWriter struct {
	w       io.Writer
	pending []byte // the start of a character the next write completes
	buf     []byte
}

// NewTerminalWriter returns a TerminalWriter writing to w.
func NewTerminalWriter(w io.Writer) *TerminalWriter { return &TerminalWriter{w: w} }

func (t *TerminalWriter) Write(p []byte) (int, error) {
	data := p
	if len(t.pending) > 0 {
		data = append(t.pending, p...)
		t.pending = nil
	}
	out := t.buf[:0]
	for len(data) > 0 {
		r, size := utf8.DecodeRune(data)
		if r == utf8.RuneError && size == 1 && !utf8.FullRune(data) {
			t.pending = append(t.pending[:0], data...) // at most 3 bytes
			break
		}
		data = data[size:]
		switch {
		case r == '\n' || r == '\t':
		case r == utf8.RuneError || !unicode.IsPrint(r):
			r = ' '
		}
		out = utf8.AppendRune(out, r)
	}
	t.buf = out
	if _, err := t.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a character left incomplete at the end of the stream (as
// a space).
func (t *TerminalWriter) Flush() error {
	if len(t.pending) == 0 {
		return nil
	}
	t.pending = nil
	_, err := t.w.Write([]byte{' '})
	return err
}
