package grant

import (
	"errors"
	"regexp"
	"time"
)

// Never is the "for" value of a grant without expiry.
const Never = "never"

var ttlRE = regexp.MustCompile(`^([0-9]+h)?([0-9]+m)?([0-9]+s)?$`)

// ErrTTL is the refusal for a malformed, non-positive or too long TTL.
var ErrTTL = errors.New("grant.for must be a duration such as 5m, 2h or 1h30m (at most 24h), or never")

// ParseTTL parses a rights grant's "for": "never" (never=true), or a
// positive duration of hours, minutes and seconds in that order ("5m",
// "1h30m", "90s") of at most MaxTTL. Fractions, other units and signs are
// refused so that a malformed TTL can never leave a right without expiry.
func ParseTTL(s string) (d time.Duration, never bool, err error) {
	if s == Never {
		return 0, true, nil
	}
	if s == "" || len(s) > maxTTLTextLen || !ttlRE.MatchString(s) {
		return 0, false, ErrTTL
	}
	d, err = time.ParseDuration(s)
	if err != nil || d <= 0 || d > MaxTTL {
		return 0, false, ErrTTL
	}
	return d, false, nil
}
