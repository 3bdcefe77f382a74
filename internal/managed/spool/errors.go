package spool

import "fmt"

// Error is every refusal of this package. It names a field (or nothing) and
// a rule, never a value: values may be the capability or opaque payload.
type Error struct {
	Field string // JSON field name (a constant of this package) or ""
	Rule  string // the rule broken, with positions and limits only
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Rule
	}
	return e.Field + ": " + e.Rule
}

func fieldErr(field, rule string, args ...any) error {
	return &Error{Field: field, Rule: fmt.Sprintf(rule, args...)}
}

// within prefixes the field of a nested record's error (request.run_id) so
// a damaged record says which half is damaged.
func within(prefix string, err error) error {
	e, ok := err.(*Error)
	if !ok {
		return &Error{Field: prefix, Rule: "invalid"}
	}
	f := prefix
	if e.Field != "" {
		f += "." + e.Field
	}
	return &Error{Field: f, Rule: e.Rule}
}

const maxRequestIDBytes = 128

// ValidRequestID reports whether id can name a request file: 1-128 bytes of
// [A-Za-z0-9._:-], not starting with '.' (so never ".", ".." or a dotfile
// such as the spool's own .binding.json).
func ValidRequestID(id string) error {
	if len(id) == 0 || len(id) > maxRequestIDBytes {
		return fieldErr(fRequestID, "must be 1-%d bytes", maxRequestIDBytes)
	}
	if id[0] == '.' {
		return fieldErr(fRequestID, "must not start with '.'")
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return fieldErr(fRequestID, "byte %d outside [A-Za-z0-9._:-]", i)
		}
	}
	return nil
}
