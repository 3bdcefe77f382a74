package broker

import "time"

// Limits from the spec, and the broker's own bounds.
const (
	// MaxConnsPerSandbox: "A container may hold at most 8 connections; a
	// ninth is answered with busy and closed."
	MaxConnsPerSandbox = 8
	// MaxQueriesPerSandbox: "Each container may have at most two of these
	// store queries queued or running; further requests wait in their
	// connections."
	MaxQueriesPerSandbox = 2
	// QueryWorkers run store queries (list, read, ack) for every sandbox.
	QueryWorkers = 4
	// QueryQueueCap bounds the broker-wide store-query queue; a query finding
	// it full gets busy.
	QueryQueueCap = 64
	// ExecQueueCap bounds the executor's queue (send); a full queue is busy.
	ExecQueueCap = 256
	// WriteTimeout: a client that does not collect its reply for this long
	// is disconnected ("stops reading a connection whose replies the client
	// is not collecting").
	WriteTimeout = 30 * time.Second
	// RoundInterval is the cadence of the broker round that reconciles state
	// and publishes the snapshot read by children, status and grant.
	RoundInterval = time.Second
	// readBufBytes is the per-connection read buffer; lines longer than it
	// are assembled up to the 1 MiB cap, so idle connections stay small.
	readBufBytes = 4096
)
