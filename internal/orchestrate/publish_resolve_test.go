package orchestrate

import "testing"

// TestNumberInURL: the number a resolved action records comes from the
// URL a person gave only when the URL plainly ends in one.
func TestNumberInURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want int
	}{
		{"https://github.com/o/r/issues/12", 12},
		{"https://github.com/o/r/issues/12/", 12},
		{"https://github.com/o/r/pull/7", 7},
		{"https://github.com/o/r/pulls/7", 7},
		{"https://github.com/o/r/issues/3#issuecomment-99", 3},
		{"https://github.com/o/r/pull/3?diff=split", 3},
		{"https://github.com/o/r/issues/0", 0},
		{"https://github.com/o/r/issues/-4", 0},
		{"https://github.com/o/r/issues/012", 0},
		{"https://github.com/o/r/issues/+12", 0},
		{"https://github.com/o/r/issues/99999999999999999999", 0},
		{"https://github.com/o/r/commit/12", 0},
		{"https://github.com/o/r/issues", 0},
		{"12", 0},
		{"", 0},
	} {
		if got := numberInURL(tc.url); got != tc.want {
			t.Errorf("numberInURL(%q) = %d, want %d", tc.url, got, tc.want)
		}
	}
}
