package config

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode"
)

// CheckWarmPath validates one warm_paths glob: a repo-relative path of
// "/"-separated segments where "*" matches one segment's characters and a
// whole "**" segment matches zero or more segments. Absolute paths, ".."
// and ".git" segments (the spec's ".git roots"; refused at any depth, since
// a nested .git is a repository's internals too), empty and "." segments,
// backslashes, and control and format characters (U+202E and the other
// bidi overrides reorder how a path reads in a terminal) are refused.
func CheckWarmPath(glob string) error {
	switch {
	case glob == "":
		return errors.New("warm path must not be empty")
	case len(glob) > MaxWarmPathLen:
		return fmt.Errorf("warm path exceeds %d bytes", MaxWarmPathLen)
	case strings.HasPrefix(glob, "/"):
		return errors.New("warm path must be relative to the repository, not absolute")
	case strings.ContainsRune(glob, '\\'):
		return errors.New("warm path must not contain a backslash")
	case strings.ContainsFunc(glob, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }):
		return errors.New("warm path must not contain control or format characters")
	}
	for _, seg := range strings.Split(glob, "/") {
		switch {
		case seg == "..":
			return errors.New("warm path must not contain `..`")
		case seg == ".git":
			return errors.New("warm path must not reach into `.git`")
		case seg == "" || seg == ".":
			return errors.New("warm path must not have empty or `.` segments")
		case seg != "**" && strings.Contains(seg, "**"):
			return errors.New("warm path may use `**` only as a whole segment")
		}
	}
	return nil
}

// MatchWarmPath reports whether path (repo-relative, "/"-separated, no
// trailing slash) matches glob, a glob CheckWarmPath accepts: segment by
// segment, "*" within a segment as path.Match has it, a whole "**" segment
// for zero or more segments.
func MatchWarmPath(glob, p string) bool {
	return matchSegments(strings.Split(glob, "/"), strings.Split(p, "/"))
}

// matchSegments is dynamic programming over (glob segment, path segment)
// pairs: linear in their product whatever the "**"s, as the path comes
// from a sandbox.
func matchSegments(globs, segs []string) bool {
	// next[j]: globs[i+1:] matches segs[j:]; cur[j]: globs[i:] matches segs[j:].
	next := make([]bool, len(segs)+1)
	next[len(segs)] = true
	cur := make([]bool, len(segs)+1)
	for i := len(globs) - 1; i >= 0; i-- {
		cur[len(segs)] = globs[i] == "**" && next[len(segs)]
		for j := len(segs) - 1; j >= 0; j-- {
			if globs[i] == "**" {
				cur[j] = next[j] || cur[j+1] // zero segments, or one more
				continue
			}
			ok, err := path.Match(globs[i], segs[j])
			cur[j] = err == nil && ok && next[j+1]
		}
		next, cur = cur, next
	}
	return next[0]
}
