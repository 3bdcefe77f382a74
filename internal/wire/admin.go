package wire

import (
	"encoding/json"
	"time"
)

// The host admin socket's ops (<state>/admin.sock), shared by the broker
// and the host commands. Arguments and results are JSON like the sandbox
// protocol's; exec also carries three descriptors (see ExecArgs).

// NewArgs are the arguments of "new".
type NewArgs struct {
	Name   string          `json:"name"`
	Repo   string          `json:"repo,omitempty"`
	Branch string          `json:"branch,omitempty"`
	Role   Role            `json:"role"`
	Parent string          `json:"parent,omitempty"`
	Grant  json.RawMessage `json:"grant,omitempty"`
}

// NewResult is the result of "new".
type NewResult struct {
	Name   string `json:"name"`
	UUID   string `json:"uuid"`
	Branch string `json:"branch"`
}

// NameArgs name one sandbox ("start", "stop").
type NameArgs struct {
	Name string `json:"name"`
}

// StartResult is the result of "start".
type StartResult struct {
	// Note is what the start did not do (a spawned child's agent is not
	// started with its sandbox), for the user.
	Note string `json:"note,omitempty"`
}

// DestroyArgs are the arguments of "destroy".
type DestroyArgs struct {
	Name  string `json:"name"`
	Force bool   `json:"force"`
}

// DestroyResult is the result of "destroy".
type DestroyResult struct {
	Destroyed int `json:"destroyed"`
}

// FetchArgs are the arguments of "fetch": Repo "" is the repository the
// sandbox was made from, Branch "" its branch.
type FetchArgs struct {
	Name   string `json:"name"`
	Repo   string `json:"repo,omitempty"`
	Branch string `json:"branch,omitempty"`
}

// FetchResult is the result of "fetch": the ref written in the host
// repository and the full commit id it names.
type FetchResult struct {
	Ref string `json:"ref"`
	SHA string `json:"sha"`
}

// SandboxInfo is one entry of "ls" (and of `jailbee ls --json`).
type SandboxInfo struct {
	Name    string  `json:"name"`
	Role    Role    `json:"role"`
	Parent  *string `json:"parent"`
	State   string  `json:"state"`
	Running bool    `json:"running"`
	Branch  string  `json:"branch"`
	UUID    string  `json:"uuid"`
	Socket  *string `json:"socket"`
	// LastStatus is a spawned child's latest status for its spawn or last
	// restart, as its orchestrator has it.
	LastStatus *StatusItem `json:"last_status,omitempty"`
	// Tokens is the sandbox's model usage: input plus output tokens.
	Tokens int64 `json:"tokens"`
}

// UsageArgs are the arguments of "usage": Name "" asks for every
// sandbox's usage.
type UsageArgs struct {
	Name string `json:"name,omitempty"`
}

// Usage is model usage: the requests answered and the tokens of their
// responses, as the upstream reported them.
type Usage struct {
	Requests                 int64 `json:"requests"`
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
}

// Add adds u's figures to v.
func (v *Usage) Add(u Usage) {
	v.Requests += u.Requests
	v.InputTokens += u.InputTokens
	v.OutputTokens += u.OutputTokens
	v.CacheReadInputTokens += u.CacheReadInputTokens
	v.CacheCreationInputTokens += u.CacheCreationInputTokens
}

// UsageRow is one sandbox's usage (a row of "usage", and an entry of
// `jailbee usage --json`). A sandbox keeps its row after it is destroyed,
// and a name used again gets a row of its own (rows are by UUID).
type UsageRow struct {
	Name string `json:"name"`
	UUID string `json:"uuid"`
	// Tree is its orchestrator tree: an orchestrator's own name, a
	// child's orchestrator's.
	Tree string `json:"tree"`
	Usage
	Destroyed bool      `json:"destroyed"`
	Updated   time.Time `json:"updated"` // when usage was last recorded
}

// TreeUsage is the total of every row of an orchestrator tree, those not
// asked for included.
type TreeUsage struct {
	Tree string `json:"tree"`
	Usage
}

// UsageResult is the result of "usage": the rows asked for, sorted by
// tree then name, and the total of each tree they belong to.
type UsageResult struct {
	Rows  []UsageRow  `json:"rows"`
	Trees []TreeUsage `json:"trees"`
}

// ExecArgs are the arguments of "exec". The request line is sent with the
// command's stdin, stdout and stderr as SCM_RIGHTS (three descriptors, in
// that order; with TTY all three are one terminal). The reply comes when
// the command has ended; the client closing the connection first ends it.
type ExecArgs struct {
	Name string            `json:"name"`
	Argv []string          `json:"argv"`
	User string            `json:"user,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	Dir  string            `json:"dir,omitempty"`
	TTY  bool              `json:"tty,omitempty"`
}

// ExecResult is the result of "exec".
type ExecResult struct {
	Exit int `json:"exit"`
}

// RightsItems names rights items: mounts by broker.yaml name, loose, and
// egress hosts.
type RightsItems struct {
	Mounts []string `json:"mounts,omitempty"`
	Loose  bool     `json:"loose,omitempty"`
	Egress []string `json:"egress,omitempty"`
}

// RightsArgs are the arguments of "rights": a sandbox's rights, after
// removing Remove and adding Add by hand (both optional).
type RightsArgs struct {
	Name   string      `json:"name"`
	Add    RightsItems `json:"add"`
	Remove RightsItems `json:"remove"`
}

// RightInfo is one right of a sandbox (an entry of `jailbee rights
// --json`).
type RightInfo struct {
	Kind  string `json:"kind"` // mount, egress or loose
	Item  string `json:"item"` // "" for loose
	Owner string `json:"owner"`
	// ExpiresAt is RFC 3339 UTC; "" when the right does not expire.
	ExpiresAt string `json:"expires_at"`
}

// RightsResult is the answer of "rights".
type RightsResult struct {
	Rights []RightInfo `json:"rights"`
	Notes  []string    `json:"notes,omitempty"`
}

// PsResult is the result of "ps" (NameArgs): every service of the
// sandbox's repository config, sorted by name.
type PsResult struct {
	Services []ServiceInfo `json:"services"`
}

// ServiceInfo is one service in a PsResult. State is running, exited or
// not started; Selected says whether the sandbox's starts run it (its
// autostart profile and services, dependencies included).
type ServiceInfo struct {
	Name     string `json:"name"`
	Selected bool   `json:"selected"`
	State    string `json:"state"`
	PID      int    `json:"pid,omitempty"`       // running: its pane's pid in the sandbox
	ExitCode *int   `json:"exit_code,omitempty"` // exited: its status (absent: ended by a signal)
}

// OutboxAction is one action of a publish proposal as journaled: State is
// "" (not tried), prepared, applied, uncertain or failed.
type OutboxAction struct {
	Kind   string `json:"kind"`
	State  string `json:"state"`
	URL    string `json:"url,omitempty"`
	Number int    `json:"number,omitempty"` // the issue or pull request it created or touched
	Detail string `json:"detail,omitempty"` // the forge's safe message of a failure
}

// OutboxJournal is a publish proposal's journal, as stored in the broker's
// state dir and answered by "outbox-ls", "outbox-show" and
// "outbox-resolve". State is running, done, failed or blocked.
type OutboxJournal struct {
	Version int            `json:"version"`
	Sandbox string         `json:"sandbox"`
	Outbox  string         `json:"outbox"`
	Name    string         `json:"name"`
	Ref     string         `json:"ref"` // the publish manifest whose final status reports it
	State   string         `json:"state"`
	Actions []OutboxAction `json:"actions"`
	Updated int64          `json:"updated_ms"`
	// Last: a reader that does not want it stops before it (it is up to
	// 1.5 MiB, the rest a few KiB).
	Proposal json.RawMessage `json:"proposal"`
}

// Key names a proposal: "<sandbox>/<outbox>/<name>".
func (j *OutboxJournal) Key() string { return j.Sandbox + "/" + j.Outbox + "/" + j.Name }

// Next is the index of the first action not applied, len(Actions) when
// all are.
func (j *OutboxJournal) Next() int {
	for i, a := range j.Actions {
		if a.State != "applied" {
			return i
		}
	}
	return len(j.Actions)
}

// OutboxArgs are the arguments of "outbox-show" (Key) and
// "outbox-resolve" (Key and exactly one of Applied with URL, or Retry).
type OutboxArgs struct {
	Key     string `json:"key"`
	Applied bool   `json:"applied,omitempty"`
	URL     string `json:"url,omitempty"`
	Retry   bool   `json:"retry,omitempty"`
}

// OutboxList is the result of "outbox-ls".
type OutboxList struct {
	Proposals []OutboxJournal `json:"proposals"`      // without their proposal
	More      bool            `json:"more,omitempty"` // some did not fit in the answer
}
