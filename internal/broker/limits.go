package broker

import (
	"cmp"
	"fmt"
	"time"

	"agentbox/internal/store"
)

// Limits from the spec, and the broker's own bounds.
const (
	// MaxConnsPerSandbox: "A container may hold at most 8 connections; a
	// ninth is answered with busy and closed."
	MaxConnsPerSandbox = 8
	// MaxQueriesPerSandbox: "Each container may have at most two of these
	// store queries queued or running; further requests wait in their
	// connections."
	MaxQueriesPerSandbox = 2
	// MaxSendsPerSandbox: one send of a sandbox is in line for the
	// executor or running at a time; its others wait in their connections.
	MaxSendsPerSandbox = 1
	// QueryWorkers run store queries (list, read, ack) for every sandbox.
	QueryWorkers = 4
	// QueryQueueCap bounds the broker-wide store-query queue; a query finding
	// it full gets busy.
	QueryQueueCap = 64
	// TreeMaxQueries bounds the store queries one orchestrator's tree (it
	// and its children) has queued or running while it queries alone:
	// half of the broker-wide queue. Its 64 children may each hold
	// MaxQueriesPerSandbox, enough to keep the whole queue full and every
	// other sandbox busy. While more trees query, each gets less
	// (queryPool.share).
	TreeMaxQueries = (QueryWorkers + QueryQueueCap) / 2
	// ExecQueueCap bounds the executor's queue (send); a full queue is busy.
	ExecQueueCap = 256
	// WriteTimeout: a client that does not collect its reply for this long
	// is disconnected ("stops reading a connection whose replies the client
	// is not collecting").
	WriteTimeout = 30 * time.Second
	// LineReadTimeout: a request line begun must end within this, or the
	// connection is closed. Clients write a line at once; without it a
	// connection could hold a line's buffer (up to 1 MiB) for ever.
	LineReadTimeout = 30 * time.Second
	// RoundInterval is the cadence of the broker round that reconciles state
	// and publishes the snapshot read by children, status and grant.
	RoundInterval = time.Second
	// acceptBackoffMin and acceptBackoffMax bound the pause after a failed
	// accept (EMFILE: wait for descriptors to free up, do not spin).
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	// DrainTimeout is how long a shutdown lets requests in flight finish
	// before it closes their connections.
	DrainTimeout = 10 * time.Second
	// readBufBytes is the per-connection read buffer; lines longer than it
	// are assembled up to the 1 MiB cap, so idle connections stay small.
	readBufBytes = 4096
)

// The inbox quota's defaults: a message that would put its recipient past
// either bound of unread items is refused (docs/protocol.md). Bytes are the
// lengths of the stored item documents.
const (
	DefaultInboxMaxUnreadItems = 1000
	DefaultInboxMaxUnreadBytes = 32 << 20 // 32 MiB
	// DefaultTreeMaxUnreadItems and DefaultTreeMaxUnreadBytes bound the
	// unread messages (statuses do not count) of an orchestrator and all
	// its children together, checked on messages to a child: however
	// many children it keeps, an orchestrator's messages hold at most
	// this much.
	DefaultTreeMaxUnreadItems = 2000
	DefaultTreeMaxUnreadBytes = 64 << 20 // 64 MiB
)

// inboxQuota is the quota the broker runs with: q with each zero bound set
// to its default. The broker never runs without a quota, so a negative
// bound is an error rather than "unbounded".
func inboxQuota(q store.Quota) (store.Quota, error) {
	if q.MaxUnreadItems < 0 || q.MaxUnreadBytes < 0 || q.TreeMaxUnreadItems < 0 || q.TreeMaxUnreadBytes < 0 {
		return store.Quota{}, fmt.Errorf("inbox quota: bounds must be positive (max unread items %d, max unread bytes %d, tree %d items, %d bytes)",
			q.MaxUnreadItems, q.MaxUnreadBytes, q.TreeMaxUnreadItems, q.TreeMaxUnreadBytes)
	}
	q.MaxUnreadItems = cmp.Or(q.MaxUnreadItems, DefaultInboxMaxUnreadItems)
	q.MaxUnreadBytes = cmp.Or(q.MaxUnreadBytes, DefaultInboxMaxUnreadBytes)
	q.TreeMaxUnreadItems = cmp.Or(q.TreeMaxUnreadItems, DefaultTreeMaxUnreadItems)
	q.TreeMaxUnreadBytes = cmp.Or(q.TreeMaxUnreadBytes, DefaultTreeMaxUnreadBytes)
	return q, nil
}
