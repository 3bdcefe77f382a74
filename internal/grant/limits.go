package grant

import "time"

const (
	// MaxDocBytes bounds a grant document before it is parsed; a real one
	// is a few hundred bytes.
	MaxDocBytes = 64 << 10

	// MaxRunningChildrenLimit is the largest max_running_children a grant
	// may carry; a bigger number is a typo, not a plan.
	MaxRunningChildrenLimit = 64

	// MaxItems bounds each of mounts and egress in one rights set, so one
	// request cannot make the broker apply an unbounded device list.
	MaxItems = 64

	// MaxNameLen bounds a mount name.
	MaxNameLen = 64

	// MaxHostLen is the DNS limit for a host name.
	MaxHostLen = 253

	// MaxTTL is the longest timed grant (spec: "max 24h").
	MaxTTL = 24 * time.Hour

	// maxTTLTextLen bounds a TTL's text so its digits cannot overflow.
	maxTTLTextLen = 16
)
