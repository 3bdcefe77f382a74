// Package manifest decodes and validates orchestration manifests, the
// requests a container sends the broker with the `send` op. It is pure:
// bytes in, a typed manifest or a *Refusal out; no I/O, no clock.
//
// API:
//
//	Decode(raw []byte, body *string) (*Manifest, error)
//	    Strict decoding of the envelope and the type's fields, every rule
//	    that needs nothing but the manifest. body is the socket request's
//	    body (nil when absent): the text of prompt_file / body_file.
//	Validate(m *Manifest, from Sender) error
//	    The rules that depend on the caller: child rules, grant operation
//	    per type, the rights rule, runner, autostart profile and services
//	    against the repository config.
//	(*Manifest).Encode() (raw []byte, body *string, err error)
//	    The canonical request: Decode(Encode()) gives the same value.
//	OperationFor(Type) string, (*Spawn).EffectiveOnDone(grant.Grant) string,
//	(*RightsGrant).ExpiresAt(now) (time.Time, bool), NotAvailable(Type)
//
// Every error either function returns for a bad manifest is a *Refusal
// whose Detail is the text for the requester; Validate returns a plain
// error only when the caller's Context is unusable (a programming error).
// Live state (does the child exist and belong to the caller, is a worktree
// clean, is a slot free) is the broker's, not this package's.
//
// Choices where the spec is silent or damaged are listed in
// docs/manifests.md.
package manifest

import (
	"regexp"
	"time"

	"agentbox/internal/grant"
)

// Type is a manifest type.
type Type string

// The manifest types.
const (
	TypeSpawn   Type = "spawn"
	TypeMessage Type = "message"
	TypeImport  Type = "import"
	TypeUpdate  Type = "update"
	TypeRestart Type = "restart"
	TypeRefresh Type = "refresh"
	TypeStop    Type = "stop"
	TypeDestroy Type = "destroy"
	TypeRights  Type = "rights"
	TypePublish Type = "publish"
)

// Types lists every manifest type.
var Types = []Type{TypeSpawn, TypeMessage, TypeImport, TypeUpdate, TypeRestart, TypeRefresh, TypeStop, TypeDestroy, TypeRights, TypePublish}

// OperationFor returns the grant operation type t needs: its own name,
// except update, which the import operation permits.
func OperationFor(t Type) string {
	if t == TypeUpdate {
		return grant.OpImport
	}
	return string(t)
}

// IDPattern is the manifest id rule; host-generated ids (h-<8 hex>) match it
// too.
var IDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// Manifest is one decoded manifest: the envelope and exactly one non-nil
// type pointer, the one Type names.
type Manifest struct {
	Version int
	ID      string
	Type    Type

	Spawn   *Spawn
	Message *Message
	Import  *Import
	Update  *Update
	Restart *Restart
	Refresh *Refresh
	Stop    *Stop
	Destroy *Destroy
	Rights  *Rights
	Publish *Publish
}

// Spawn kinds.
const (
	KindFork = "fork"
	KindNew  = "new"
	KindPR   = "pr"
)

// on_done policies.
const (
	OnDoneDestroy = "destroy"
	OnDoneKeep    = "keep"
)

// Spawn creates a child.
type Spawn struct {
	Kind   string // KindFork, KindNew or KindPR
	Branch string // the child's branch; "" only for kind pr (the PR head names it)
	Base   string // kind new only; "" = the repository's default base
	Ref    string // version 2, kind fork only: refs/... or a 40-hex commit
	PR     int    // version 2, kind pr only: the pull request number
	// WarmPaths (version 2, kind fork only): nil = fork.warm_paths of the
	// repo config, empty = none, else replaces it.
	WarmPaths []string
	// Prompt is the resolved prompt text; PromptFile the prompt_file label
	// when the text came from the request body.
	Prompt     string
	PromptFile string
	Rights     grant.Rights  // the child's rights; lists are nil when empty
	Note       string        // optional
	OnDone     string        // "", OnDoneDestroy or OnDoneKeep; see EffectiveOnDone
	Runner     *grant.Runner // nil = the effective default runner
	// AutostartProfile is "" for the repo's default profile.
	AutostartProfile string
	// Services: nil = the profile's (or all), empty = none, else these
	// (duplicates removed in order; the broker adds dependencies).
	Services []string
}

// EffectiveOnDone resolves an omitted on_done: destroy when the effective
// grant holds the destroy operation, else keep.
func (s *Spawn) EffectiveOnDone(effective grant.Grant) string {
	if s.OnDone != "" {
		return s.OnDone
	}
	if effective.Has(grant.OpDestroy) {
		return OnDoneDestroy
	}
	return OnDoneKeep
}

// Message kinds a manifest may carry. KindIdle is host-only.
const (
	MsgNote     = "note"
	MsgQuestion = "question"
	MsgDone     = "done"
	MsgBlocked  = "blocked"
	MsgIdle     = "idle"
)

// Message sends text to a child (orchestrator) or to the orchestrator
// (child, To empty).
type Message struct {
	To        string  // a child's short name; "" from a child
	Body      string  // resolved text
	BodyFile  string  // the body_file label when Body came from the request body
	Kind      string  // note (when omitted), question, done or blocked
	InReplyTo *string // nil when absent or null
}

// Import fetches a child's committed work.
type Import struct {
	Child string
}

// Update transports a source into a running child.
type Update struct {
	Child string
	Ref   string // optional: refs/... or 40-hex commit; exclusive with Base
	Base  string // optional: a host branch; exclusive with Ref
	Merge bool
}

// RunnerChoice is restart's tri-state runner: absent (Set false) keeps the
// child's runner, null (Set, Runner nil) selects the current effective
// default, an object replaces it.
type RunnerChoice struct {
	Set    bool
	Runner *grant.Runner
}

// Restart starts a stopped child again (or, AgentOnly, replaces a running
// child's agent).
type Restart struct {
	Child      string
	Prompt     string
	PromptFile string
	Runner     RunnerChoice
	// OnDone: "" (absent or null) keeps the child's policy.
	OnDone           string
	AgentOnly        bool
	AutostartProfile string   // "" keeps the child's stored selection
	Services         []string // nil keeps the explicit selection; empty = none
}

// Refresh refreshes services in a child.
type Refresh struct {
	Child    string
	Services []string // 1 to MaxServices, duplicates removed in order
	Force    bool
}

// Stop stops a running child.
type Stop struct {
	Child string
}

// Destroy deletes a child.
type Destroy struct {
	Child string
	Force bool
}

// Rights grants or revokes a child's rights.
type Rights struct {
	Child string // "" = the sender itself (children only)
	// Grant is nil when the grant block is absent or null; GrantNull
	// records an explicit null, which children are refused for.
	Grant     *RightsGrant
	GrantNull bool
	Revoke    *grant.Rights // nil when absent or null
}

// RevokeOnly reports whether the manifest only revokes (no grant block):
// such a manifest needs no rights operation, only an active grant.
func (r *Rights) RevokeOnly() bool { return r.Grant == nil }

// RightsGrant is a rights manifest's grant block.
type RightsGrant struct {
	Items grant.Rights
	// For is the "for" text: a TTL or "never"; "" when missing (refused
	// by Validate, so a child's grant block gets the child refusal).
	For   string
	TTL   time.Duration // parsed For; 0 with Never
	Never bool
}

// ExpiresAt returns when the granted items expire, or ok=false for never.
func (g *RightsGrant) ExpiresAt(now time.Time) (t time.Time, ok bool) {
	if g.Never {
		return time.Time{}, false
	}
	return now.Add(g.TTL), true
}

// Publish outboxes.
const (
	OutboxIssue = "issue"
	OutboxPR    = "pr"
)

// Publish asks the host to publish a staged outbox manifest.
type Publish struct {
	Outbox   string // OutboxIssue or OutboxPR
	Manifest string // file name in the requester's outbox
}
