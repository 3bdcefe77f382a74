package secfs

import (
	"errors"
	"fmt"
	"os"
)

// WithoutPath is err without the host path(s) an *os.PathError or an
// *os.LinkError in its chain carries: that error's own cause (an
// *os.PathError is looked for first). Anything err wraps around it goes
// too; the caller names the file as it sees fit. Any other err, nil
// included, is returned as it is.
func WithoutPath(err error) error {
	if _, inner, ok := pathCause(err); ok {
		return inner
	}
	return err
}

// OpWithoutPath is WithoutPath keeping the operation: "open: permission
// denied" where the *os.PathError said "open /some/path: permission
// denied". The cause stays in the chain for errors.Is.
func OpWithoutPath(err error) error {
	if op, inner, ok := pathCause(err); ok {
		return fmt.Errorf("%s: %w", op, inner)
	}
	return err
}

// pathCause finds the first *os.PathError, else the first *os.LinkError,
// in err's chain and returns its operation and cause.
func pathCause(err error) (op string, inner error, ok bool) {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Op, pe.Err, true
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Op, le.Err, true
	}
	return "", nil, false
}
