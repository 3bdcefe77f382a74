// Package forge is the one way agentbox talks to GitHub: the REST API
// calls that publish an orchestrator's outbox, with the host's token.
// Sandboxes never see the token; what they stage is validated by the
// caller and again here (sizes, names) before anything is sent.
//
// Every failure is an *Error that says whether its outcome is certain (the
// forge refused before any change) or not (the action may have been
// applied: a timeout, a connection lost after the request was sent, a 5xx,
// an answer that could not be read). Its text never holds the token nor
// the forge's raw answer.
package forge

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Repo is a GitHub repository: owner/name.
type Repo struct{ Owner, Name string }

// String is "owner/name".
func (r Repo) String() string { return r.Owner + "/" + r.Name }

// Issue is a created issue.
type Issue struct {
	Number int
	URL    string // the issue's html_url
}

// PR is a pull request as the forge reports it.
type PR struct {
	Number   int
	URL      string // the pull request's html_url
	State    string // "open" or "closed"
	HeadRef  string // the head branch
	HeadRepo string // "owner/name" of the head branch's repository ("" when it was deleted)
	BaseRef  string // the base branch
	// HeadDefault is the default branch of the head branch's repository
	// ("" when the answer did not say).
	HeadDefault string
}

// Review events CreateReview accepts.
const (
	ReviewComment        = "COMMENT"
	ReviewApprove        = "APPROVE"
	ReviewRequestChanges = "REQUEST_CHANGES"
)

// Forge is the subset of GitHub's REST API publish uses. Every error is an
// *Error.
type Forge interface {
	// CreateIssue opens an issue with labels (none: nil).
	CreateIssue(ctx context.Context, r Repo, title, body string, labels []string) (Issue, error)
	// Comment adds a comment to the issue or pull request number and
	// returns the comment's URL.
	Comment(ctx context.Context, r Repo, number int, body string) (url string, err error)
	// AddLabels adds labels to the issue or pull request number.
	AddLabels(ctx context.Context, r Repo, number int, labels []string) error
	// CloseIssue closes the issue number and returns its URL.
	CloseIssue(ctx context.Context, r Repo, number int) (url string, err error)
	// IsPullRequest reads the issue number and reports whether it is a
	// pull request (which the issue calls above act on too). A read
	// changes nothing: every failure is certain.
	IsPullRequest(ctx context.Context, r Repo, number int) (bool, error)
	// PullRequest reads the pull request number.
	PullRequest(ctx context.Context, r Repo, number int) (PR, error)
	// CreatePullRequest opens a pull request from the branch head of r
	// into base.
	CreatePullRequest(ctx context.Context, r Repo, head, base, title, body string, draft bool) (PR, error)
	// CreateReview submits a review (event: ReviewComment, ReviewApprove
	// or ReviewRequestChanges) of the pull request number and returns its
	// URL.
	CreateReview(ctx context.Context, r Repo, number int, event, body string) (url string, err error)
}

// Error is a failed forge call.
type Error struct {
	// Op is the call: "create issue", "comment", ...
	Op string
	// Status is the HTTP status of the forge's answer; 0 when there was
	// none (or the call was refused before it was sent).
	Status int
	// Certain is true when the action was certainly not applied: the
	// forge refused it (4xx), or it was never sent. False: it may have
	// been applied (timeout, connection lost after sending, 5xx, an
	// answer that could not be read).
	Certain bool
	// Msg is safe to show: ours, or the forge's message field bounded to
	// MaxMessageBytes, control characters and the token removed.
	Msg string
}

func (e *Error) Error() string {
	s := "forge: " + e.Op
	if e.Status != 0 {
		s += fmt.Sprintf(": HTTP %d", e.Status)
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if !e.Certain {
		s += " (outcome uncertain: it may have been applied)"
	}
	return s
}

// Uncertain reports whether err leaves open that the action was applied:
// true for an *Error that is not Certain and for any other error (fail
// closed); false for nil.
func Uncertain(err error) bool {
	if err == nil {
		return false
	}
	var fe *Error
	return !errors.As(err, &fe) || !fe.Certain
}

// ErrNoToken is returned by New and FromConfig when broker.yaml names no
// forge token.
var ErrNoToken = errors.New("no forge token is configured (broker.yaml forge.token_file or forge.token_env)")

// ownerPattern is a GitHub account name: letters, digits and single
// hyphens, not at either end.
var ownerPattern = regexp.MustCompile(`^[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*$`)

// namePattern is a GitHub repository name's charset.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// GitHub's bounds on account and repository names.
const (
	maxOwnerBytes = 39
	maxNameBytes  = 100
)

// ErrInvalidRepo is ParseRepo's error.
var ErrInvalidRepo = errors.New("invalid repository: want owner/name (GitHub's letters, digits, '-'; a name also '.' and '_')")

// ParseRepo parses "owner/name" strictly: GitHub's charsets and lengths,
// no ".", ".." or ".git" suffix as a name, nothing else around.
func ParseRepo(s string) (Repo, error) {
	owner, name, ok := strings.Cut(s, "/")
	r := Repo{Owner: owner, Name: name}
	if !ok || r.check() != nil {
		return Repo{}, ErrInvalidRepo
	}
	return r, nil
}

// check validates r as ParseRepo does.
func (r Repo) check() error {
	switch {
	case len(r.Owner) > maxOwnerBytes || !ownerPattern.MatchString(r.Owner),
		len(r.Name) > maxNameBytes || !namePattern.MatchString(r.Name),
		r.Name == "." || r.Name == "..", strings.HasSuffix(strings.ToLower(r.Name), ".git"):
		return ErrInvalidRepo
	}
	return nil
}
