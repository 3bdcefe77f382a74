package spool

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"unicode/utf8"
)

// Field names. Errors use only these, never a key read from input.
const (
	fVersion    = "version"
	fRunID      = "run_id"
	fLeaseID    = "lease_id"
	fConsumer   = "consumer"
	fRequestID  = "request_id"
	fCapability = "capability"
	fPayload    = "payload"
	fSHA        = "request_sha256"
	fRequest    = "request"
	fResponse   = "response"
)

// MaxDepth bounds JSON nesting in requests, frames and responses; the
// top-level object counts as depth 1. Records nest a frame or response one
// level deeper and are allowed MaxDepth+1.
const MaxDepth = 64

// decodeObject parses data as exactly one JSON object whose keys are exactly
// fields, each once, and returns each field's raw value. Keys are compared
// after unescaping (encoding/json's Token does that), so "run\u005fid"
// duplicates "run_id"; they are compared case-sensitively, unlike
// json.Unmarshal, so "Run_ID" is an unknown field.
func decodeObject(data []byte, fields []string, maxDepth int) (map[string]json.RawMessage, error) {
	if !utf8.Valid(data) {
		return nil, &Error{Rule: "not valid UTF-8"}
	}
	// Checked before parsing so the rule is ours, not encoding/json's.
	if !depthWithin(data, maxDepth) {
		return nil, fieldErr("", "nesting deeper than %d", maxDepth)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, syntaxErr(err, dec)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, &Error{Rule: "not a JSON object"}
	}
	out := make(map[string]json.RawMessage, len(fields))
	for dec.More() {
		at := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxErr(err, dec)
		}
		key, _ := tok.(string)
		field := known(key, fields)
		if field == "" {
			return nil, fieldErr("", "unknown field after byte %d", at)
		}
		if _, dup := out[field]; dup {
			return nil, fieldErr(field, "duplicate key after byte %d", at)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, syntaxErr(err, dec)
		}
		out[field] = bytes.TrimLeft(raw, " \t\r\n")
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, syntaxErr(err, dec)
	}
	if end := dec.InputOffset(); len(bytes.Trim(data[end:], " \t\r\n")) != 0 {
		return nil, fieldErr("", "data after the object at byte %d", end)
	}
	for _, f := range fields {
		if _, ok := out[f]; !ok {
			return nil, &Error{Field: f, Rule: "missing"}
		}
	}
	return out, nil
}

// known returns the package's own constant for key, so no input string can
// reach an error message.
func known(key string, fields []string) string {
	for _, f := range fields {
		if f == key {
			return f
		}
	}
	return ""
}

// syntaxErr maps encoding/json errors, whose messages quote input
// characters, to a position-only rule.
func syntaxErr(err error, dec *json.Decoder) error {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return fieldErr("", "malformed JSON at byte %d", se.Offset)
	case errors.Is(err, io.EOF) && dec.InputOffset() == 0:
		return &Error{Rule: "empty"}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return &Error{Rule: "truncated JSON"}
	default:
		return fieldErr("", "malformed JSON near byte %d", dec.InputOffset())
	}
}

// depthWithin reports whether brackets outside strings nest at most max
// deep. Malformed input may be miscounted; the parser refuses it anyway.
func depthWithin(data []byte, max int) bool {
	depth, inString, escaped := 0, false, false
	for _, c := range data {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > max {
				return false
			}
		case '}', ']':
			depth--
		}
	}
	return true
}

// str decodes a field that must be a JSON string (null is refused:
// json.Unmarshal would silently leave the target empty).
func str(m map[string]json.RawMessage, field string) (string, error) {
	raw := m[field]
	if len(raw) == 0 || raw[0] != '"' {
		return "", &Error{Field: field, Rule: "must be a JSON string"}
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", &Error{Field: field, Rule: "must be a JSON string"}
	}
	return s, nil
}

// compact returns raw without insignificant whitespace; string contents are
// kept byte for byte (json.Compact does not re-escape).
func compact(raw json.RawMessage, field string) (json.RawMessage, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, &Error{Field: field, Rule: "malformed JSON"}
	}
	return b.Bytes(), nil
}

// appendString writes s as a JSON string escaping only what JSON requires,
// so a re-encoded id is never longer than its encoding in the input (the
// frame then stays within MaxRequestBytes). Invalid UTF-8, possible only in
// hand-built values, becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b = append(b, '\\', byte(r))
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			if r < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
			} else {
				b = utf8.AppendRune(b, r)
			}
		}
	}
	return append(b, '"')
}

// appendRaw writes an already-compact JSON value, null when absent.
func appendRaw(b []byte, raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return append(b, "null"...)
	}
	return append(b, raw...)
}
