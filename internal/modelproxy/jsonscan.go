package modelproxy

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// The checks of a request body (providerTool, outputCharge) read every
// token of up to MaxRequestBytes a sandbox sends. encoding/json's Decoder
// allocates for each token: a 32 MiB body of small numbers took the
// broker 8 s of CPU, and a sandbox may send eight at once. The scanner
// below allocates nothing; json.Valid has checked the text first, so it
// only needs to find where each token ends.

// tokenKind is the kind of one JSON token.
type tokenKind uint8

const (
	tokEnd       tokenKind = iota // the text is over
	tokObject                     // {
	tokObjectEnd                  // }
	tokArray                      // [
	tokArrayEnd                   // ]
	tokString                     // its raw bytes between the quotes, escapes as written
	tokNull                       // null
	tokScalar                     // a number, true or false: its text
)

// scanner reads the tokens of a text json.Valid accepted. Commas and
// colons are skipped like white space: the structure says which string
// is a key.
type scanner struct {
	data []byte
	pos  int
}

func (s *scanner) next() (tokenKind, []byte) {
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch c {
		case ' ', '\t', '\n', '\r', ',', ':':
			s.pos++
			continue
		case '{':
			s.pos++
			return tokObject, nil
		case '}':
			s.pos++
			return tokObjectEnd, nil
		case '[':
			s.pos++
			return tokArray, nil
		case ']':
			s.pos++
			return tokArrayEnd, nil
		case '"':
			start := s.pos + 1
			i := start
			for s.data[i] != '"' { // valid: a closing quote comes
				if s.data[i] == '\\' {
					i++ // the escaped byte, which may be a quote
				}
				i++
			}
			s.pos = i + 1
			return tokString, s.data[start:i]
		}
		start := s.pos
		for s.pos < len(s.data) && !endsScalar(s.data[s.pos]) {
			s.pos++
		}
		if raw := s.data[start:s.pos]; string(raw) != "null" {
			return tokScalar, raw
		}
		return tokNull, nil
	}
	return tokEnd, nil
}

func endsScalar(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', ',', ':', '}', ']':
		return true
	}
	return false
}

// skip passes the rest of a value that began with a token of kind k.
func (s *scanner) skip(k tokenKind) {
	if k != tokObject && k != tokArray {
		return
	}
	for depth := 1; depth > 0; {
		switch k, _ := s.next(); k {
		case tokObject, tokArray:
			depth++
		case tokObjectEnd, tokArrayEnd:
			depth--
		case tokEnd:
			return
		}
	}
}

// decodeString is a raw string token's value, as encoding/json reads it
// (invalid UTF-8 becomes U+FFFD).
func decodeString(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw)
	}
	var v string
	json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &v) // valid: cannot fail
	return v
}

// foldIs reports whether a raw string token's value equals target under
// Unicode case folding (strings.EqualFold), decoding it only when it has
// an escape.
func foldIs(raw []byte, target string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return bytes.EqualFold(raw, []byte(target)) // invalid UTF-8 compares as U+FFFD, as decoded
	}
	return strings.EqualFold(decodeString(raw), target)
}
