package shortname

import (
	"strings"
	"testing"
)

func TestFromBranch(t *testing.T) {
	tests := []struct{ branch, want string }{
		{"main", "main"},
		{"fix/issue-12", "fix-issue-12"},
		{"Fix/Issue_12", "fix-issue-12"},
		{"docs/intro", "docs-intro"},
		{"a//b", "a-b"},
		{"a--b", "a-b"},
		{"a-/-b", "a-b"},
		{"feature/ÄÖ.x", "feature-x"},
		{"release/1.2.3", "release-1-2-3"},
		{"_lead", "-lead"},
		{"trail_", "trail-"},
		{"UPPER", "upper"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := FromBranch(tt.branch); got != tt.want {
			t.Errorf("FromBranch(%q) = %q, want %q", tt.branch, got, tt.want)
		}
	}
}

func TestValid(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"fix-issue-12", true},
		{"a", true},
		{"0abc", true},
		{"trail-", true},
		{strings.Repeat("a", MaxLen), true},
		{strings.Repeat("a", MaxLen+1), false},
		{"", false},
		{"-lead", false},
		{"Upper", false},
		{"a_b", false},
		{"a/b", false},
	}
	for _, tt := range tests {
		if got := Valid(tt.name); got != tt.want {
			t.Errorf("Valid(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func FuzzFromBranch(f *testing.F) {
	for _, s := range []string{"fix/issue-12", "A__B", "ÄÖ", "--", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, branch string) {
		got := FromBranch(branch)
		if strings.Contains(got, "--") {
			t.Fatalf("FromBranch(%q) = %q keeps a run of dashes", branch, got)
		}
		for _, c := range got {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				t.Fatalf("FromBranch(%q) = %q has %q", branch, got, c)
			}
		}
		if FromBranch(got) != got {
			t.Fatalf("FromBranch is not idempotent on %q", got)
		}
	})
}
