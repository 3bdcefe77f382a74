package spool_test

import (
	"testing"

	"agentbox/internal/managed/spool"
)

func TestBinding(t *testing.T) {
	for _, tc := range []struct {
		name, policy, golden string
	}{
		{"without replay policy", "",
			`{"version":"1","run_id":"run-1","lease_id":"lease-1","endpoint_lease_id":"lease-ep","consumer":"agent",` +
				`"request_directory":"/run/branchbox/spool/requests","response_directory":"/run/branchbox/spool/responses",` +
				`"capability_path":"/run/branchbox/spool/.capability","request_filename":"<request_id>.json",` +
				`"response_filename":"<request_id>.json","max_pending_requests":16,"max_request_bytes":262144,` +
				`"max_spool_bytes":1048576,"max_response_bytes":262144}` + "\n"},
		{"with replay policy", "at-most-once",
			`{"version":"1","run_id":"run-1","lease_id":"lease-1","endpoint_lease_id":"lease-ep","consumer":"agent",` +
				`"request_directory":"/run/branchbox/spool/requests","response_directory":"/run/branchbox/spool/responses",` +
				`"capability_path":"/run/branchbox/spool/.capability","request_filename":"<request_id>.json",` +
				`"response_filename":"<request_id>.json","max_pending_requests":16,"max_request_bytes":262144,` +
				`"max_spool_bytes":1048576,"max_response_bytes":262144,"replay_policy":"at-most-once"}` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The trailing slash on target must not double up in paths.
			b := spool.NewBinding("run-1", "lease-1", "lease-ep", "agent", "/run/branchbox/spool/", tc.policy)
			got := string(b.Marshal())
			if got != tc.golden {
				t.Errorf("Marshal\n%s\nwant\n%s", got, tc.golden)
			}
			if again := string(b.Marshal()); again != got {
				t.Error("Marshal not deterministic")
			}
		})
	}
}
