package main

import (
	"fmt"
	"os"
	"path/filepath"

	"agentbox/internal/backend"
	"agentbox/internal/backend/local"
	"agentbox/internal/cli"
)

// openBackend is the only place that knows the concrete backends.
func openBackend(o cli.BackendOptions) (backend.Backend, error) {
	switch o.Kind {
	case local.Type:
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("cannot find the jailbee binary: %w", err)
		}
		return local.New(local.Options{
			Root:     filepath.Join(o.StateDir, "sandboxes"),
			Binary:   exe,
			NoLimits: o.NoLimits,
		})
	default:
		return nil, fmt.Errorf("backend %q is not available (this build has: local)", o.Kind)
	}
}
