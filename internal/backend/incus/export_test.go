package incus

import (
	"context"
	"time"
)

// SetEgressTimeout sets egressTimeout for a test; the returned function
// puts it back.
func SetEgressTimeout(d time.Duration) func() {
	old := egressTimeout
	egressTimeout = d
	return func() { egressTimeout = old }
}

// RunInside runs argv inside the container name as root the way the
// backend runs its own commands there (runInside).
func (b *Backend) RunInside(ctx context.Context, name string, argv ...string) ([]byte, error) {
	return b.runInside(ctx, nil, append([]string{"exec", name, "--user", "0", "--group", "0", "--force-noninteractive", "--"}, argv...)...)
}
