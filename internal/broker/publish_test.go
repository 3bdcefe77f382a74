package broker_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox/internal/broker"
	"agentbox/internal/config"
	"agentbox/internal/crashpoint"
	"agentbox/internal/forge"
	"agentbox/internal/forge/githubtest"
	"agentbox/internal/inbox"
	"agentbox/internal/manifest"
	"agentbox/internal/orchestrate"
	"agentbox/internal/pubjournal"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// testToken is the forge token of the publish tests: it must never reach
// a sandbox.
const testToken = "ghp_publishTestToken0123456789"

// publishGrant grants publish on owner/repo: every issue action but
// those in without, pull requests and reviews.
func publishGrant(without ...string) json.RawMessage {
	var actions []string
	for _, a := range []string{"create", "comment", "label", "close"} {
		if !strings.Contains(strings.Join(without, ","), a) {
			actions = append(actions, a)
		}
	}
	doc, _ := json.Marshal(map[string]any{"version": 1, "max_running_children": 2,
		"operations": []string{"spawn", "message", "publish"}, "grantable": map[string]any{},
		"publish": map[string]any{"issues": map[string]any{"repos": []string{"owner/repo"}, "actions": actions},
			"pull_requests": true, "pr_reviews": true}})
	return doc
}

// newPublishEnv is a broker whose forge is a githubtest server, with an
// orchestrator "lead" holding grant.
func newPublishEnv(t *testing.T, perHour int, grant json.RawMessage) (*testEnv, *githubtest.Server, *inbox.Client) {
	return newPublishEnvWith(t, perHour, grant, nil)
}

// newPublishEnvWith is newPublishEnv with prepare run on the env before
// its broker starts.
func newPublishEnvWith(t *testing.T, perHour int, grant json.RawMessage, prepare func(*testEnv)) (*testEnv, *githubtest.Server, *inbox.Client) {
	gh := githubtest.Start(t, testToken)
	f, err := forge.New(forge.Config{APIURL: gh.URL, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	e := newTestEnvStopped(t)
	e.publish = &orchestrate.Publishing{Forge: f, ActionsPerHour: perHour}
	if prepare != nil {
		prepare(e)
	}
	e.start()
	if err := e.admin("new", wire.NewArgs{Name: "lead", Repo: e.repo, Role: "orchestrator", Grant: grant}, nil); err != nil {
		t.Fatal(err)
	}
	return e, gh, e.client("lead")
}

// stage writes content to ~/.jailbee/<outbox>-outbox/name in sandbox sb,
// as its agent would.
func (e *testEnv) stage(sb, outbox, name, content string) {
	e.t.Helper()
	dir := "~/.jailbee/" + outbox + "-outbox"
	res, err := e.execIn(sb, content, "sh", "-c", "mkdir -p "+dir+" && cat > "+dir+"/"+name)
	if err != nil || res.exit != 0 {
		e.t.Fatalf("stage %s: %v %+v", name, err, res)
	}
}

func publish(t testing.TB, c *inbox.Client, id, outbox, name string) wire.StatusItem {
	t.Helper()
	return sendManifest(t, c, map[string]any{"id": id, "type": "publish", "outbox": outbox, "manifest": name})
}

// proposal is an issue proposal on repo of the actions given as JSON.
func proposal(repo string, actions ...string) string {
	return fmt.Sprintf(`{"version": 1, "repo": %q, "actions": [%s]}`, repo, strings.Join(actions, ","))
}

// TestPublishIssueProposal: an orchestrator with publish rights stages a
// proposal of every action kind; the broker reads it from the outbox
// inside the sandbox, answers started, and the worker applies each action
// through the forge with the host's token and reports done with the URLs
// and issue numbers. The token is in no status and no broker log line.
func TestPublishIssueProposal(t *testing.T) {
	e, gh, lead := newPublishEnv(t, 30, publishGrant())
	e.stage("lead", "issue", "all.json", proposal("owner/repo",
		`{"kind": "create", "title": "Parser drops tabs", "body": "Seen in CI.", "labels": ["bug"]}`,
		`{"kind": "comment", "issue": 1, "body": "Fixed on fix/tabs."}`,
		`{"kind": "label", "issue": 1, "labels": ["fixed"]}`,
		`{"kind": "close", "issue": 1}`))

	wantStatus(t, publish(t, lead, "pub-1", "issue", "all.json"), "started", "publishing issue/all.json: 4 action(s)")
	done := statusOf(t, lead, "pub-1", "done", "failed")
	issueURL := gh.URL + "owner/repo/issues/1"
	want := fmt.Sprintf("published issue/all.json: create #1 %s; comment #1 %s#issuecomment-", issueURL, issueURL)
	if done.State != "done" || !strings.HasPrefix(done.Detail, want) || !strings.HasSuffix(done.Detail, "; label #1; close #1 "+issueURL) {
		t.Fatalf("final status %s %q", done.State, done.Detail)
	}
	var paths []string
	for _, c := range gh.Calls() {
		if !c.Authorized {
			t.Errorf("call %s %s without the token", c.Method, c.Path)
		}
		paths = append(paths, c.Method+" "+c.Path)
	}
	// Each action on an existing number reads it first: a pull request is
	// not acted on (TestPublishIssueActionsNotOnPullRequests).
	if got := strings.Join(paths, ", "); got != "POST /repos/owner/repo/issues, GET /repos/owner/repo/issues/1, POST /repos/owner/repo/issues/1/comments, "+
		"GET /repos/owner/repo/issues/1, POST /repos/owner/repo/issues/1/labels, GET /repos/owner/repo/issues/1, PATCH /repos/owner/repo/issues/1" {
		t.Fatalf("calls: %s", got)
	}
	is, _ := gh.Issue("owner/repo", 1)
	if is.State != "closed" || strings.Join(is.Labels, ",") != "bug,fixed" || len(is.Comments) != 1 {
		t.Fatalf("issue on the forge: %+v", is)
	}

	// Published once: the same name again is refused, and nothing is sent.
	wantStatus(t, publish(t, lead, "pub-2", "issue", "all.json"), "refused",
		"`issue/all.json` was published already: stage a new manifest under a new name")
	if n := len(gh.Calls()); n != 7 {
		t.Fatalf("%d calls after a refused publish", n)
	}

	var list wire.OutboxList
	if err := e.admin("outbox-ls", nil, &list); err != nil || len(list.Proposals) != 1 || list.Proposals[0].State != "done" {
		t.Fatalf("outbox-ls: %v %+v", err, list)
	}
	wantWireError(t, "resolve with a bad URL", e.admin("outbox-resolve", wire.OutboxArgs{Key: "lead/issue/all.json", Applied: true, URL: "javascript:alert(1)"}, nil),
		wire.CodeBadRequest, "--applied needs --url: the http(s) URL of what was applied, at most 2048 bytes")
	wantWireError(t, "resolve of a done proposal", e.admin("outbox-resolve", wire.OutboxArgs{Key: "lead/issue/all.json", Retry: true}, nil),
		wire.CodeBadRequest, "`lead/issue/all.json` has no uncertain action (it is done)")
	wantWireError(t, "show of a path", e.admin("outbox-show", wire.OutboxArgs{Key: "../../etc"}, nil),
		wire.CodeBadRequest, "no proposal `../../etc` (want SANDBOX/OUTBOX/NAME, as `jailbee outbox ls` shows it)")
	if strings.Contains(done.Detail, testToken) || strings.Contains(e.logs.String(), testToken) {
		t.Fatal("the token leaked into a status or the broker log")
	}
}

// TestPublishRefusals: what the decoder, the outbox reader and the policy
// refuse, before anything reaches the forge.
func TestPublishRefusals(t *testing.T) {
	e, gh, lead := newPublishEnv(t, 30, publishGrant("close"))
	e.child("kid", "lead")
	e.stage("lead", "issue", "ok.json", proposal("owner/repo", `{"kind": "create", "title": "t"}`))
	e.stage("lead", "issue", "close.json", proposal("owner/repo", `{"kind": "close", "issue": 3}`))
	e.stage("lead", "issue", "other.json", proposal("owner/other", `{"kind": "create", "title": "t"}`))
	e.stage("lead", "issue", "bad.json", `{"version": 1, "repo": "owner/repo", "actions": [{"kind": "create", "title": "t", "force": true}]}`)
	e.mustExec("lead", "sh", "-c", "ln -s ok.json ~/.jailbee/issue-outbox/link.json")
	e.stage("lead", "issue", "big.json", proposal("owner/repo", `{"kind": "create", "title": "t", "body": "`+strings.Repeat("x", manifest.MaxOutboxBytes)+`"}`))
	e.stage("kid", "issue", "ok.json", proposal("owner/repo", `{"kind": "create", "title": "t"}`))

	const where = "in your issue outbox (~/.jailbee/issue-outbox)"
	for _, c := range []struct{ name, state, detail string }{
		{"a/b.json", "refused", "`manifest` must be a file name matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\\.json$, never a path or .progress.json"},
		{"x.progress.json", "refused", "`manifest` must be a file name matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\\.json$, never a path or .progress.json"},
		{"link.json", "refused", "`link.json` " + where + " is not a regular file (symlinks are refused)"},
		{"none.json", "refused", "`none.json` " + where + " does not exist"},
		{"big.json", "refused", "`big.json` " + where + " exceeds 262144 bytes"},
		{"bad.json", "refused", "`bad.json`: unknown key `actions[].force`"},
		{"close.json", "refused", "issue action `close` is not in this container's publish rights"},
		{"other.json", "refused", "repository `owner/other` is not in this container's publish rights"},
	} {
		wantStatus(t, publish(t, lead, "p-"+strings.NewReplacer("/", "-", ".", "-").Replace(c.name), "issue", c.name), c.state, c.detail)
	}
	wantStatus(t, publish(t, e.client("kid"), "p-kid", "issue", "ok.json"), "refused", manifest.DetailChildTypes)
	if n := len(gh.Calls()); n != 0 {
		t.Fatalf("%d forge calls after refusals", n)
	}
}

// TestPublishBudget: each action reserves the sliding hour's budget up
// front; a policy refusal gives it back, a forge failure after the
// reservation does not.
func TestPublishBudget(t *testing.T) {
	e, gh, lead := newPublishEnv(t, 5, publishGrant("close"))
	create := `{"kind": "create", "title": "t"}`
	e.stage("lead", "issue", "five-refused.json", proposal("owner/repo", create, create, create, create, `{"kind": "close", "issue": 1}`))
	e.stage("lead", "issue", "four.json", proposal("owner/repo", create, create, create, create))
	e.stage("lead", "issue", "fails.json", proposal("owner/repo", `{"kind": "comment", "issue": 1, "body": "x"}`))
	e.stage("lead", "issue", "one.json", proposal("owner/repo", create))

	wantStatus(t, publish(t, lead, "b-1", "issue", "five-refused.json"), "refused", "issue action `close` is not in this container's publish rights")
	wantStatus(t, publish(t, lead, "b-2", "issue", "four.json"), "started", "publishing issue/four.json: 4 action(s)")
	if st := statusOf(t, lead, "b-2", "done", "failed"); st.State != "done" {
		t.Fatalf("four.json: %+v", st)
	}
	gh.Inject(githubtest.Fault{Method: "POST", Kind: githubtest.Refuse, Status: 422, Body: `{"message": "Validation Failed"}`})
	wantStatus(t, publish(t, lead, "b-3", "issue", "fails.json"), "started", "publishing issue/fails.json: 1 action(s)")
	failed := statusOf(t, lead, "b-3", "done", "failed")
	if failed.State != "failed" || !strings.HasPrefix(failed.Detail, "issue/fails.json: action 1 (comment) failed: forge: comment: HTTP 422") {
		t.Fatalf("fails.json: %+v", failed)
	}
	st := publish(t, lead, "b-4", "issue", "one.json")
	if st.State != "refused" || !strings.HasPrefix(st.Detail, "publish budget exhausted: 5 of 5 actions used in the last hour, 1 more wanted") {
		t.Fatalf("past the budget: %+v", st)
	}
}

// TestPublishJournalsAtTheirBound: an orchestrator keeps at most
// pubjournal.MaxJournals publish journals. With that many, none finished
// (blocked, waiting for a person), a new proposal is refused and its
// budget given back; once one is finished, the new proposal is published
// and the oldest finished journal removed to make room.
func TestPublishJournalsAtTheirBound(t *testing.T) {
	var jd *pubjournal.Dir
	put := func(name, state string) {
		t.Helper()
		err := jd.Update("lead", "issue", name, func(*pubjournal.Journal) (*pubjournal.Journal, error) {
			return &pubjournal.Journal{Sandbox: "lead", Outbox: "issue", Name: name, Ref: "old", State: state,
				Proposal: []byte(`{}`), Actions: []pubjournal.Action{{Kind: "create", State: pubjournal.Uncertain}}}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	name := func(i int) string { return fmt.Sprintf("old-%04d.json", i) }
	e, gh, lead := newPublishEnvWith(t, 1, publishGrant(), func(e *testEnv) {
		var err error
		if jd, err = pubjournal.Open(filepath.Join(e.state, broker.PublishDir)); err != nil {
			t.Fatal(err)
		}
		for i := range pubjournal.MaxJournals {
			put(name(i), pubjournal.Blocked)
		}
	})
	e.stage("lead", "issue", "new.json", proposal("owner/repo", `{"kind": "create", "title": "t"}`))
	wantStatus(t, publish(t, lead, "j-1", "issue", "new.json"), "refused", orchestrate.DetailTooManyJournals)
	if len(gh.Calls()) != 0 {
		t.Fatalf("calls reached the forge: %+v", gh.Calls())
	}

	put(name(7), pubjournal.Done) // resolved by a person, say
	// The budget of one action was given back: this takes it.
	wantStatus(t, publish(t, lead, "j-2", "issue", "new.json"), "started", "publishing issue/new.json: 1 action(s)")
	if st := statusOf(t, lead, "j-2", "done", "failed"); st.State != "done" {
		t.Fatalf("new.json: %+v", st)
	}
	dir := filepath.Join(e.state, broker.PublishDir, "lead", "issue")
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != pubjournal.MaxJournals {
		t.Fatalf("%d journals (%v), want %d", len(entries), err, pubjournal.MaxJournals)
	}
	if _, err := os.Stat(filepath.Join(dir, name(7))); !os.IsNotExist(err) {
		t.Fatalf("the finished journal was kept: %v", err)
	}
}

// TestPublishPendingCap: 20 pending manifests in the outboxes are
// accepted, a 21st refuses publishing; published ones do not count.
func TestPublishPendingCap(t *testing.T) {
	e, _, lead := newPublishEnv(t, 30, publishGrant())
	stageN := func(from, to int) {
		e.mustExec("lead", "sh", "-c", fmt.Sprintf(`mkdir -p ~/.jailbee/issue-outbox ~/.jailbee/pr-outbox && for i in $(seq %d %d); do
			echo '{"version":1,"repo":"owner/repo","actions":[{"kind":"create","title":"t"}]}' > ~/.jailbee/issue-outbox/p$i.json; done`, from, to))
	}
	stageN(1, manifest.MaxOutboxPending)
	wantStatus(t, publish(t, lead, "c-1", "issue", "p1.json"), "started", "publishing issue/p1.json: 1 action(s)")
	if st := statusOf(t, lead, "c-1", "done", "failed"); st.State != "done" {
		t.Fatalf("p1: %+v", st)
	}
	stageN(manifest.MaxOutboxPending+1, manifest.MaxOutboxPending+1) // 20 pending again: p1 is published
	wantStatus(t, publish(t, lead, "c-2", "issue", "p2.json"), "started", "publishing issue/p2.json: 1 action(s)")
	statusOf(t, lead, "c-2", "done", "failed")
	stageN(manifest.MaxOutboxPending+2, manifest.MaxOutboxPending+3) // 21 pending
	wantStatus(t, publish(t, lead, "c-3", "issue", "p3.json"), "refused",
		"your outboxes hold more than 20 pending manifests: remove the published or abandoned ones")
}

// newPublishCrashEnv is a broker process (dying at point) whose
// broker.yaml names the githubtest forge and a token file, with an
// orchestrator "lead" holding publish rights.
func newPublishCrashEnv(t *testing.T, point string) (*crashEnv, *githubtest.Server) {
	gh := githubtest.Start(t, testToken)
	c := &crashEnv{t: t, bin: testbin.Jailbee(t), state: shortTempDir(t), repo: makeRepo(t)}
	if err := os.MkdirAll(c.state, 0o700); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(c.state, "forge-token")
	cfg := fmt.Sprintf("forge:\n  api_url: %q\n  token_file: %q\n", gh.URL, tokenFile)
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.state, "broker.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.p = startProcBrokerVia(t, c.bin, c.state, []string{"env", crashpoint.EnvVar + "=" + point})
	c.p.newSandbox(wire.NewArgs{Name: "lead", Repo: c.repo, Role: "orchestrator", Grant: publishGrant()})
	return c, gh
}

// TestPublishCrashAfterTheForgeCall: the broker dies (kill -9) after an
// action's forge call and before its journal says so. The next broker
// reports the publish failed with the action uncertain and publishes
// nothing more: a person resolves it as applied (with the URL found on
// the forge), the proposal continues; its next action is uncertain too (a
// 502 after the change), and resolved with --retry it is sent once more
// and the proposal is done.
func TestPublishCrashAfterTheForgeCall(t *testing.T) {
	c, gh := newPublishCrashEnv(t, crashpoint.PublishCalled)
	c.exec("lead", "sh", "-c", `mkdir -p ~/.jailbee/issue-outbox && echo '`+proposal("owner/repo",
		`{"kind": "create", "title": "Crash"}`, `{"kind": "comment", "issue": 1, "body": "after"}`)+`' > ~/.jailbee/issue-outbox/crash.json`)
	var st wire.StatusItem
	c.p.client("lead").Call(context.Background(), "send", map[string]any{"manifest": map[string]any{
		"version": 1, "id": "pub-1", "type": "publish", "outbox": "issue", "manifest": "crash.json"}}, &st) // may die first
	c.died()
	lead := c.p.client("lead")
	const key = "lead/issue/crash.json"
	failed := statusOf(t, lead, "pub-1", "failed")
	wantStatus(t, failed, "failed", "issue/crash.json: action 1 (create) failed: the broker stopped while publishing after sending it (outcome uncertain: it may have been applied); nothing more is done until a person resolves it (jailbee outbox resolve "+key+")")
	if is, ok := gh.Issue("owner/repo", 1); !ok || is.Title != "Crash" {
		t.Fatalf("the forge call before the crash: %+v", is)
	}

	var j wire.OutboxJournal
	if err := c.p.adminCall("outbox-show", wire.OutboxArgs{Key: key}, &j); err != nil || j.State != "blocked" || j.Actions[0].State != "uncertain" || j.Actions[1].State != "" {
		t.Fatalf("journal after the crash: %v %+v", err, j)
	}
	// Blocked: publishing it again is refused.
	wantStatus(t, publish(t, lead, "pub-2", "issue", "crash.json"), "refused",
		"`issue/crash.json` has an action whose outcome is uncertain: it waits for a person (jailbee outbox resolve "+key+")")

	gh.Inject(githubtest.Fault{Method: "POST", Path: "/repos/owner/repo/issues/1/comments", Kind: githubtest.ApplyThenStatus, Status: 502, Body: `{"message": "Bad Gateway"}`})
	issueURL := gh.URL + "owner/repo/issues/1"
	if err := c.p.adminCall("outbox-resolve", wire.OutboxArgs{Key: key, Applied: true, URL: issueURL}, &j); err != nil {
		t.Fatal(err)
	}
	again := statusOf(t, lead, "pub-1", "failed")
	if !strings.HasPrefix(again.Detail, "issue/crash.json: action 2 (comment) failed: forge: comment: HTTP 502") || !strings.Contains(again.Detail, "outcome uncertain") {
		t.Fatalf("after resolve --applied: %+v", again)
	}
	if err := c.p.adminCall("outbox-resolve", wire.OutboxArgs{Key: key, Retry: true}, &j); err != nil {
		t.Fatal(err)
	}
	done := statusOf(t, lead, "pub-1", "done")
	if !strings.HasPrefix(done.Detail, "published issue/crash.json: create #1 "+issueURL+"; comment #1 "+issueURL+"#issuecomment-") {
		t.Fatalf("after resolve --retry: %+v", done)
	}
	if is, _ := gh.Issue("owner/repo", 1); len(is.Comments) != 2 || len(gh.Calls()) != 5 { // each comment after a read of issue 1
		t.Fatalf("the retry sent the comment once more: %d comments, calls %+v", len(is.Comments), gh.Calls())
	}
	if strings.Contains(c.p.stderr.String(), testToken) {
		t.Fatal("the token is in the broker's log")
	}
}

// TestPublishCrashLeavesAJournalWriteCut: the broker dies (kill -9) during
// a publish, and the journal write it was making is cut short: its
// temporary file (".NAME.tmp-N", as secfs.WriteFileAtomic names it) is
// left beside the journal. The next broker still recovers the running
// proposal (blocked, the publish failed) and lists it: the leftover is no
// journal.
func TestPublishCrashLeavesAJournalWriteCut(t *testing.T) {
	c, _ := newPublishCrashEnv(t, crashpoint.PublishCalled)
	c.exec("lead", "sh", "-c", `mkdir -p ~/.jailbee/issue-outbox && echo '`+proposal("owner/repo",
		`{"kind": "create", "title": "Crash"}`)+`' > ~/.jailbee/issue-outbox/cut.json`)
	var st wire.StatusItem
	c.p.client("lead").Call(context.Background(), "send", map[string]any{"manifest": map[string]any{
		"version": 1, "id": "pub-1", "type": "publish", "outbox": "issue", "manifest": "cut.json"}}, &st) // may die first
	select {
	case <-c.p.exited:
	case <-time.After(wait.Guard + 2*time.Minute):
		t.Fatalf("the broker did not die at its crash point:\n%s", c.p.stderr)
	}
	dir := filepath.Join(c.state, "publish", "lead", "issue")
	if err := os.WriteFile(filepath.Join(dir, ".cut.json.tmp-2718281828"), []byte(`{"version":1,"sandbox":"le`), 0o600); err != nil {
		t.Fatal(err)
	}
	c.p = startProcBroker(t, c.bin, c.state)
	const key = "lead/issue/cut.json"
	wantStatus(t, statusOf(t, c.p.client("lead"), "pub-1", "failed"), "failed", "issue/cut.json: action 1 (create) failed: the broker stopped while publishing after sending it (outcome uncertain: it may have been applied); nothing more is done until a person resolves it (jailbee outbox resolve "+key+")")
	var list wire.OutboxList
	if err := c.p.adminCall("outbox-ls", nil, &list); err != nil || len(list.Proposals) != 1 || list.Proposals[0].Key() != key || list.Proposals[0].State != "blocked" {
		t.Fatalf("outbox-ls after the cut write: %v %+v", err, list)
	}
}

// withOrigin gives the env's host repository an origin remote, a bare
// repository at the git URL broker.yaml's forge.git_url would name for
// owner/repo (a file:// template here), with main pushed to it.
func withOrigin(origin *string) func(*testEnv) {
	return func(e *testEnv) {
		root := e.t.TempDir()
		e.publish.GitURL = "file://" + root + "/{owner}/{name}.git"
		*origin = filepath.Join(root, "owner", "repo.git")
		hostGit(e.t, "", "init", "-q", "--bare", *origin)
		hostGit(e.t, e.repo, "remote", "add", "origin", "file://"+*origin)
		hostGit(e.t, e.repo, "push", "-q", "origin", "main")
	}
}

// TestPublishPullRequestSource: a source names a child's import as its
// done report carried it (imported_ref and imported_sha); the commit is
// brought from the orchestrator's repository to the host, pushed from
// there to the child's branch of the orchestrator's own repository as a
// fast-forward, and its pull request opened. A ref the orchestrator wrote
// itself under refs/jailbee/from/, another commit than the import's,
// another repository and a push that is not a fast-forward (never
// forced) are refused.
func TestPublishPullRequestSource(t *testing.T) {
	var origin string
	e, gh, lead := newPublishEnvWith(t, 30, publishGrant(), withOrigin(&origin))
	e.child("kid", "lead")
	head, st := e.reportDone("kid", "d-kid")
	wantStatus(t, st, "done", "delivered to lead: imported as refs/jailbee/from/kid/work/kid at "+head[:12]+"; this child is kept")
	done := messageFrom(t, lead, "kid", "done")
	if done.ImportedRef != "refs/jailbee/from/kid/work/kid" || done.ImportedSHA != head {
		t.Fatalf("kid's done report: %+v", done)
	}
	source := func(repo, ref, sha string) string {
		return fmt.Sprintf(`{"version": 1, "kind": "source", "repo": %q, "source": %q, "source_sha": %q, "base": "main", "title": "Kid's work", "body": "Done.", "draft": true}`, repo, ref, sha)
	}
	e.stage("lead", "pr", "src.json", source("owner/repo", done.ImportedRef, head))
	wantStatus(t, publish(t, lead, "s-1", "pr", "src.json"), "started", "publishing pr/src.json: 1 action(s)")
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "published pr/src.json: source #1 "+gh.URL+"owner/repo/pull/1")
	if got := hostGit(t, origin, "rev-parse", "refs/heads/work/kid"); got != head {
		t.Fatalf("origin's work/kid = %s, want the child's HEAD %s", got, head)
	}
	if pr, ok := gh.PullRequest("owner/repo", 1); !ok || pr.Head != "work/kid" || pr.Base != "main" || !pr.Draft {
		t.Fatalf("pull request on the forge: %+v", pr)
	}

	// lead writes its own ref under refs/jailbee/from/, aimed at main.
	leadHead := e.mustExec("lead", "git", "rev-parse", "HEAD")
	e.mustExec("lead", "git", "update-ref", "refs/jailbee/from/kid/main", leadHead)
	e.stage("lead", "pr", "forged.json", source("owner/repo", "refs/jailbee/from/kid/main", leadHead))
	wantStatus(t, publish(t, lead, "s-2", "pr", "forged.json"), "refused",
		"source `refs/jailbee/from/kid/main` at "+leadHead+" is not a child's import: name the imported_ref and imported_sha of a done report in your inbox")
	e.stage("lead", "pr", "other-sha.json", source("owner/repo", done.ImportedRef, leadHead))
	wantStatus(t, publish(t, lead, "s-3", "pr", "other-sha.json"), "refused",
		"source `refs/jailbee/from/kid/work/kid` at "+leadHead+" is not a child's import: name the imported_ref and imported_sha of a done report in your inbox")
	e.stage("lead", "pr", "other.json", source("owner/other", done.ImportedRef, head))
	wantStatus(t, publish(t, lead, "s-4", "pr", "other.json"), "refused", "repository `owner/other` is not this orchestrator's repository (the host repository's origin remote)")

	// Someone else moved origin's branch: the push is not a fast-forward
	// and is refused, never forced.
	hostGit(t, e.repo, "commit", "-q", "--allow-empty", "-m", "elsewhere")
	hostGit(t, e.repo, "push", "-q", "--force", "origin", "HEAD:refs/heads/work/kid")
	moved := hostGit(t, origin, "rev-parse", "refs/heads/work/kid")
	e.stage("lead", "pr", "src-2.json", source("owner/repo", done.ImportedRef, head))
	wantStatus(t, publish(t, lead, "s-5", "pr", "src-2.json"), "started", "publishing pr/src-2.json: 1 action(s)")
	failed := statusOf(t, lead, "s-5", "done", "failed")
	if failed.State != "failed" || !strings.Contains(failed.Detail, "branch work/kid exists on the remote and is not where this orchestrator published it") {
		t.Fatalf("the diverged push: %+v", failed)
	}
	if got := hostGit(t, origin, "rev-parse", "refs/heads/work/kid"); got != moved {
		t.Fatal("origin's branch was overwritten")
	}
}

// TestPublishReview: a review of the pull request a child was spawned
// from (kind pr) is submitted, and a rework of it pushed to its branch;
// the same for another pull request is refused.
func TestPublishReview(t *testing.T) {
	var origin string
	e, gh, lead := newPublishEnvWith(t, 30, publishGrant(), func(e *testEnv) {
		e.withAgent()
		withOrigin(&origin)(e)
	})
	// Pull request 7's branch, contrib, is one commit behind its head.
	hostGit(t, e.repo, "commit", "-q", "--allow-empty", "-m", "contribution")
	hostGit(t, e.repo, "push", "-q", "origin", "HEAD:refs/pull/7/head", "HEAD~1:refs/heads/contrib")
	gh.AddPullRequest("owner/repo", githubtest.PR{Number: 7, Title: "contribution", Head: "contrib", Base: "main", State: "open"})
	spawn(t, lead, "s-pr", map[string]any{"version": 2, "kind": "pr", "pr": 7, "prompt": "review it", "on_done": "keep"})
	imported := messageFrom(t, lead, "pr-7", "done")
	review := func(pr int) string {
		return fmt.Sprintf(`{"version": 1, "kind": "review", "repo": "owner/repo", "pr": %d, "event": "REQUEST_CHANGES", "body": "Add a test."}`, pr)
	}
	e.stage("lead", "pr", "review-7.json", review(7))
	e.stage("lead", "pr", "review-8.json", review(8))
	wantStatus(t, publish(t, lead, "r-1", "pr", "review-7.json"), "started", "publishing pr/review-7.json: 1 action(s)")
	done := statusOf(t, lead, "r-1", "done", "failed")
	if done.State != "done" || !strings.HasPrefix(done.Detail, "published pr/review-7.json: review #7 "+gh.URL+"owner/repo/pull/7#pullrequestreview-") {
		t.Fatalf("review: %+v", done)
	}
	if pr, _ := gh.PullRequest("owner/repo", 7); len(pr.Reviews) != 1 {
		t.Fatalf("reviews on the forge: %+v", pr.Reviews)
	}
	wantStatus(t, publish(t, lead, "r-2", "pr", "review-8.json"), "refused",
		"pull request 8 is not bound to this orchestrator: only pull requests a child was spawned from (kind pr)")

	// A rework: the PR child's import goes to pull request 7's own
	// branch, as a fast-forward; no new pull request is opened.
	rework := func(pr int) string {
		return fmt.Sprintf(`{"version": 1, "kind": "source", "repo": "owner/repo", "source": %q, "source_sha": %q, "pr": %d}`, imported.ImportedRef, imported.ImportedSHA, pr)
	}
	e.stage("lead", "pr", "rework-7.json", rework(7))
	e.stage("lead", "pr", "rework-8.json", rework(8))
	wantStatus(t, publish(t, lead, "w-1", "pr", "rework-7.json"), "started", "publishing pr/rework-7.json: 1 action(s)")
	wantStatus(t, statusOf(t, lead, "w-1", "done", "failed"), "done", "published pr/rework-7.json: source #7 "+gh.URL+"owner/repo/pull/7")
	if got := hostGit(t, origin, "rev-parse", "refs/heads/contrib"); got != imported.ImportedSHA {
		t.Fatalf("origin's contrib = %s, want the import %s", got, imported.ImportedSHA)
	}
	if _, ok := gh.PullRequest("owner/repo", 8); ok {
		t.Fatal("a rework opened a pull request")
	}
	wantStatus(t, publish(t, lead, "w-2", "pr", "rework-8.json"), "refused",
		"pull request 8 is not bound to this orchestrator: only pull requests a child was spawned from (kind pr)")
}

// TestPublishSourceNotOverAnotherBranch: the orchestrator names its
// children's branches, so a child on branch main (or any branch the
// remote already has) would have its import pushed over the remote's own
// main as a fast-forward: a change landed without a pull request. A new
// pull request's branch must be new on the remote, or where this
// orchestrator's publish of that child's branch last moved it; a branch
// that was already at the commit does not count as moved.
func TestPublishSourceNotOverAnotherBranch(t *testing.T) {
	var origin string
	e, _, lead := newPublishEnvWith(t, 30, publishGrant(), func(e *testEnv) {
		e.withAgent()
		withOrigin(&origin)(e)
	})
	mainBefore := hostGit(t, origin, "rev-parse", "refs/heads/main")
	source := func(m wire.MessageItem) string {
		return fmt.Sprintf(`{"version": 1, "kind": "source", "repo": "owner/repo", "source": %q, "source_sha": %q, "base": "dev", "title": "t"}`,
			m.ImportedRef, m.ImportedSHA)
	}
	const refused = "failed: forge: push: branch main exists on the remote and is not where this orchestrator published it: a new pull request needs a new branch; publish it again with a new id to continue with the actions not applied"
	mainUnmoved := func(what string) {
		t.Helper()
		if got := hostGit(t, origin, "rev-parse", "refs/heads/main"); got != mainBefore {
			t.Fatalf("%s: origin's main moved to the child's commit %s (was %s)", what, got, mainBefore)
		}
	}

	// One on main that first publishes main as it is (nothing moves, and
	// that is not recorded as its push), then its own commit over it.
	if err := e.admin("new", wire.NewArgs{Name: "trunk", Repo: e.repo, Branch: "main", Role: "child", Parent: "lead"}, nil); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, sendManifest(t, e.client("trunk"), map[string]any{"id": "d-1", "type": "message", "kind": "done", "body": "nothing"}), "done",
		"delivered to lead: imported as refs/jailbee/from/trunk/main at "+mainBefore[:12]+"; this child is kept")
	e.stage("lead", "pr", "same.json", source(messageFrom(t, lead, "trunk", "done")))
	publish(t, lead, "p-2", "pr", "same.json")
	if st := statusOf(t, lead, "p-2", "done", "failed"); st.State != "done" {
		t.Fatalf("publishing main as it is: %+v", st)
	}
	e.reportDone("trunk", "d-2")
	e.stage("lead", "pr", "over.json", source(messageFrom(t, lead, "trunk", "done")))
	publish(t, lead, "p-3", "pr", "over.json")
	wantStatus(t, statusOf(t, lead, "p-3", "done", "failed"), "failed", "pr/over.json: action 1 (source) "+refused)
	mainUnmoved("after main as it is")
	if err := e.admin("destroy", wire.DestroyArgs{Name: "trunk", Force: true}, nil); err != nil {
		t.Fatal(err)
	}

	// A child the orchestrator spawned on branch main.
	wantStatus(t, spawn(t, lead, "s-main", map[string]any{"branch": "main", "prompt": "sneak", "on_done": "keep"}),
		"started", "creation of child `main` started")
	done := messageFrom(t, lead, "main", "done")
	if done.ImportedRef != "refs/jailbee/from/main/main" {
		t.Fatalf("done report: %+v", done)
	}
	e.stage("lead", "pr", "sneak.json", source(done))
	wantStatus(t, publish(t, lead, "p-1", "pr", "sneak.json"), "started", "publishing pr/sneak.json: 1 action(s)")
	failed := statusOf(t, lead, "p-1", "done", "failed")
	mainUnmoved("a child on main")
	wantStatus(t, failed, "failed", "pr/sneak.json: action 1 (source) "+refused)

	// Its own new branch, published and then moved on by the same child.
	e.child("kid", "lead")
	e.reportDone("kid", "d-3")
	e.stage("lead", "pr", "kid-1.json", source(messageFrom(t, lead, "kid", "done")))
	publish(t, lead, "p-4", "pr", "kid-1.json")
	if st := statusOf(t, lead, "p-4", "done", "failed"); st.State != "done" {
		t.Fatalf("a new branch: %+v", st)
	}
	e.mustExec("kid", "sh", "-c", commitCmd+" --allow-empty -m more")
	head := e.mustExec("kid", "git", "rev-parse", "HEAD")
	sendManifest(t, e.client("kid"), map[string]any{"id": "d-4", "type": "message", "kind": "done", "body": "more"})
	e.stage("lead", "pr", "kid-2.json", source(messageFrom(t, lead, "kid", "done")))
	publish(t, lead, "p-5", "pr", "kid-2.json")
	statusOf(t, lead, "p-5", "done", "failed") // the pull request exists already: the forge may refuse a second
	if got := hostGit(t, origin, "rev-parse", "refs/heads/work/kid"); got != head {
		t.Fatalf("origin's work/kid = %s, want the child's new commit %s", got, head)
	}
}

// TestPublishJournalOfEscapedText: the journal keeps the proposal
// re-encoded, where each '<' of a body takes six bytes (\u003c). An
// outbox file within its bound full of them must still make a journal
// the broker reads back: else the worker stops without a final status,
// and a restarted broker's recovery (and `jailbee outbox ls`) fail for
// every sandbox, not just this one.
func TestPublishJournalOfEscapedText(t *testing.T) {
	e, _, lead := newPublishEnv(t, 30, publishGrant())
	body := strings.Repeat("<", manifest.MaxOutboxBody-1024)
	var actions []string
	for range 4 {
		actions = append(actions, `{"kind": "comment", "issue": 1, "body": "`+body+`"}`)
	}
	file := proposal("owner/repo", actions...)
	if len(file) > manifest.MaxOutboxBytes {
		t.Fatalf("the proposal is %d bytes, past the outbox's bound", len(file))
	}
	e.stage("lead", "issue", "create.json", proposal("owner/repo", `{"kind": "create", "title": "t"}`))
	wantStatus(t, publish(t, lead, "p-0", "issue", "create.json"), "started", "publishing issue/create.json: 1 action(s)")
	statusOf(t, lead, "p-0", "done")
	e.stage("lead", "issue", "lt.json", file)
	wantStatus(t, publish(t, lead, "p-1", "issue", "lt.json"), "started", "publishing issue/lt.json: 4 action(s)")
	if st := statusOf(t, lead, "p-1", "done", "failed"); st.State != "done" {
		t.Fatalf("final status: %+v", st)
	}
	// Its journal (1.5 MiB) is past one admin reply line (1 MiB): the
	// host's outbox ls and show still answer, without the proposal.
	var list wire.OutboxList
	if err := e.admin("outbox-ls", nil, &list); err != nil || len(list.Proposals) != 2 || list.More {
		t.Fatalf("outbox-ls: %v %d", err, len(list.Proposals))
	}
	var j wire.OutboxJournal
	if err := e.admin("outbox-show", wire.OutboxArgs{Key: "lead/issue/lt.json"}, &j); err != nil || j.State != "done" || len(j.Actions) != 4 || string(j.Proposal) != "null" {
		t.Fatalf("outbox-show: %v %s", err, j.State)
	}
}

// TestPublishSourceBringsOnlyNewObjects: the source's commit comes to the
// host repository offering the orchestrator's start commit as common
// ground (a commit both sides have): it brings the child's new objects,
// not the whole history again. Else each first publish of a child's
// branch wrote a pack the size of the repository into the user's
// repository: at 30 publishes an hour, as many copies.
func TestPublishSourceBringsOnlyNewObjects(t *testing.T) {
	var origin string
	e, _, lead := newPublishEnvWith(t, 30, publishGrant(), func(e *testEnv) {
		big := make([]byte, 4<<20)
		rand.Read(big)
		if err := os.WriteFile(filepath.Join(e.repo, "big.bin"), big, 0o644); err != nil {
			t.Fatal(err)
		}
		hostGit(t, e.repo, "add", "big.bin")
		hostGit(t, e.repo, "commit", "-q", "-m", "history")
		hostGit(t, e.repo, "gc", "-q")
		withOrigin(&origin)(e)
	})
	packKiB := func() int {
		for _, line := range strings.Split(hostGit(t, e.repo, "count-objects", "-v"), "\n") {
			if v, ok := strings.CutPrefix(line, "size-pack: "); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		t.Fatal("no size-pack")
		return 0
	}
	e.child("kid", "lead")
	head, _ := e.reportDone("kid", "d-kid")
	before := packKiB()
	e.stage("lead", "pr", "src.json", fmt.Sprintf(`{"version": 1, "kind": "source", "repo": "owner/repo", "source": "refs/jailbee/from/kid/work/kid", "source_sha": %q, "base": "main", "title": "t"}`, head))
	publish(t, lead, "s-1", "pr", "src.json")
	if st := statusOf(t, lead, "s-1", "done", "failed"); st.State != "done" {
		t.Fatalf("publish: %+v", st)
	}
	if grew := packKiB() - before; grew > 1024 {
		t.Fatalf("the host repository grew by %d KiB for a one-file commit", grew)
	}
}

// TestPublishSourceBytesBudget: what an orchestrator's sources bring into
// the user's repository is bounded by publish.bytes_per_hour: each
// transfer may bring 4 GiB, chosen by a sandbox, and 30 publishes an hour
// filled the user's disk by 120 GiB. Under a budget of 1 MiB, a source of
// 2 MiB fails, certain and with nothing pushed, naming the budget; the
// budget it used up then refuses a small source within the hour.
func TestPublishSourceBytesBudget(t *testing.T) {
	var origin string
	e, _, lead := newPublishEnvWith(t, 30, publishGrant(), func(e *testEnv) {
		e.publish.BytesPerHour = config.MinPublishBytesPerHour
		withOrigin(&origin)(e)
	})
	source := func(child, sha string) string {
		return fmt.Sprintf(`{"version": 1, "kind": "source", "repo": "owner/repo", "source": "refs/jailbee/from/%s/work/%s", "source_sha": %q, "base": "main", "title": "t"}`, child, child, sha)
	}
	e.child("big", "lead")
	e.mustExec("big", "sh", "-c", "head -c 2097152 /dev/urandom > big.bin && git add big.bin && "+commitCmd+" -m big")
	head, _ := e.reportDone("big", "d-big")
	e.stage("lead", "pr", "big.json", source("big", head))
	publish(t, lead, "s-1", "pr", "big.json")
	st := statusOf(t, lead, "s-1", "done", "failed")
	if st.State != "failed" || !strings.Contains(st.Detail, "the source is larger than what is left of this orchestrator's publish transfer budget: 1048576 of its 1048576 bytes an hour (publish.bytes_per_hour)") {
		t.Fatalf("a 2 MiB source under a budget of 1 MiB: %+v", st)
	}
	if out, err := exec.Command("git", "--git-dir", origin, "rev-parse", "--verify", "-q", "refs/heads/work/big").CombinedOutput(); err == nil {
		t.Fatalf("the branch was pushed: %s", out)
	}

	e.child("small", "lead")
	head, _ = e.reportDone("small", "d-small")
	e.stage("lead", "pr", "small.json", source("small", head))
	publish(t, lead, "s-2", "pr", "small.json")
	st = statusOf(t, lead, "s-2", "done", "failed")
	if st.State != "failed" || !strings.Contains(st.Detail, "publish transfer budget exhausted: 1048576 of 1048576 bytes brought to the host in the last hour (publish.bytes_per_hour)") {
		t.Fatalf("a small source with the budget used: %+v", st)
	}
}

// TestPublishReworkNotOntoTheDefaultBranch: a rework pushes to its pull
// request's own branch, and a pull request may come from the
// repository's default branch (main into a release branch): any child's
// import would then fast-forward main with no review. A pull request
// whose branch is its repository's default branch is not reworked.
func TestPublishReworkNotOntoTheDefaultBranch(t *testing.T) {
	var origin string
	e, gh, lead := newPublishEnvWith(t, 30, publishGrant(), func(e *testEnv) {
		e.withAgent()
		withOrigin(&origin)(e)
	})
	mainBefore := hostGit(t, origin, "rev-parse", "refs/heads/main")
	hostGit(t, e.repo, "push", "-q", "origin", "main:refs/pull/9/head", "main:refs/heads/release")
	gh.AddPullRequest("owner/repo", githubtest.PR{Number: 9, Title: "release", Head: "main", HeadRepo: "owner/repo", Base: "release", State: "open"})
	spawn(t, lead, "s-pr", map[string]any{"version": 2, "kind": "pr", "pr": 9, "prompt": "work", "on_done": "keep"})
	imported := messageFrom(t, lead, "pr-9", "done")
	e.stage("lead", "pr", "rework-9.json", fmt.Sprintf(`{"version": 1, "kind": "source", "repo": "owner/repo", "source": %q, "source_sha": %q, "pr": 9}`,
		imported.ImportedRef, imported.ImportedSHA))
	wantStatus(t, publish(t, lead, "w-1", "pr", "rework-9.json"), "started", "publishing pr/rework-9.json: 1 action(s)")
	st := statusOf(t, lead, "w-1", "done", "failed")
	if got := hostGit(t, origin, "rev-parse", "refs/heads/main"); got != mainBefore {
		t.Fatalf("origin's main moved to %s (was %s): %+v", got, mainBefore, st)
	}
	wantStatus(t, st, "failed", "pr/rework-9.json: action 1 (source) failed: forge: push: pull request 9's branch main is the default branch of owner/repo: it is not pushed to; publish it again with a new id to continue with the actions not applied")
}

// TestPublishIssueActionsNotOnPullRequests: on GitHub a pull request is
// an issue too, so the issues API comments on, labels and closes pull
// requests. An orchestrator granted issue actions must not reach pull
// requests through them (a review needs pr_reviews and a bound pull
// request): every comment, label or close on a pull request's number is
// refused before anything changes, and the proposal stops there.
func TestPublishIssueActionsNotOnPullRequests(t *testing.T) {
	e, gh, lead := newPublishEnv(t, 30, publishGrant())
	pr := gh.AddPullRequest("owner/repo", githubtest.PR{Title: "someone's work", Head: "contrib", Base: "main"})
	for i, action := range []string{
		fmt.Sprintf(`{"kind": "close", "issue": %d}`, pr),
		fmt.Sprintf(`{"kind": "comment", "issue": %d, "body": "LGTM, merging"}`, pr),
		fmt.Sprintf(`{"kind": "label", "issue": %d, "labels": ["approved"]}`, pr),
	} {
		name := fmt.Sprintf("on-pr-%d.json", i)
		e.stage("lead", "issue", name, proposal("owner/repo", action))
		id := fmt.Sprintf("q-%d", i)
		wantStatus(t, publish(t, lead, id, "issue", name), "started", "publishing issue/"+name+": 1 action(s)")
		st := statusOf(t, lead, id, "done", "failed")
		if st.State != "failed" || !strings.Contains(st.Detail, fmt.Sprintf("#%d is a pull request", pr)) {
			t.Errorf("%s: %s %q", name, st.State, st.Detail)
		}
	}
	is, _ := gh.Issue("owner/repo", pr)
	p, _ := gh.PullRequest("owner/repo", pr)
	if p.State != "open" || len(is.Comments) != 0 || len(is.Labels) != 0 {
		t.Fatalf("the pull request was changed through the issues API: state %s, comments %q, labels %q", p.State, is.Comments, is.Labels)
	}
	for _, c := range gh.Calls() {
		if c.Method != "GET" {
			t.Errorf("call %s %s", c.Method, c.Path)
		}
	}

	// An issue is still closed.
	e.stage("lead", "issue", "issue.json", proposal("owner/repo",
		`{"kind": "create", "title": "t"}`, fmt.Sprintf(`{"kind": "close", "issue": %d}`, pr+1)))
	wantStatus(t, publish(t, lead, "q-issue", "issue", "issue.json"), "started", "publishing issue/issue.json: 2 action(s)")
	if st := statusOf(t, lead, "q-issue", "done", "failed"); st.State != "done" {
		t.Fatalf("issue.json: %+v", st)
	}
	if is, _ := gh.Issue("owner/repo", pr+1); is.State != "closed" {
		t.Fatalf("issue %d: %+v", pr+1, is)
	}
}

// TestOutboxShowJSONPrintsNoTerminalControls: an orchestrator writes its
// proposal's body (and title) as it likes; `jailbee outbox show --json`
// prints the proposal to the host user's terminal. JSON escapes C0
// controls, but not C1 controls (U+0080 to U+009F: U+009D starts an OSC,
// U+009B a CSI, which terminals act on in UTF-8) nor format characters
// (a tag character in the title here: a bidi override such as U+202E,
// which shows what follows reversed, is refused in a title, but a body
// may hold one): each is written as a \u escape, the same JSON.
func TestOutboxShowJSONPrintsNoTerminalControls(t *testing.T) {
	e, _, lead := newPublishEnv(t, 30, publishGrant())
	body := "Seen in CI.\u009d0;pwned\u009c\u009b2J\u009d52;c;ZWNobyBwd25lZA==\u009c tag\U000e0001 \u202egnp.exe"
	quoted, _ := json.Marshal(body)
	e.stage("lead", "issue", "c1.json", proposal("owner/repo",
		`{"kind": "create", "title": "fix \udb40\udc01gnp.exe", "body": `+string(quoted)+`}`))
	wantStatus(t, publish(t, lead, "c1-1", "issue", "c1.json"), "started", "publishing issue/c1.json: 1 action(s)")
	statusOf(t, lead, "c1-1", "done", "failed")
	out := e.jb("outbox", "show", "lead/issue/c1.json", "--json")
	if i := strings.IndexFunc(out, func(r rune) bool { return r >= 0x80 && r < 0xa0 || r == '\u202e' || r == '\U000e0001' }); i >= 0 {
		t.Fatalf("outbox show --json printed a terminal control: %q", out[max(0, i-20):])
	}
	var j wire.OutboxJournal
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	var p struct {
		Actions []struct{ Title, Body string }
	}
	if err := json.Unmarshal(j.Proposal, &p); err != nil || len(p.Actions) != 1 || p.Actions[0].Body != body || p.Actions[0].Title != "fix \U000e0001gnp.exe" {
		t.Fatalf("the proposal as printed: %v %+v", err, p)
	}
}

// TestOutboxShowPrintsNoForgeControls: what the forge answers is printed
// on the host's terminal by `jailbee outbox show` (text) and sent to the
// orchestrator in its status. A forge answering an html_url with an OSC
// that retitles the terminal, a C1 CSI and a bidi override, padded to
// 512 KiB, has it dropped: the action is applied with its number, and
// neither the status, the journal nor the host's output holds any of it.
func TestOutboxShowPrintsNoForgeControls(t *testing.T) {
	e, gh, lead := newPublishEnv(t, 30, publishGrant())
	hostile := "https://github.com/owner/repo/issues/1\x1b]0;pwned\x07\u009b2J\u202e" + strings.Repeat("x", 512<<10)
	answer, _ := json.Marshal(map[string]any{"number": 1, "html_url": hostile})
	gh.Inject(githubtest.Fault{Method: "POST", Path: "/repos/owner/repo/issues", Kind: githubtest.Refuse, Status: 201, Body: string(answer)})
	e.stage("lead", "issue", "u.json", proposal("owner/repo", `{"kind": "create", "title": "t"}`))
	wantStatus(t, publish(t, lead, "u-1", "issue", "u.json"), "started", "publishing issue/u.json: 1 action(s)")
	wantStatus(t, statusOf(t, lead, "u-1", "done", "failed"), "done", "published issue/u.json: create #1")
	out := e.jb("outbox", "show", "lead/issue/u.json")
	if want := "lead/issue/u.json: done (manifest u-1)\n  1. create: applied #1\n"; out != want {
		t.Fatalf("outbox show:\n%q\nwant %q", out, want)
	}
	if js := e.jb("outbox", "show", "lead/issue/u.json", "--json"); strings.Contains(js, "pwned") || len(js) > 64<<10 {
		t.Fatalf("outbox show --json holds the forge's URL (%d bytes)", len(js))
	}
}
