package grant

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Issue action kinds a grant's publish.issues.actions may name.
const (
	IssueCreate  = "create"
	IssueComment = "comment"
	IssueLabel   = "label"
	IssueClose   = "close"
)

// IssueActions lists every issue action kind, in the order docs show them.
var IssueActions = []string{IssueCreate, IssueComment, IssueLabel, IssueClose}

// MaxPublishRepos bounds publish.issues.repos.
const MaxPublishRepos = 64

// Publish is a grant's publish rights: what the publish operation may do.
// A grant without it may publish nothing, whatever its operations say.
type Publish struct {
	Issues       *IssueRights `json:"issues" yaml:"issues"`
	PullRequests bool         `json:"pull_requests" yaml:"pull_requests"`
	PRReviews    bool         `json:"pr_reviews" yaml:"pr_reviews"`
}

// IssueRights names the repositories issue proposals may target and the
// action kinds they may hold; both must cover a proposal.
type IssueRights struct {
	Repos   []string `json:"repos" yaml:"repos"`
	Actions []string `json:"actions" yaml:"actions"`
}

var repoRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$`)

// ValidRepo reports whether s is a GitHub "owner/name".
func ValidRepo(s string) bool {
	if !repoRE.MatchString(s) {
		return false
	}
	name := s[strings.IndexByte(s, '/')+1:]
	return name != "." && name != ".."
}

// SameRepo compares two "owner/name" as GitHub does: without case.
func SameRepo(a, b string) bool { return strings.EqualFold(a, b) }

// Check validates p's syntax (prefix names the field) and normalizes its
// lists: duplicates removed, null as [].
func (p *Publish) Check(prefix string) error {
	if p.Issues == nil {
		return nil
	}
	is := p.Issues
	if len(is.Repos) > MaxPublishRepos {
		return fmt.Errorf("%s.issues.repos has more than %d items", prefix, MaxPublishRepos)
	}
	for _, r := range is.Repos {
		if !ValidRepo(r) {
			return fmt.Errorf("%s.issues.repos has an invalid repository (want owner/name)", prefix)
		}
	}
	for _, a := range is.Actions {
		if !slices.Contains(IssueActions, a) {
			return fmt.Errorf("%s.issues.actions has an unknown action (want create, comment, label or close)", prefix)
		}
	}
	is.Repos, is.Actions = nonNil(Dedupe(is.Repos)), nonNil(Dedupe(is.Actions))
	return nil
}

// capped narrows p by the repository's cap c (nil caps nothing): issue
// repositories and actions the cap does not list are removed, and pull
// requests and reviews stay only when the cap allows them too.
func (p *Publish) capped(c *Publish) *Publish {
	if p == nil {
		return nil
	}
	out := *p
	if p.Issues != nil {
		is := IssueRights{Repos: slices.Clone(p.Issues.Repos), Actions: slices.Clone(p.Issues.Actions)}
		out.Issues = &is
	}
	if c == nil {
		return &out
	}
	out.PullRequests = p.PullRequests && c.PullRequests
	out.PRReviews = p.PRReviews && c.PRReviews
	if out.Issues != nil && c.Issues == nil {
		out.Issues = nil
	}
	if out.Issues != nil {
		out.Issues.Repos = slices.DeleteFunc(out.Issues.Repos, func(r string) bool {
			return !slices.ContainsFunc(c.Issues.Repos, func(cr string) bool { return SameRepo(cr, r) })
		})
		out.Issues.Actions = slices.DeleteFunc(out.Issues.Actions, func(a string) bool { return !slices.Contains(c.Issues.Actions, a) })
	}
	return &out
}

// Publish refusal details (meant for the requester).
const (
	DetailNoPublishRights = "this container's grant holds no publish rights"
	DetailNoPullRequests  = "publish rights do not include pull_requests"
	DetailNoPRReviews     = "publish rights do not include pr_reviews"
)

// CheckIssues checks an issue proposal against the effective grant: the
// publish operation, the repository and every action kind must be granted.
func CheckIssues(eff Grant, repo string, kinds []string) error {
	if !eff.Has(OpPublish) || eff.Publish == nil || eff.Publish.Issues == nil {
		return fmt.Errorf("%s for issues", DetailNoPublishRights)
	}
	is := eff.Publish.Issues
	if !slices.ContainsFunc(is.Repos, func(r string) bool { return SameRepo(r, repo) }) {
		return fmt.Errorf("repository `%s` is not in this container's publish rights", repo)
	}
	for _, k := range kinds {
		if !slices.Contains(is.Actions, k) {
			return fmt.Errorf("issue action `%s` is not in this container's publish rights", k)
		}
	}
	return nil
}

// CheckPullRequests checks that the effective grant may publish a pull
// request's source (review false) or a review (review true).
func CheckPullRequests(eff Grant, review bool) error {
	if !eff.Has(OpPublish) || eff.Publish == nil {
		return fmt.Errorf("%s for pull requests", DetailNoPublishRights)
	}
	if review && !eff.Publish.PRReviews {
		return fmt.Errorf("%s", DetailNoPRReviews)
	}
	if !review && !eff.Publish.PullRequests {
		return fmt.Errorf("%s", DetailNoPullRequests)
	}
	return nil
}
