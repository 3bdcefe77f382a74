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

func TestValidateAgentName(t *testing.T) {
	for _, n := range []string{"claude", "fake-agent", "a1", strings.Repeat("a", 32)} {
		if err := backend.ValidateAgentName(n); err != nil {
			t.Errorf("ValidateAgentName(%q) = %v, want nil", n, err)
		}
	}
	for _, n := range []string{"", "jailbee", "-x", "Claude", "a/b", "..", "a.b", "a b", strings.Repeat("a", 33)} {
		if err := backend.ValidateAgentName(n); err == nil {
			t.Errorf("ValidateAgentName(%q) = nil, want an error", n)
		}
	}
}

func TestSocketKind(t *testing.T) {
	for _, tc := range []struct {
		k                    backend.SocketKind
		path, dev, str, sock string
	}{
		{backend.OrchestrationSocket, backend.SocketMountPath, backend.SocketDeviceName, "orchestration", "broker.sock"},
		{backend.ModelSocket, backend.ModelMountPath, backend.ModelDeviceName, "model", "anthropic.sock"},
	} {
		if tc.k.MountPath() != tc.path || tc.k.DeviceName() != tc.dev || tc.k.String() != tc.str || tc.k.SocketFile() != tc.sock || !tc.k.Valid() {
			t.Errorf("%d: %q %q %q %q", tc.k, tc.k.MountPath(), tc.k.DeviceName(), tc.k, tc.k.SocketFile())
		}
	}
	if backend.SocketKind(7).Valid() {
		t.Error("kind 7 is valid")
	}
}
