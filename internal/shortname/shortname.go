// Package shortname derives a child's short name from its branch.
//
// The short name is the branch-level name every orchestration manifest uses
// ("fix/issue-12" -> "fix-issue-12"). The rule is the spec's, exactly:
// lowercase, every character outside [a-z0-9-] becomes "-", and runs of "-"
// collapse to one. Nothing is trimmed, so the rule stays reversible in a
// reader's head; Valid says whether the result can name a child.
package shortname

import "strings"

// MaxLen is the longest usable short name. Incus instance names are at most
// 63 characters and the short name must fit in one.
const MaxLen = 63

// FromBranch returns the short name of branch.
func FromBranch(branch string) string {
	var b strings.Builder
	b.Grow(len(branch))
	lastDash := false
	for _, r := range strings.ToLower(branch) {
		ok := (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')
		if !ok {
			// '-' and every other character become a single '-'.
			if lastDash {
				continue
			}
			b.WriteByte('-')
			lastDash = true
			continue
		}
		b.WriteRune(r)
		lastDash = false
	}
	return b.String()
}

// Valid reports whether name can be a child's short name: 1 to MaxLen
// characters of [a-z0-9-], starting with a letter or digit (so it can never
// be read as a command-line flag).
func Valid(name string) bool {
	if len(name) == 0 || len(name) > MaxLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0:
		default:
			return false
		}
	}
	return true
}
