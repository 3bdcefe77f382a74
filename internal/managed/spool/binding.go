package spool

import (
	"bytes"
	"encoding/json"
	"path"
)

// Binding is the spool's .binding.json (root-owned, 0444, non-secret): what
// the consumer needs to write requests.
type Binding struct {
	Version            string `json:"version"` // "1"
	RunID              string `json:"run_id"`
	LeaseID            string `json:"lease_id"`
	EndpointLeaseID    string `json:"endpoint_lease_id"`
	Consumer           string `json:"consumer"`
	RequestDirectory   string `json:"request_directory"`  // <spool target>/requests
	ResponseDirectory  string `json:"response_directory"` // <spool target>/responses
	CapabilityPath     string `json:"capability_path"`    // <spool target>/.capability
	RequestFilename    string `json:"request_filename"`   // "<request_id>.json"
	ResponseFilename   string `json:"response_filename"`  // "<request_id>.json"
	MaxPendingRequests int    `json:"max_pending_requests"`
	MaxRequestBytes    int    `json:"max_request_bytes"`
	MaxSpoolBytes      int    `json:"max_spool_bytes"`
	MaxResponseBytes   int    `json:"max_response_bytes"`
	ReplayPolicy       string `json:"replay_policy,omitempty"`
}

// NewBinding fills the binding for a spool mounted at target, a container
// path (hence slash-separated path, not filepath).
func NewBinding(runID, leaseID, endpointLeaseID, consumer, target, replayPolicy string) Binding {
	return Binding{
		Version:            Version,
		RunID:              runID,
		LeaseID:            leaseID,
		EndpointLeaseID:    endpointLeaseID,
		Consumer:           consumer,
		RequestDirectory:   path.Join(target, "requests"),
		ResponseDirectory:  path.Join(target, "responses"),
		CapabilityPath:     path.Join(target, ".capability"),
		RequestFilename:    "<request_id>.json",
		ResponseFilename:   "<request_id>.json",
		MaxPendingRequests: MaxPendingRequests,
		MaxRequestBytes:    MaxRequestBytes,
		MaxSpoolBytes:      MaxSpoolBytes,
		MaxResponseBytes:   MaxResponseBytes,
		ReplayPolicy:       replayPolicy,
	}
}

// Marshal is compact JSON plus "\n"; struct field order makes it
// deterministic. HTML escaping is off so "<request_id>" reads as written.
func (b Binding) Marshal() []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(b); err != nil {
		// Strings and ints always encode.
		panic("spool: encoding binding: " + err.Error())
	}
	return buf.Bytes()
}
