package forge

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/go-github/v74/github"
)

// CreateIssue is POST /repos/{owner}/{repo}/issues.
func (g *GitHub) CreateIssue(ctx context.Context, r Repo, title, body string, labels []string) (Issue, error) {
	const op = "create issue"
	if err := checkAll(r.checkIn(op), checkTitle(op, title), checkBody(op, body, false), checkLabels(op, labels, false)); err != nil {
		return Issue{}, err
	}
	req := &github.IssueRequest{Title: &title, Body: &body}
	if len(labels) > 0 {
		req.Labels = &labels
	}
	var out *github.Issue
	err := g.call(ctx, op, func(ctx context.Context) (resp *github.Response, err error) {
		out, resp, err = g.client.Issues.Create(ctx, r.Owner, r.Name, req)
		return resp, err
	})
	if err != nil {
		return Issue{}, err
	}
	if out.GetNumber() <= 0 {
		return Issue{}, unreadable(op)
	}
	return Issue{Number: out.GetNumber(), URL: answerURL(out.GetHTMLURL())}, nil
}

// Comment is POST /repos/{owner}/{repo}/issues/{number}/comments.
func (g *GitHub) Comment(ctx context.Context, r Repo, number int, body string) (string, error) {
	const op = "comment"
	if err := checkAll(r.checkIn(op), checkNumber(op, number), checkBody(op, body, true)); err != nil {
		return "", err
	}
	var out *github.IssueComment
	err := g.call(ctx, op, func(ctx context.Context) (resp *github.Response, err error) {
		out, resp, err = g.client.Issues.CreateComment(ctx, r.Owner, r.Name, number, &github.IssueComment{Body: &body})
		return resp, err
	})
	if err != nil {
		return "", err
	}
	return answerURL(out.GetHTMLURL()), nil
}

// AddLabels is POST /repos/{owner}/{repo}/issues/{number}/labels.
func (g *GitHub) AddLabels(ctx context.Context, r Repo, number int, labels []string) error {
	const op = "add labels"
	if err := checkAll(r.checkIn(op), checkNumber(op, number), checkLabels(op, labels, true)); err != nil {
		return err
	}
	return g.call(ctx, op, func(ctx context.Context) (*github.Response, error) {
		_, resp, err := g.client.Issues.AddLabelsToIssue(ctx, r.Owner, r.Name, number, labels)
		return resp, err
	})
}

// CloseIssue is PATCH /repos/{owner}/{repo}/issues/{number} with
// state "closed".
func (g *GitHub) CloseIssue(ctx context.Context, r Repo, number int) (string, error) {
	const op = "close issue"
	if err := checkAll(r.checkIn(op), checkNumber(op, number)); err != nil {
		return "", err
	}
	closed := "closed"
	var out *github.Issue
	err := g.call(ctx, op, func(ctx context.Context) (resp *github.Response, err error) {
		out, resp, err = g.client.Issues.Edit(ctx, r.Owner, r.Name, number, &github.IssueRequest{State: &closed})
		return resp, err
	})
	if err != nil {
		return "", err
	}
	return answerURL(out.GetHTMLURL()), nil
}

// IsPullRequest is GET /repos/{owner}/{repo}/issues/{number}: a pull
// request's answer has a pull_request object.
func (g *GitHub) IsPullRequest(ctx context.Context, r Repo, number int) (bool, error) {
	const op = "read issue"
	if err := checkAll(r.checkIn(op), checkNumber(op, number)); err != nil {
		return false, err
	}
	var out *github.Issue
	err := g.call(ctx, op, func(ctx context.Context) (resp *github.Response, err error) {
		out, resp, err = g.client.Issues.Get(ctx, r.Owner, r.Name, number)
		return resp, err
	})
	if fe := (*Error)(nil); errors.As(err, &fe) {
		fe.Certain = true // a read: nothing was applied
		return false, fe
	}
	if err != nil {
		return false, err
	}
	if out.GetNumber() != number {
		return false, &Error{Op: op, Certain: true, Msg: "the answer could not be read"}
	}
	return out.IsPullRequest(), nil
}

// PullRequest is GET /repos/{owner}/{repo}/pulls/{number}.
func (g *GitHub) PullRequest(ctx context.Context, r Repo, number int) (PR, error) {
	const op = "read pull request"
	if err := checkAll(r.checkIn(op), checkNumber(op, number)); err != nil {
		return PR{}, err
	}
	var out *github.PullRequest
	err := g.call(ctx, op, func(ctx context.Context) (resp *github.Response, err error) {
		out, resp, err = g.client.PullRequests.Get(ctx, r.Owner, r.Name, number)
		return resp, err
	})
	if err != nil {
		return PR{}, err
	}
	return prOf(op, out)
}

// CreatePullRequest is POST /repos/{owner}/{repo}/pulls.
func (g *GitHub) CreatePullRequest(ctx context.Context, r Repo, head, base, title, body string, draft bool) (PR, error) {
	const op = "create pull request"
	if err := checkAll(r.checkIn(op), checkBranch(op, "head", head), checkBranch(op, "base", base),
		checkTitle(op, title), checkBody(op, body, false)); err != nil {
		return PR{}, err
	}
	req := &github.NewPullRequest{Title: &title, Head: &head, Base: &base, Body: &body, Draft: &draft}
	var out *github.PullRequest
	err := g.call(ctx, op, func(ctx context.Context) (resp *github.Response, err error) {
		out, resp, err = g.client.PullRequests.Create(ctx, r.Owner, r.Name, req)
		return resp, err
	})
	if err != nil {
		return PR{}, err
	}
	return prOf(op, out)
}

// CreateReview is POST /repos/{owner}/{repo}/pulls/{number}/reviews.
func (g *GitHub) CreateReview(ctx context.Context, r Repo, number int, event, body string) (string, error) {
	const op = "create review"
	if event != ReviewComment && event != ReviewApprove && event != ReviewRequestChanges {
		return "", refused(op, "the review event must be %s, %s or %s", ReviewComment, ReviewApprove, ReviewRequestChanges)
	}
	// GitHub requires a body for COMMENT and REQUEST_CHANGES.
	if err := checkAll(r.checkIn(op), checkNumber(op, number), checkBody(op, body, event != ReviewApprove)); err != nil {
		return "", err
	}
	req := &github.PullRequestReviewRequest{Event: &event}
	if body != "" {
		req.Body = &body
	}
	var out *github.PullRequestReview
	err := g.call(ctx, op, func(ctx context.Context) (resp *github.Response, err error) {
		out, resp, err = g.client.PullRequests.CreateReview(ctx, r.Owner, r.Name, number, req)
		return resp, err
	})
	if err != nil {
		return "", err
	}
	return answerURL(out.GetHTMLURL()), nil
}

// prOf is the PR of a pull request the forge answered with; one without a
// number is an answer that could not be read.
// Its branch names and head repository must be plain: a rework pushes to
// the head branch, and publish quotes them in what the host's terminal
// shows.
func prOf(op string, p *github.PullRequest) (PR, error) {
	if p.GetNumber() <= 0 {
		return PR{}, unreadable(op)
	}
	for _, ref := range []string{p.GetHead().GetRef(), p.GetBase().GetRef(), p.GetHead().GetRepo().GetDefaultBranch()} {
		if ref != "" && !plainBranch(ref) {
			return PR{}, unreadable(op)
		}
	}
	if name := p.GetHead().GetRepo().GetFullName(); name != "" {
		if _, err := ParseRepo(name); err != nil {
			return PR{}, unreadable(op)
		}
	}
	return PR{
		Number:   p.GetNumber(),
		URL:      answerURL(p.GetHTMLURL()),
		State:    p.GetState(),
		HeadRef:  p.GetHead().GetRef(),
		HeadRepo: p.GetHead().GetRepo().GetFullName(),
		BaseRef:  p.GetBase().GetRef(),

		HeadDefault: p.GetHead().GetRepo().GetDefaultBranch(),
	}, nil
}

// answerURL is an answer's html_url when it is a plain http(s) URL of
// visible ASCII (GitHub's are), without credentials, at most MaxURLBytes;
// else "": the forge's answer is journaled, sent to the orchestrator and
// printed on the host's terminal, and a URL with terminal controls or of
// any size must not be. The action itself was applied: only its URL is
// not kept.
func answerURL(s string) string {
	if s == "" || len(s) > MaxURLBytes || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return ""
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return ""
	}
	return s
}

// unreadable is a 2xx answer without what it should hold: the action may
// have been applied.
func unreadable(op string) *Error {
	return &Error{Op: op, Msg: "the answer could not be read"}
}

// checkAll returns the first non-nil error.
func checkAll(errs ...*Error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func (r Repo) checkIn(op string) *Error {
	if r.check() != nil {
		return refused(op, "%v", ErrInvalidRepo)
	}
	return nil
}

func checkNumber(op string, n int) *Error {
	if n <= 0 {
		return refused(op, "the issue or pull request number must be positive")
	}
	return nil
}

func checkTitle(op, title string) *Error {
	if strings.TrimSpace(title) == "" || !utf8.ValidString(title) || utf8.RuneCountInString(title) > MaxTitleRunes {
		return refused(op, "the title must be 1 to %d characters of UTF-8", MaxTitleRunes)
	}
	return nil
}

func checkBody(op, body string, required bool) *Error {
	if required && strings.TrimSpace(body) == "" {
		return refused(op, "the body must not be empty")
	}
	if !utf8.ValidString(body) || utf8.RuneCountInString(body) > MaxBodyRunes {
		return refused(op, "the body must be at most %d characters of UTF-8", MaxBodyRunes)
	}
	return nil
}

func checkLabels(op string, labels []string, required bool) *Error {
	if required && len(labels) == 0 || len(labels) > MaxLabels {
		return refused(op, "give 1 to %d labels", MaxLabels)
	}
	for _, l := range labels {
		if strings.TrimSpace(l) == "" || !utf8.ValidString(l) || utf8.RuneCountInString(l) > MaxLabelRunes ||
			strings.ContainsFunc(l, isControl) {
			return refused(op, "a label must be 1 to %d characters, no control character", MaxLabelRunes)
		}
	}
	return nil
}

// checkBranch accepts a branch name of the repository itself (no
// "owner:" prefix: pull requests are never opened from another fork).
func checkBranch(op, what, name string) *Error {
	if name == "" || len(name) > MaxRefBytes || strings.HasPrefix(name, "-") || strings.HasPrefix(name, "refs/") ||
		strings.ContainsAny(name, ": ~^?*[\\") || strings.ContainsFunc(name, isControl) || !utf8.ValidString(name) {
		return refused(op, "the %s branch must be a branch name of the repository (at most %d bytes)", what, MaxRefBytes)
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// plainBranch reports whether a branch name the forge answered is one
// checkBranch accepts and a terminal shows as it is (no C1 control, no
// format character such as a bidi override).
func plainBranch(name string) bool {
	return checkBranch("", "", name) == nil &&
		!strings.ContainsFunc(name, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) })
}
