package policy_test

import (
	"testing"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/policy"
)

func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		cap  string
		want bool
	}{
		{policy.ServiceCapabilities, "CHOWN", true},
		{policy.ServiceCapabilities, "cap_chown", true},
		{policy.ServiceCapabilities, " CAP_SETUID ", true},
		{policy.ServiceCapabilities, "DAC_READ_SEARCH", false},
		{policy.ServiceCapabilities, "SYS_ADMIN", false},
		{policy.ServiceCapabilities, "ALL", false},
		{policy.ServiceCapabilities, "MKNOD", false},
		{policy.ServiceCapabilities, "", false},
		{policy.PrimaryCapabilities, "CHOWN", false},
		{policy.Capabilities(true), "KILL", false},
		{policy.Capabilities(false), "KILL", true},
	} {
		if got := policy.Allowed(tc.set, tc.cap); got != tc.want {
			t.Errorf("Allowed(%v, %q) = %v, want %v", tc.set, tc.cap, got, tc.want)
		}
	}
}

// TestProviderGIDIsNeverTheConsumers: the provider's group must differ
// from the consumer's, or the consumer's other processes could read the
// provider's environment.
func TestProviderGIDIsNeverTheConsumers(t *testing.T) {
	for _, consumer := range []uint32{1, 1000, 2147483582, 2147483600, 2147483645, 2147483646, 2147483647} {
		seen := map[uint32]bool{}
		for lease := range assignment.MaxLeases {
			got := policy.ProviderGID(consumer, lease)
			if got == consumer || got == 0 || seen[got] {
				t.Errorf("ProviderGID(%d, %d) = %d", consumer, lease, got)
			}
			seen[got] = true
		}
	}
}
