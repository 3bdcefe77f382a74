package egress

import "time"

// Limits of one sandbox's egress proxy.
const (
	// MaxHeadBytes bounds a request's head (request line and headers
	// together): room for large cookies and authorization headers, while
	// MaxConns heads in memory stay a few MiB.
	MaxHeadBytes = 64 << 10
	// MaxRequestHeaderLines bounds the header lines of a request's head
	// (the request line aside; a folded continuation counts as a line of
	// its own). Parsing a head builds a map entry and strings for each
	// line, several times the line's bytes: a head of MaxHeadBytes in
	// 4-byte lines cost 1.2 to 1.8 MB, before any right was checked. One
	// more line is answered 431 before it is parsed.
	MaxRequestHeaderLines = 100
	// MaxResponseHeadBytes bounds the head of an upstream's response to a
	// forwarded request (its interim 1xx heads included): upstreams are
	// not trusted with the broker's memory either, and real ones send far
	// less.
	MaxResponseHeadBytes = 64 << 10
	// MaxResponseHeaderLines bounds the header lines of each head of an
	// upstream's response, as MaxRequestHeaderLines does a request's; one
	// more line is answered 502 before it is parsed.
	MaxResponseHeaderLines = 200
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
	// its destination to take the next bytes of the request and, once
	// its answer's head is read, to send the next bytes of its body. A
	// client that sends or reads nothing for this long ends its
	// connection; else it would hold its slot for ever, long after its
	// destination hung up. So does a destination that takes or sends
	// nothing: else a client that left mid-body, or one still waiting
	// for an answer that stalled, would hold its slot while the
	// destination neither moves nor hangs up.
	ClientIdleTimeout = 2 * time.Minute
	// RefusalLogBurst is how many refused connections, and failed ones
	// that passed no byte (a closed port fails as fast as a refusal), one
	// proxy logs one by one in each RefusalLogPeriod. The period's further ones, and
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
