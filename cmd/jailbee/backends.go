package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"agentbox/internal/backend"
	"agentbox/internal/backend/incus"
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
			Root:          filepath.Join(o.StateDir, "sandboxes"),
			Binary:        exe,
			NoLimits:      o.NoLimits,
			AgentBinaries: o.AgentBinaries,
		})
	case incus.Type:
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("cannot find the jailbee binary: %w", err)
		}
		return incus.New(context.Background(), incus.Options{
			Project: o.IncusProject, Pool: o.IncusPool, Image: o.Image, Client: exe, NoLimits: o.NoLimits,
			AgentBinaries: o.AgentBinaries,
		})
	default:
		return nil, fmt.Errorf("backend %q is not available (this build has: local, incus)", o.Kind)
	}
}

// buildImage is `jailbee image build`.
func buildImage(ctx context.Context, o cli.ImageOptions) error {
	b, err := incus.New(ctx, incus.Options{Project: o.IncusProject})
	if err != nil {
		return err
	}
	return b.BuildImage(ctx, incus.BuildOptions{Alias: o.Alias, Force: o.Force, Progress: o.Progress})
}
