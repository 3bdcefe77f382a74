// Package spool is the tool-request spool's formats, pure: the request
// envelope the consumer writes, the capability-free frame relayed to the
// trusted endpoint and its fingerprint, the endpoint's response, the
// runtime's claim and done records, and the binding document the spool
// carries. No I/O; every decoder is strict and never echoes a value.
package spool

// Limits of a spool (the binding document states them to the consumer).
const (
	// MaxPendingRequests bounds the files in requests/.
	MaxPendingRequests = 16
	// MaxRequestBytes bounds one request file (and the relayed frame).
	MaxRequestBytes = 256 << 10
	// MaxSpoolBytes bounds all files in requests/ together.
	MaxSpoolBytes = 1 << 20
	// MaxResponseBytes bounds the endpoint's response frame.
	MaxResponseBytes = 256 << 10
	// MaxWaitSeconds bounds dispatch-tool's --wait-seconds.
	MaxWaitSeconds = 300
)

// Version is the only envelope, response, record and binding version.
const Version = "1"
