package wire

import "encoding/json"

// The sandbox socket's ops (broker.sock inside a sandbox), shared by the
// broker and `jailbee inbox`. Items travel as json.RawMessage: the broker
// splices in the stored documents (MessageItem, StatusItem) unchanged.
//
// Ops whose result is one stored document have no result type here: read
// answers the item, send and status REF a StatusItem, grant the grant
// document (internal/grant's Grant).

// ListArgs are the arguments of "list".
type ListArgs struct {
	All bool `json:"all"`
}

// ListResult is the result of "list": inbox items oldest first, each shaped
// as in the spec's Inbox section. ReadIDs names the items already read
// (only with all=true). More is true when items were left out to keep the
// reply within the 1 MiB line limit (read some, then list again). The
// broker writes this shape by hand to splice the stored items in.
type ListResult struct {
	Items   []json.RawMessage `json:"items"`
	ReadIDs []string          `json:"read_ids,omitempty"`
	More    bool              `json:"more,omitempty"`
}

// ReadArgs are the arguments of "read". The result is the item.
type ReadArgs struct {
	ID   string `json:"id"`
	Keep bool   `json:"keep"`
}

// AckArgs are the arguments of "ack".
type AckArgs struct {
	ID string `json:"id"`
}

// AckResult is the result of "ack".
type AckResult struct {
	ID   string `json:"id"`
	Read bool   `json:"read"`
}

// NextArgs are the arguments of "next". Empty filters match every item.
type NextArgs struct {
	Ref          string   `json:"ref,omitempty"`           // only statuses of this manifest id
	MsgKinds     []string `json:"msg_kinds,omitempty"`     // message kinds that wake
	StatusStates []string `json:"status_states,omitempty"` // status states that wake
	Ack          bool     `json:"ack,omitempty"`           // mark the returned item read
	QuietAfterMS int64    `json:"quiet_after_ms,omitempty"`
}

// NextResult is the result of "next": an item, or quiet=true when no item
// of any kind arrived for quiet_after_ms.
type NextResult struct {
	Item  json.RawMessage `json:"item,omitempty"`
	Quiet bool            `json:"quiet,omitempty"`
}

// SendArgs are the arguments of "send": the manifest, and the text for a
// manifest that uses prompt_file or body_file. The result is the
// manifest's first StatusItem.
type SendArgs struct {
	Manifest json.RawMessage `json:"manifest"`
	Body     *string         `json:"body,omitempty"`
}

// ChildInfo is one entry of ChildrenResult.
type ChildInfo struct {
	Name    string `json:"name"`
	Branch  string `json:"branch"`
	State   string `json:"state"`
	Running bool   `json:"running"`
}

// ChildrenResult is the result of "children" (no arguments): the caller's
// children, never null.
type ChildrenResult struct {
	Children []ChildInfo `json:"children"`
}

// StatusArgs are the arguments of "status". With Ref the result is that
// manifest's latest StatusItem; without, a StatusResult.
type StatusArgs struct {
	Ref string `json:"ref,omitempty"`
}

// StatusResult is the result of "status" without a ref: the latest status
// of each manifest, oldest first. More is true when older ones were left
// out to keep the reply within the line limit.
type StatusResult struct {
	Statuses []json.RawMessage `json:"statuses"`
	More     bool              `json:"more,omitempty"`
}
