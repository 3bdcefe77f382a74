package egress

import "time"

// Limits of one sandbox's egress proxy.
const (
	// MaxHeadBytes bounds a request's head (request line and headers
	// together): room for large cookies and authorization headers, while
	// MaxConns heads in memory stay a few MiB.
	MaxHeadBytes = 64 << 10
	// MaxResponseHeadBytes bounds the head of an upstream's response to a
	// forwarded request: upstreams are not trusted with the broker's
	// memory either, and real ones send far less.
	MaxResponseHeadBytes = 1 << 20
	// MaxConns is how many connections one sandbox may hold open through
	// the proxy; one more is answered 503 at once, so one sandbox cannot
	// spend the broker's descriptors.
	MaxConns = 256
	// HeadTimeout bounds how long a client may take to send its request
	// head: a silent client holds one slot for at most this long.
	HeadTimeout = 30 * time.Second
	// ResolveTimeout bounds the host's name lookup for one connection.
	ResolveTimeout = 10 * time.Second
	// DialTimeout bounds the connection to the destination, every
	// address of its name together.
	DialTimeout = 30 * time.Second
	// ResponseHeadTimeout bounds how long an upstream may take to answer
	// a forwarded request with its head.
	ResponseHeadTimeout = 2 * time.Minute
	// HalfClosedTimeout bounds a tunnel once one side has ended it: the
	// other way is kept open only while something moves on it at least
	// this often. A client that closed while its destination stays silent
	// (gave up on it, or meant to pin the slot) would otherwise hold its
	// slot, two descriptors and two goroutines for as long as the
	// destination keeps the connection open.
	HalfClosedTimeout = 2 * time.Minute
	// ClientIdleTimeout bounds each wait of a forwarded request once its
	// head is read: on its client for the next bytes of the body its head
	// declares and for it to take the next bytes of the answer, and on
	// its destination to take the next bytes of the request. A client
	// that sends or reads nothing for this long ends its connection; else
	// it would hold its slot for ever, long after its destination hung
	// up. So does a destination that takes nothing: else a client that
	// left mid-body would hold its slot while the destination neither
	// reads nor hangs up.
	ClientIdleTimeout = 2 * time.Minute
	// RefusalLogBurst is how many refused connections one proxy logs one
	// by one in each RefusalLogPeriod. The period's further refusals, and
	// every connection that closed without sending a request, are only
	// counted, and logged as one summary record at the period's end: a
	// sandbox that opens connections as fast as it can writes a few lines
	// a second to the broker log, not thousands.
	RefusalLogBurst = 20
	// RefusalLogPeriod is the period of RefusalLogBurst.
	RefusalLogPeriod = time.Second
	// replyTimeout bounds writing the proxy's own short answers.
	replyTimeout = 10 * time.Second
	// acceptBackoffMin and acceptBackoffMax bound the pause after a failed
	// accept (EMFILE and the like), doubling in between.
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)
