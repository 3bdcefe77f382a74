package compose

import (
	"encoding/json"
	"fmt"

	"github.com/moby/profiles/seccomp"
)

// SeccompProfile is Docker's current default seccomp profile as JSON,
// for the primary service's `security_opt: seccomp=FILE`. Docker 20.10
// (Debian 12's engine) does not know `seccomp=builtin` (its container is
// created, then fails to start), and its own default allows AF_VSOCK
// sockets, which the current default denies: so the launch passes this
// profile explicitly.
func SeccompProfile() ([]byte, error) {
	data, err := json.Marshal(seccomp.DefaultProfile())
	if err != nil {
		return nil, fmt.Errorf("compose: the default seccomp profile: %w", err)
	}
	return data, nil
}
