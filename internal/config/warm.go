package config

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// CheckWarmPath validates one warm_paths glob: a repo-relative path of
// "/"-separated segments where "*" matches one segment's characters and a
// whole "**" segment matches zero or more segments. Absolute paths, ".."
// and ".git" segments (the spec's ".git roots"; refused at any depth, since
// a nested .git is a repository's internals too), empty and "." segments,
// backslashes and control characters are refused.
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
	case strings.ContainsFunc(glob, unicode.IsControl):
		return errors.New("warm path must not contain control characters")
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
