package config

import (
	"strings"
	"testing"
)

func TestMatchWarmPath(t *testing.T) {
	cases := []struct {
		glob, path string
		want       bool
	}{
		{"target", "target", true},
		{"target", "target/debug", false},
		{"target", "src/target", false},
		{"*", "build", true},
		{"*", "a/b", false},
		{"*/dist", "web/dist", true},
		{"*/dist", "web/app/dist", false},
		{"**/dist", "dist", true},
		{"**/dist", "web/app/dist", true},
		{"**/dist", "web/app/dist2", false},
		{"web/**", "web", true},
		{"web/**", "web/a/b", true},
		{"**", "anything/at/all", true},
		{"*.o", "main.o", true},
		{"*.o", "src/main.o", false},
		{"**/*.o", "src/main.o", true},
		{"node_modules", "node_modules", true},
		{"a/**/c", "a/c", true},
		{"a/**/c", "a/b/x/c", true},
		{"a/**/c", "a/b/x/d", false},
		{"[", "[", false}, // a bad pattern matches nothing
	}
	for _, c := range cases {
		if got := MatchWarmPath(c.glob, c.path); got != c.want {
			t.Errorf("MatchWarmPath(%q, %q) = %v, want %v", c.glob, c.path, got, c.want)
		}
	}
}

func FuzzMatchWarmPath(f *testing.F) {
	f.Add("**/dist", "web/app/dist")
	f.Add("a/**/**/c", "a/b/c")
	f.Fuzz(func(t *testing.T, glob, p string) {
		if CheckWarmPath(glob) != nil || len(p) > 4096 {
			return
		}
		MatchWarmPath(glob, p) // must not panic or hang
	})
}

// TestMatchWarmPathManyDoubleStars: a glob of many "**" against a long
// path of the wrong ending answers (no exponential search).
func TestMatchWarmPathManyDoubleStars(t *testing.T) {
	glob := strings.Repeat("**/a/", 40) + "b"
	if err := CheckWarmPath(glob); err != nil {
		t.Fatal(err)
	}
	p := strings.Repeat("a/", 2000) + "c"
	if MatchWarmPath(glob, p) {
		t.Fatal("matched a path that does not end in b")
	}
	if !MatchWarmPath(glob, strings.Repeat("a/", 2000)+"b") {
		t.Fatal("did not match a path that does")
	}
}
