package assignment

import (
	"errors"
	"fmt"
)

// ErrInvalid is the class of every refusal of an assignment, whether the
// document itself or its files on disk break a rule. Test with errors.Is.
var ErrInvalid = errors.New("invalid assignment")

// Error is one precise refusal: where (the JSON location of the field, such
// as "leases[1].materializations[0].sha256", or "" for the whole document)
// and why (the rule broken).
//
// Neither part ever holds a value taken from the document or from a file:
// locations use indexes and schema field names, reasons name rules, modes,
// uids and limits. A message can therefore be printed or logged even when
// the document carries secrets in the wrong place.
type Error struct {
	Field  string
	Reason string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// Unwrap puts every Error in the ErrInvalid class.
func (e *Error) Unwrap() error { return ErrInvalid }

// Errorf builds a refusal. args must never be values from the document or
// from a file: only indexes, limits, modes, uids and names this program
// defines.
func Errorf(field, format string, args ...any) *Error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// field joins a JSON location and a member name.
func field(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// index appends an array index to a JSON location.
func index(parent string, i int) string {
	return fmt.Sprintf("%s[%d]", parent, i)
}
