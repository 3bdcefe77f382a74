package grant

import (
	"strings"
	"testing"
)

const publishBase = `{"version": 1, "max_running_children": 1, "operations": ["publish"], "grantable": {}`

func mustParse(t *testing.T, doc string) Grant {
	t.Helper()
	g, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse(%s): %v", doc, err)
	}
	return g
}

func TestParsePublish(t *testing.T) {
	g := mustParse(t, publishBase+`, "publish": {"issues": {"repos": ["o/r", "o/r"], "actions": ["close", "create", "close"]}, "pull_requests": true}}`)
	p := g.Publish
	if p == nil || p.Issues == nil || len(p.Issues.Repos) != 1 || strings.Join(p.Issues.Actions, ",") != "close,create" || !p.PullRequests || p.PRReviews {
		t.Fatalf("got %+v %+v", p, p.Issues)
	}
	if g := mustParse(t, publishBase+`, "publish": null}`); g.Publish != nil {
		t.Fatal("null publish should be absent")
	}
}

func TestParsePublishRefusals(t *testing.T) {
	for doc, want := range map[string]string{
		`"publish": {"issues": {"repos": ["o/r"], "actions": ["delete"]}}`: "grant: publish.issues.actions has an unknown action (want create, comment, label or close)",
		`"publish": {"issues": {"repos": ["../x"], "actions": []}}`:        "grant: publish.issues.repos has an invalid repository (want owner/name)",
		`"publish": {"issues": {"repos": ["o/.."], "actions": []}}`:        "grant: publish.issues.repos has an invalid repository (want owner/name)",
		`"publish": {"pull_requests": true, "merge": true}`:                `grant: publish: unknown field "merge"`,
		`"publish": {"issues": {"repos": [], "labels": []}}`:               `grant: publish: unknown field "labels"`,
		`"publish": {"pull_requests": true, "pull_requests": false}`:       `grant: duplicate key "pull_requests"`,
		`"publish": {"pr_reviews": "yes"}`:                                 "grant: publish: pr_reviews must be true or false",
	} {
		_, err := Parse([]byte(publishBase + ", " + doc + "}"))
		if err == nil || err.Error() != want {
			t.Errorf("%s:\n got %v\nwant %s", doc, err, want)
		}
	}
}

func TestPublishPolicy(t *testing.T) {
	full := publishBase + `, "publish": {"issues": {"repos": ["Owner/Repo"], "actions": ["create", "comment"]}, "pull_requests": true}}`
	noOp := strings.Replace(full, `["publish"]`, `[]`, 1)
	for _, c := range []struct {
		name, doc string
		cap       Cap
		check     func(Grant) error
		want      string
	}{
		{"issues granted", full, Cap{}, func(g Grant) error { return CheckIssues(g, "owner/repo", []string{"create", "comment"}) }, ""},
		{"other repo", full, Cap{}, func(g Grant) error { return CheckIssues(g, "owner/other", []string{"create"}) }, "repository `owner/other` is not in this container's publish rights"},
		{"action not granted", full, Cap{}, func(g Grant) error { return CheckIssues(g, "Owner/Repo", []string{"create", "close"}) }, "issue action `close` is not in this container's publish rights"},
		{"no publish field", publishBase + "}", Cap{}, func(g Grant) error { return CheckIssues(g, "o/r", []string{"create"}) }, DetailNoPublishRights + " for issues"},
		{"no publish operation", noOp, Cap{}, func(g Grant) error { return CheckIssues(g, "Owner/Repo", []string{"create"}) }, DetailNoPublishRights + " for issues"},
		{"pr source", full, Cap{}, func(g Grant) error { return CheckPullRequests(g, false) }, ""},
		{"review not granted", full, Cap{}, func(g Grant) error { return CheckPullRequests(g, true) }, DetailNoPRReviews},
		{"pr source without field", publishBase + "}", Cap{}, func(g Grant) error { return CheckPullRequests(g, false) }, DetailNoPublishRights + " for pull requests"},
		{"cap removes action", full, Cap{Publish: &Publish{Issues: &IssueRights{Repos: []string{"owner/repo"}, Actions: []string{"comment"}}, PullRequests: true}},
			func(g Grant) error { return CheckIssues(g, "Owner/Repo", []string{"create"}) }, "issue action `create` is not in this container's publish rights"},
		{"cap keeps repo without case", full, Cap{Publish: &Publish{Issues: &IssueRights{Repos: []string{"owner/repo"}, Actions: []string{"create"}}}},
			func(g Grant) error { return CheckIssues(g, "Owner/Repo", []string{"create"}) }, ""},
		{"cap removes pull requests", full, Cap{Publish: &Publish{}}, func(g Grant) error { return CheckPullRequests(g, false) }, DetailNoPullRequests},
		{"cap without issues removes them", full, Cap{Publish: &Publish{PullRequests: true}}, func(g Grant) error { return CheckIssues(g, "Owner/Repo", []string{"create"}) }, DetailNoPublishRights + " for issues"},
		{"cap never widens", publishBase + "}", Cap{Publish: &Publish{PullRequests: true}}, func(g Grant) error { return CheckPullRequests(g, false) }, DetailNoPublishRights + " for pull requests"},
		{"cap operations removes publish", full, Cap{Operations: []string{"spawn"}}, func(g Grant) error { return CheckPullRequests(g, false) }, DetailNoPublishRights + " for pull requests"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := mustParse(t, c.doc)
			eff := g.Capped(c.cap)
			err := c.check(eff)
			if got := errText(err); got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
			if again := c.check(eff.Capped(c.cap)); errText(again) != c.want {
				t.Fatalf("capping twice changed the outcome: %v", again)
			}
		})
	}
}

func TestCappedDoesNotAliasPublish(t *testing.T) {
	g := mustParse(t, publishBase+`, "publish": {"issues": {"repos": ["o/r", "o/s"], "actions": ["create"]}}}`)
	g.Capped(Cap{Publish: &Publish{Issues: &IssueRights{Repos: []string{"o/s"}, Actions: []string{"create"}}}})
	if len(g.Publish.Issues.Repos) != 2 {
		t.Fatalf("Capped changed the stored grant: %v", g.Publish.Issues.Repos)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
