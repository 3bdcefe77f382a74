package forge_test

import (
	"errors"
	"strings"
	"testing"

	"agentbox/internal/forge"
)

func TestParseRepo(t *testing.T) {
	for _, ok := range []string{
		"acme/widget", "a/b", "A-1/x.y_z-2", "x/.github", "x/..a", "x/a.gitx",
		strings.Repeat("o", 39) + "/" + strings.Repeat("n", 100),
	} {
		r, err := forge.ParseRepo(ok)
		if err != nil || r.String() != ok {
			t.Errorf("ParseRepo(%q) = %+v, %v", ok, r, err)
		}
	}
	for _, bad := range []string{
		"", "/", "acme", "acme/", "/widget", "acme/widget/x", "acme//widget",
		"-acme/w", "acme-/w", "ac--me/w", "ac_me/w", "ac.me/w", strings.Repeat("o", 40) + "/w",
		"acme/" + strings.Repeat("n", 101), "acme/.", "acme/..", "acme/w.git", "acme/w.GIT",
		"acme/wid get", "acme/wïdget", "acme/w\x00", "acme/w\n", " acme/w", "acme/w ",
		"acme/../x", "https://github.com/acme/w",
	} {
		if r, err := forge.ParseRepo(bad); !errors.Is(err, forge.ErrInvalidRepo) || r != (forge.Repo{}) {
			t.Errorf("ParseRepo(%q) = %+v, %v; want ErrInvalidRepo", bad, r, err)
		}
	}
}

// FuzzParseRepo: whatever a sandbox writes, a repository ParseRepo accepts
// is two URL-path-safe components that print back as the input.
func FuzzParseRepo(f *testing.F) {
	for _, s := range []string{"acme/widget", "a/b.c", "-/x", "a/..", "a/b/c", "a/b.git"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := forge.ParseRepo(s)
		if err != nil {
			return
		}
		if r.String() != s {
			t.Fatalf("ParseRepo(%q) prints as %q", s, r)
		}
		for _, part := range []string{r.Owner, r.Name} {
			if part == "" || part == "." || part == ".." || strings.ContainsFunc(part, func(c rune) bool {
				return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_')
			}) {
				t.Fatalf("ParseRepo(%q) accepted component %q", s, part)
			}
		}
		if strings.HasPrefix(r.Owner, "-") || strings.ContainsAny(r.Owner, "._") || len(r.Owner) > 39 || len(r.Name) > 100 {
			t.Fatalf("ParseRepo(%q) accepted %+v", s, r)
		}
	})
}
