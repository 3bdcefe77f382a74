package cli

import (
	"errors"
	"testing"
)

// TestProviderExit: the provider's status as both exec-provider commands
// report it; a client killed by a signal (Go's -1) is said so, not
// reported as a status.
func TestProviderExit(t *testing.T) {
	for _, c := range []struct {
		code int
		msg  string
	}{
		{0, ""},
		{3, "the provider exited with status 3"},
		{-1, "the provider was killed by a signal"},
	} {
		err := providerExit(c.code)
		var ee *exitError
		switch {
		case c.msg == "" && err != nil:
			t.Errorf("%d: %v, want nil", c.code, err)
		case c.msg != "" && (!errors.As(err, &ee) || ee.msg != c.msg || ee.code != ExitRefused):
			t.Errorf("%d: %v, want %q (exit %d)", c.code, err, c.msg, ExitRefused)
		}
	}
}
