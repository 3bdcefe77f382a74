package term

import "io"

// Escape is ssh's escape for a terminal in raw mode: "~." typed at the
// start of a line (first, or right after Enter) ends the session, "~~"
// there sends one "~". Everything else, a "~" anywhere else included,
// passes through unchanged. Without it a sandboxed command that ignores
// its input (and Ctrl-C, which raw mode hands to it) would keep the
// user's terminal until the client is killed from another one.
const (
	EscapeChar = '~'
	escapeEnd  = '.'
)

// escapeState is where the filter is in the input.
type escapeState int

const (
	midLine   escapeState = iota
	lineStart             // first byte, or after Enter
	sawTilde              // "~" at a line's start, held back
)

// EscapeFilter finds the escape in a terminal's input, read in chunks.
type EscapeFilter struct{ state escapeState }

// NewEscapeFilter returns a filter at the start of a line.
func NewEscapeFilter() *EscapeFilter { return &EscapeFilter{state: lineStart} }

// Filter returns what of in passes to the command (appended to dst) and
// whether the escape ended the session; nothing typed after "~." passes.
// A "~" at the end of in is held back until the next chunk says what it
// is.
func (f *EscapeFilter) Filter(dst, in []byte) ([]byte, bool) {
	for _, c := range in {
		switch f.state {
		case lineStart:
			if c == EscapeChar {
				f.state = sawTilde
				continue
			}
		case sawTilde:
			switch c {
			case escapeEnd:
				return dst, true
			case EscapeChar:
				dst = append(dst, EscapeChar)
				f.state = midLine
				continue
			}
			dst = append(dst, EscapeChar)
		}
		dst = append(dst, c)
		f.state = midLine
		if c == '\r' || c == '\n' {
			f.state = lineStart
		}
	}
	return dst, false
}

// CopyInput copies src (the user's terminal) to dst (the command's) until
// src ends, a write fails, or the escape is typed: then it calls onEscape
// and returns.
func CopyInput(dst io.Writer, src io.Reader, onEscape func()) {
	f := NewEscapeFilter()
	buf := make([]byte, 32*1024)
	var out []byte
	for {
		n, err := src.Read(buf)
		var end bool
		out, end = f.Filter(out[:0], buf[:n])
		if len(out) > 0 {
			if _, werr := dst.Write(out); werr != nil {
				return
			}
		}
		if end {
			onEscape()
			return
		}
		if err != nil {
			return
		}
	}
}
