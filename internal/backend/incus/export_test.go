package incus

import "time"

// SetEgressTimeout sets egressTimeout for a test; the returned function
// puts it back.
func SetEgressTimeout(d time.Duration) func() {
	old := egressTimeout
	egressTimeout = d
	return func() { egressTimeout = old }
}
