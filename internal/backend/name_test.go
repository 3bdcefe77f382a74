package backend_test

import (
	"errors"
	"strings"
	"testing"

	"agentbox/internal/backend"
)

func TestValidateName(t *testing.T) {
	valid := []string{"a", "0", "child-1", "x--y", strings.Repeat("a", backend.NameMaxLen)}
	invalid := []string{"", "-a", "A", "a_b", "a.b", "../x", "a/b", ".x", "a b", "é", strings.Repeat("a", backend.NameMaxLen+1)}
	for _, n := range valid {
		if err := backend.ValidateName(n); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", n, err)
		}
	}
	for _, n := range invalid {
		if err := backend.ValidateName(n); !errors.Is(err, backend.ErrInvalidName) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidName", n, err)
		}
	}
}
