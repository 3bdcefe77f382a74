package manifest

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Refusal is a manifest the broker refuses. Detail is the text for the
// requester (the spec's text where the spec gives one); it never repeats
// more than a short, sanitized piece of the caller's input. ID is the
// manifest's id when it was readable and valid, so the broker can record
// the refusal under it; "" otherwise.
type Refusal struct {
	ID     string
	Detail string
}

func (r *Refusal) Error() string { return r.Detail }

func refuse(format string, args ...any) *Refusal {
	return &Refusal{Detail: fmt.Sprintf(format, args...)}
}

// Details the broker also needs.
const (
	// DetailGrantRevoked answers every orchestrator request after its grant
	// was revoked (spec text).
	DetailGrantRevoked = "orchestration grant revoked"
	// DetailNoGrant answers an orchestrator-role request without a grant.
	DetailNoGrant = "this container holds no orchestration grant"
	// DetailChildRightsOnly is the spec's refusal for a child's rights
	// manifest that names another child or carries a grant block.
	DetailChildRightsOnly = "children may only revoke their own rights"
	// DetailChildTypes refuses any other manifest type from a child.
	DetailChildTypes = "children may only send message and revoke-only rights manifests"
	// DetailChildTo refuses a child's message that names a recipient.
	DetailChildTo = "children may not set `to`: their messages go to the orchestrator"
)

// MissingOperation is the spec's refusal for a type whose operation is not
// in the effective grant: "operation `rights` is not in this container's
// grant".
func MissingOperation(op string) string {
	return fmt.Sprintf("operation `%s` is not in this container's grant", op)
}

// NotAvailable is the refusal for a fully valid manifest whose handler this
// broker does not have yet.
func NotAvailable(t Type) *Refusal {
	return &Refusal{Detail: fmt.Sprintf("operation `%s` is not available in this broker yet", t)}
}

// shown makes a caller's value safe to repeat in a detail: control,
// format (a bidi override such as U+202E reorders what a terminal shows)
// and backtick characters become '?', and it is cut to maxShownLen bytes.
func shown(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '`' || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
	if len(s) <= maxShownLen {
		return s
	}
	cut := maxShownLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
