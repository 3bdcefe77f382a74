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

// agentNamePattern is the name an agent binary runs as on a sandbox's
// PATH: a plain file name, safe in a path and an Incus device name.
var agentNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// ValidateAgentName returns nil for a name an agent binary may run as:
// a plain name that is not the jailbee client's own.
func ValidateAgentName(name string) error {
	if !agentNamePattern.MatchString(name) || name == "jailbee" {
		return fmt.Errorf("invalid agent binary name %q (a plain name of lowercase letters, digits and dashes, not jailbee)", name)
	}
	return nil
}
