package devcontainer

import "errors"

// StripJSONC turns JSON with comments (devcontainer.json's format) into
// JSON: `//` and `/* */` comments outside strings become spaces (so
// offsets in errors still point at the source) and a comma before a
// closing `}` or `]` goes. Everything else is left for the JSON decoder
// to judge.
func StripJSONC(in []byte) ([]byte, error) {
	out := make([]byte, len(in))
	copy(out, in)
	lastComma := -1 // offset of a comma not yet followed by a value
	for i := 0; i < len(out); i++ {
		switch c := out[i]; {
		case c == '"':
			lastComma = -1
			for i++; i < len(out) && out[i] != '"'; i++ {
				if out[i] == '\\' {
					i++
				}
			}
			if i >= len(out) {
				return nil, errors.New("devcontainer: a string is not closed")
			}
		case c == '/' && i+1 < len(out) && out[i+1] == '/':
			for ; i < len(out) && out[i] != '\n'; i++ {
				out[i] = ' '
			}
		case c == '/' && i+1 < len(out) && out[i+1] == '*':
			start := i
			for i += 2; i+1 < len(out) && !(out[i] == '*' && out[i+1] == '/'); i++ {
			}
			if i+1 >= len(out) {
				return nil, errors.New("devcontainer: a comment is not closed")
			}
			for j := start; j <= i+1; j++ {
				if out[j] != '\n' {
					out[j] = ' '
				}
			}
			i++
		case c == ',':
			lastComma = i
		case c == '}' || c == ']':
			if lastComma >= 0 {
				out[lastComma] = ' '
			}
			lastComma = -1
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		default:
			lastComma = -1
		}
	}
	return out, nil
}
