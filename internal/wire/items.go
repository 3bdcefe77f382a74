package wire

// Inbox item shapes, as the spec's Inbox section writes them. Field order
// follows the spec's examples.

// Item types.
const (
	ItemMessage = "message"
	ItemStatus  = "status"
)

// Status states: the five values a status reply can carry.
const (
	StateQueued  = "queued"
	StateStarted = "started"
	StateDone    = "done"
	StateFailed  = "failed"
	StateRefused = "refused"
)

// FinalState reports whether no later status follows state for the same ref.
func FinalState(state string) bool {
	return state == StateDone || state == StateFailed || state == StateRefused
}

// MessageItem is a message in an inbox. InReplyTo is always present (null
// when the sender named none); OriginID is absent on host-generated
// messages.
type MessageItem struct {
	Version      int     `json:"version"`
	ID           string  `json:"id"`
	Type         string  `json:"type"`
	From         string  `json:"from"`
	Kind         string  `json:"kind"`
	Body         string  `json:"body"`
	InReplyTo    *string `json:"in_reply_to"`
	OriginID     string  `json:"origin_id,omitempty"`
	ImportedRef  string  `json:"imported_ref,omitempty"`
	ImportedSHA  string  `json:"imported_sha,omitempty"`
	ImportError  string  `json:"import_error,omitempty"`
	OnDone       string  `json:"on_done,omitempty"`
	OnDoneReason string  `json:"on_done_reason,omitempty"`
	MergedHead   string  `json:"merged_head,omitempty"`
}

// StatusItem answers one manifest: Ref is the manifest id.
type StatusItem struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	Type    string `json:"type"`
	Ref     string `json:"ref"`
	State   string `json:"state"`
	Detail  string `json:"detail"`
}
