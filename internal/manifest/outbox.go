package manifest

import (
	"encoding/json"
	"strings"
	"unicode"
	"unicode/utf8"

	"agentbox/internal/grant"
	"agentbox/internal/shortname"
)

// Outbox bounds (the host notes' caps).
const (
	// MaxOutboxBytes bounds one outbox manifest file.
	MaxOutboxBytes = 256 << 10
	// MaxCanonicalBytes bounds the canonical form (Encode) of a manifest
	// decoded from a file within MaxOutboxBytes, as a journal keeps it:
	// json.Marshal writes each '<', '>' and '&' of a text as six bytes
	// (\u003c), and nothing longer, so it can be six times the file.
	MaxCanonicalBytes = 6 * MaxOutboxBytes
	// MaxOutboxBody bounds each body in an outbox manifest.
	MaxOutboxBody = 64 << 10
	// MaxOutboxActions bounds the actions of one issue proposal.
	MaxOutboxActions = 50
	// MaxOutboxPending bounds the pending manifests of one container.
	MaxOutboxPending = 20
	// MaxTitleBytes bounds an issue's or pull request's title.
	MaxTitleBytes = 256
	// MaxLabels bounds the labels of one action; MaxLabelBytes one label
	// (GitHub's limit is 50 characters).
	MaxLabels     = 20
	MaxLabelBytes = 50
	// MaxIssue is the largest issue or pull request number.
	MaxIssue = MaxPR
)

// IssueProposal is an issue-outbox manifest: actions on one repository's
// issues, applied in order.
type IssueProposal struct {
	Repo    string
	Actions []IssueAction
}

// IssueAction is one action of a proposal. Kind is a grant.Issue* kind;
// Issue is 0 for create, else the issue's number.
type IssueAction struct {
	Kind   string   `json:"kind"`
	Issue  int      `json:"issue,omitempty"`
	Title  string   `json:"title,omitempty"`
	Body   string   `json:"body,omitempty"`
	Labels []string `json:"labels,omitempty"`
}

// Kinds returns the proposal's action kinds, each once.
func (p *IssueProposal) Kinds() []string {
	var out []string
	for _, a := range p.Actions {
		out = append(out, a.Kind)
	}
	return grant.Dedupe(out)
}

// PR-outbox manifest kinds.
const (
	PRSourceKind = "source"
	PRReviewKind = "review"
)

// PRManifest is a pr-outbox manifest: a pull request's source (Source) or
// a review (Review), exactly one set.
type PRManifest struct {
	Source *PRSource
	Review *PRReview
}

// PRSource publishes a child's imported work: the commit SourceSHA that
// the orchestrator's ref Source (an import, refs/jailbee/from/CHILD/BRANCH)
// points at is pushed to the child's branch, and a pull request from it
// into Base opened; or, with PR set (a rework), pushed to that pull
// request's branch, which then shows it.
type PRSource struct {
	Repo, Source, SourceSHA string
	PR                      int // a rework of this pull request; 0 opens one
	Base, Title, Body       string
	Draft                   bool
}

// ImportRefPrefix is where an import puts a child's branch in its
// orchestrator's repository (the imported_ref of a done report).
const ImportRefPrefix = "refs/jailbee/from/"

// Import is the child and branch Source names.
func (s *PRSource) Import() (child, branch string) {
	child, branch, _ = strings.Cut(strings.TrimPrefix(s.Source, ImportRefPrefix), "/")
	return child, branch
}

// Review events.
const (
	EventComment        = "COMMENT"
	EventApprove        = "APPROVE"
	EventRequestChanges = "REQUEST_CHANGES"
)

// PRReview reviews pull request PR of Repo.
type PRReview struct {
	Repo  string
	PR    int
	Event string
	Body  string
}

// DecodeIssueProposal decodes an issue-outbox manifest strictly: unknown
// and duplicate keys refused, every bound checked. Refusals are *Refusal.
func DecodeIssueProposal(raw []byte) (*IssueProposal, error) {
	return decodeIssueProposal(raw, MaxOutboxBytes)
}

// DecodeCanonicalIssueProposal decodes what Encode wrote (a journal's
// copy) as DecodeIssueProposal does, within MaxCanonicalBytes.
func DecodeCanonicalIssueProposal(raw []byte) (*IssueProposal, error) {
	return decodeIssueProposal(raw, MaxCanonicalBytes)
}

func decodeIssueProposal(raw []byte, limit int) (*IssueProposal, error) {
	o, err := outboxObject(raw, limit)
	if err != nil {
		return nil, err
	}
	if err := o.allow("version", "repo", "actions"); err != nil {
		return nil, err
	}
	var p IssueProposal
	if p.Repo, err = repoField(o); err != nil {
		return nil, err
	}
	items, err := o.list("actions")
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, refuse("`actions` must list 1 to %d actions", MaxOutboxActions)
	}
	if len(items) > MaxOutboxActions {
		return nil, refuse("`actions` has more than %d actions", MaxOutboxActions)
	}
	for _, raw := range items {
		a, err := issueAction(raw)
		if err != nil {
			return nil, err
		}
		p.Actions = append(p.Actions, a)
	}
	return &p, nil
}

func issueAction(raw json.RawMessage) (IssueAction, error) {
	var a IssueAction
	o, err := parseObject(raw, "actions[]")
	if err == errNotObject {
		return a, refuse("`actions` must list objects")
	}
	if err != nil {
		return a, err
	}
	if a.Kind, err = o.reqStr("kind"); err != nil {
		return a, err
	}
	keys := map[string][]string{
		grant.IssueCreate:  {"title", "body", "labels"},
		grant.IssueComment: {"issue", "body"},
		grant.IssueLabel:   {"issue", "labels"},
		grant.IssueClose:   {"issue"},
	}[a.Kind]
	if keys == nil {
		return a, refuse("`actions[].kind` must be create, comment, label or close")
	}
	if err := o.allow(append(keys, "kind")...); err != nil {
		return a, err
	}
	for _, k := range keys {
		switch k {
		case "issue":
			a.Issue, err = number(o, "issue")
		case "title":
			a.Title, err = title(o)
		case "body":
			a.Body, err = outboxBody(o, a.Kind == grant.IssueComment)
		case "labels":
			a.Labels, err = labels(o, a.Kind == grant.IssueLabel)
		}
		if err != nil {
			return a, err
		}
	}
	return a, nil
}

// DecodePRManifest decodes a pr-outbox manifest strictly: a source or a
// review, told apart by `kind`.
func DecodePRManifest(raw []byte) (*PRManifest, error) {
	return decodePRManifest(raw, MaxOutboxBytes)
}

// DecodeCanonicalPRManifest decodes what Encode wrote (a journal's copy)
// as DecodePRManifest does, within MaxCanonicalBytes.
func DecodeCanonicalPRManifest(raw []byte) (*PRManifest, error) {
	return decodePRManifest(raw, MaxCanonicalBytes)
}

func decodePRManifest(raw []byte, limit int) (*PRManifest, error) {
	o, err := outboxObject(raw, limit)
	if err != nil {
		return nil, err
	}
	kind, err := o.reqStr("kind")
	if err != nil {
		return nil, err
	}
	switch kind {
	case PRSourceKind:
		s, err := prSource(o)
		return &PRManifest{Source: s}, err
	case PRReviewKind:
		r, err := prReview(o)
		return &PRManifest{Review: r}, err
	}
	return nil, refuse("`kind` must be source or review")
}

func prSource(o *object) (*PRSource, error) {
	if err := o.allow("version", "kind", "repo", "source", "source_sha", "pr", "base", "title", "body", "draft"); err != nil {
		return nil, err
	}
	var s PRSource
	var err error
	if s.Repo, err = repoField(o); err != nil {
		return nil, err
	}
	if s.Source, err = o.reqStr("source"); err != nil {
		return nil, err
	}
	child, branch := s.Import()
	if !strings.HasPrefix(s.Source, ImportRefPrefix) || len(s.Source) > MaxRefLen || !shortname.Valid(child) ||
		branchName("source", branch) != nil {
		return nil, refuse("`source` must be the imported_ref of a child's done report (%sCHILD/BRANCH)", ImportRefPrefix)
	}
	if s.SourceSHA, err = o.reqStr("source_sha"); err != nil {
		return nil, err
	}
	if !commitRE.MatchString(s.SourceSHA) {
		return nil, refuse("`source_sha` must be the imported_sha of that report (40 hex digits)")
	}
	if o.present("pr") {
		// A rework: the pull request exists, with its base, title and body.
		for _, k := range []string{"base", "title", "body", "draft"} {
			if o.has(k) {
				return nil, refuse("`%s` cannot be combined with `pr` (a rework pushes to the pull request as it is)", k)
			}
		}
		s.PR, err = number(o, "pr")
		return &s, err
	}
	if s.Base, err = branchField(o, "base"); err != nil {
		return nil, err
	}
	if s.Title, err = title(o); err != nil {
		return nil, err
	}
	if s.Body, err = outboxBody(o, false); err != nil {
		return nil, err
	}
	if s.Draft, err = o.boolean("draft"); err != nil {
		return nil, err
	}
	return &s, nil
}

func prReview(o *object) (*PRReview, error) {
	if err := o.allow("version", "kind", "repo", "pr", "event", "body"); err != nil {
		return nil, err
	}
	var r PRReview
	var err error
	if r.Repo, err = repoField(o); err != nil {
		return nil, err
	}
	if r.PR, err = number(o, "pr"); err != nil {
		return nil, err
	}
	if r.Event, err = o.reqStr("event"); err != nil {
		return nil, err
	}
	if r.Event != EventComment && r.Event != EventApprove && r.Event != EventRequestChanges {
		return nil, refuse("`event` must be COMMENT, APPROVE or REQUEST_CHANGES")
	}
	// GitHub refuses an empty body for COMMENT and REQUEST_CHANGES.
	if r.Body, err = outboxBody(o, r.Event != EventApprove); err != nil {
		return nil, err
	}
	return &r, nil
}

// outboxObject checks an outbox manifest's size (at most limit) and
// envelope (version 1).
func outboxObject(raw []byte, limit int) (*object, error) {
	if len(raw) > limit {
		return nil, refuse("outbox manifest exceeds %d bytes", limit)
	}
	if !utf8.Valid(raw) {
		return nil, refuse("outbox manifest is not valid UTF-8")
	}
	o, err := parseObject(raw, "")
	if err == errNotObject {
		return nil, refuse("outbox manifest must be a JSON object")
	}
	if err != nil {
		return nil, err
	}
	if v, ok, bad := o.integer("version", 1); !ok || bad || v != 1 {
		return nil, refuse("`version` must be 1")
	}
	return o, nil
}

func repoField(o *object) (string, error) {
	r, err := o.reqStr("repo")
	if err != nil {
		return "", err
	}
	if !grant.ValidRepo(r) {
		return "", refuse("`repo` must be owner/name")
	}
	return r, nil
}

func branchField(o *object, key string) (string, error) {
	b, err := o.reqStr(key)
	if err != nil {
		return "", err
	}
	return b, branchName(key, b)
}

// number reads a required issue or pull request number.
func number(o *object, key string) (int, error) {
	n, ok, bad := o.integer(key, MaxIssue)
	if !ok || bad || n < 1 {
		return 0, refuse("`%s` must be a positive integer", o.name(key))
	}
	return int(n), nil
}

// unsafeInLine is what a one-line text a person reads elsewhere (a
// title or label on the forge, a file name) may not hold: a control
// character, or a bidi control (U+202E and the like), which makes the
// text read in another order than it is. Other format characters stay
// (U+200D joins emoji).
func unsafeInLine(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }

func title(o *object) (string, error) {
	t, err := o.reqStr("title")
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(t) == "" || len(t) > MaxTitleBytes || strings.ContainsFunc(t, unsafeInLine) {
		return "", refuse("`%s` must be 1 to %d bytes on one line, without bidi controls", o.name("title"), MaxTitleBytes)
	}
	return t, nil
}

func outboxBody(o *object, required bool) (string, error) {
	b, ok, err := o.str("body")
	if err != nil {
		return "", err
	}
	if len(b) > MaxOutboxBody {
		return "", refuse("`%s` exceeds %d bytes", o.name("body"), MaxOutboxBody)
	}
	if required && (!ok || strings.TrimSpace(b) == "") {
		return "", refuse("`%s` is required", o.name("body"))
	}
	return b, nil
}

func labels(o *object, required bool) ([]string, error) {
	list, err := o.strList("labels")
	if err != nil {
		return nil, err
	}
	if required && len(list) == 0 {
		return nil, refuse("`%s` must list 1 to %d labels", o.name("labels"), MaxLabels)
	}
	if len(list) > MaxLabels {
		return nil, refuse("`%s` has more than %d labels", o.name("labels"), MaxLabels)
	}
	for _, l := range list {
		if strings.TrimSpace(l) == "" || len(l) > MaxLabelBytes || strings.ContainsFunc(l, unsafeInLine) {
			return nil, refuse("`%s` has a label that is empty, longer than %d bytes or holds a control character or bidi control", o.name("labels"), MaxLabelBytes)
		}
	}
	return grant.Dedupe(list), nil
}

// Encode writes p back as an issue-outbox manifest
// DecodeCanonicalIssueProposal accepts (the journal keeps this canonical
// form; its escapes may take it past MaxOutboxBytes).
func (p *IssueProposal) Encode() []byte {
	raw, _ := json.Marshal(map[string]any{"version": 1, "repo": p.Repo, "actions": p.Actions})
	return raw
}

// Encode writes m back as a pr-outbox manifest DecodeCanonicalPRManifest
// accepts.
func (m *PRManifest) Encode() []byte {
	doc := map[string]any{"version": 1}
	if s := m.Source; s != nil {
		doc["kind"], doc["repo"], doc["source"], doc["source_sha"] = PRSourceKind, s.Repo, s.Source, s.SourceSHA
		if s.PR != 0 {
			doc["pr"] = s.PR
		} else {
			doc["base"], doc["title"], doc["body"], doc["draft"] = s.Base, s.Title, s.Body, s.Draft
		}
	}
	if r := m.Review; r != nil {
		doc["kind"], doc["repo"], doc["pr"], doc["event"], doc["body"] = PRReviewKind, r.Repo, r.PR, r.Event, r.Body
	}
	raw, _ := json.Marshal(doc)
	return raw
}
