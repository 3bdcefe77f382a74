package backend

import (
	"errors"
	"fmt"
	"regexp"
)

// NameMaxLen is the longest sandbox name: short enough for an Incus
// instance name and a path component on every filesystem.
const NameMaxLen = 64

// ErrInvalidName reports a sandbox name outside namePattern.
var ErrInvalidName = errors.New("invalid sandbox name")

// namePattern admits lowercase letters, digits and dashes, not leading
// with a dash: a valid name is safe as a path component and an argument.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// ValidateName returns nil for a valid sandbox name and an error wrapping
// ErrInvalidName otherwise. Every backend checks names with it.
func ValidateName(name string) error {
	if len(name) > NameMaxLen || !namePattern.MatchString(name) {
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	return nil
}
