package orchestrate

import (
	"strings"
	"testing"
)

func TestDidYouMean(t *testing.T) {
	names := []string{"fix-issue-12", "fix-issue-13", "fix-issue-21", "fix-issue-1", "docs-intro", "lead"}
	for _, tc := range []struct {
		name, want string
	}{
		{"fix-isue-12", " (did you mean `fix-issue-12`?)"},
		// Closest first, then by name; at most three.
		{"fix-issue-2", " (did you mean `fix-issue-1`, `fix-issue-12` or `fix-issue-21`?)"},
		{"docs-intor", " (did you mean `docs-intro`?)"},
		{"laed", " (did you mean `lead`?)"},
		// More than two edits away: another name, not a typo.
		{"release", ""},
		{"fix", ""},
		// The exact name is not offered back.
		{"lead", ""},
		{strings.Repeat("a", 1<<20), ""},
	} {
		if got := didYouMean(tc.name, names); got != tc.want {
			t.Errorf("didYouMean(%.20q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
