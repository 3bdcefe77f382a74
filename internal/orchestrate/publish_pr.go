package orchestrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"agentbox/internal/forge"
	"agentbox/internal/gitx"
	"agentbox/internal/manifest"
	"agentbox/internal/pubjournal"
	"agentbox/internal/store"
)

// prPolicy checks a pr-outbox manifest beyond the grant: its repository
// must be the orchestrator's own (the host repository's origin is that
// repository's git remote); a source must be an import a done report in
// its inbox carries (ref and commit), so its branch is its child's; a
// review's pull request, and a rework's, one a child of the orchestrator
// was spawned from (kind pr).
func (o *Orchestrator) prPolicy(ctx context.Context, w *pubWork) error {
	orch, err := o.Store.Sandbox(ctx, w.sandbox)
	if err != nil {
		return err
	}
	var repo string
	if w.pr.Source != nil {
		repo = w.pr.Source.Repo
	} else {
		repo = w.pr.Review.Repo
	}
	if !o.ownRepo(ctx, orch, repo) {
		return refusef("repository `%s` is not this orchestrator's repository (the host repository's %s remote)", repo, PRRemote)
	}
	pr := 0
	if s := w.pr.Source; s != nil {
		// Only what the broker imported: the orchestrator's repository is
		// its own to write, refs under refs/jailbee/from/ included.
		imported, err := o.Store.DeliveredImport(ctx, orch.Name, s.Source, s.SourceSHA)
		if err != nil {
			return err
		}
		if !imported {
			return refusef("source `%s` at %s is not a child's import: name the imported_ref and imported_sha of a done report in your inbox", s.Source, s.SourceSHA)
		}
		if pr = s.PR; pr == 0 {
			return nil
		}
	} else {
		pr = w.pr.Review.PR
	}
	bound, err := o.boundPR(ctx, orch.Name, pr)
	if err != nil {
		return err
	}
	if !bound {
		return refusef("pull request %d is not bound to this orchestrator: only pull requests a child was spawned from (kind pr)", pr)
	}
	return nil
}

// boundPR reports whether a child of orch was spawned from pull request
// pr.
func (o *Orchestrator) boundPR(ctx context.Context, orch string, pr int) (bool, error) {
	kids, err := o.Store.Children(ctx, orch)
	if err != nil {
		return false, err
	}
	for _, k := range kids {
		var doc spawnDoc
		if json.Unmarshal([]byte(k.SpawnDoc), &doc) == nil && doc.Kind == manifest.KindPR && doc.PR == pr {
			return true, nil
		}
	}
	return false, nil
}

// ownRepo reports whether repo's git remote (broker.yaml forge.git_url) is
// the host repository's origin.
func (o *Orchestrator) ownRepo(ctx context.Context, orch store.Sandbox, repo string) bool {
	r, err := forge.ParseRepo(repo)
	if err != nil {
		return false
	}
	origin := gitx.RemoteURL(ctx, orch.Repo, PRRemote)
	norm := func(u string) string { return strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(u), "/"), ".git") }
	return origin != "" && norm(origin) == norm(forge.GitURL(o.Publishing.GitURL, r))
}

// PublishRefPrefix is where a source's commit is put in the user's
// repository before its push: PublishRefPrefix + <orchestrator> + "/" +
// <child> + "/" + <branch>.
const PublishRefPrefix = "refs/jailbee/publish/"

// PushedRefPrefix records, in the user's repository, where a new pull
// request's publish last moved its branch on the remote: PushedRefPrefix
// + <orchestrator> + "/" + <child> + "/" + <branch>. The orchestrator names
// its children's branches, so the name alone does not make a remote branch
// its own: only one its publish created (or moved since) is.
const PushedRefPrefix = "refs/jailbee/pushed/"

// applyPR makes a pr-outbox manifest's one action: a source's commit is
// brought from the orchestrator's import into the host repository, pushed
// from there to the forge (a fast-forward only, never forced) and its pull
// request opened (or, for a rework, pushed to the pull request's branch);
// a review is submitted.
func (o *Orchestrator) applyPR(ctx context.Context, j *pubjournal.Journal) (actionResult, error) {
	m, err := manifest.DecodeCanonicalPRManifest(j.Proposal)
	if err != nil {
		return actionResult{}, &forge.Error{Op: "publish", Certain: true, Msg: "the journaled manifest cannot be read"}
	}
	f := o.Publishing.Forge
	if r := m.Review; r != nil {
		repo, _ := forge.ParseRepo(r.Repo)
		url, err := f.CreateReview(ctx, repo, r.PR, r.Event, r.Body)
		return actionResult{URL: url, Number: r.PR}, err
	}
	s := m.Source
	repo, err := forge.ParseRepo(s.Repo)
	if err != nil {
		return actionResult{}, &forge.Error{Op: "publish", Certain: true, Msg: err.Error()}
	}
	_, target := s.Import()
	var rework forge.PR
	if s.PR != 0 {
		if rework, err = f.PullRequest(ctx, repo, s.PR); err != nil {
			return actionResult{}, err
		}
		if !strings.EqualFold(rework.HeadRepo, s.Repo) || rework.State != "open" {
			return actionResult{}, &forge.Error{Op: "push", Certain: true,
				Msg: fmt.Sprintf("pull request %d is not open with its branch in %s: its branch cannot be pushed to", s.PR, s.Repo)}
		}
		// A pull request may come from the default branch (main into a
		// release branch): reworking it would land any child's commit on
		// main unreviewed. Unknown is refused too.
		switch rework.HeadDefault {
		case "":
			return actionResult{}, &forge.Error{Op: "push", Certain: true,
				Msg: fmt.Sprintf("the forge did not say the default branch of %s: pull request %d's branch is not pushed to", rework.HeadRepo, s.PR)}
		case rework.HeadRef:
			return actionResult{}, &forge.Error{Op: "push", Certain: true,
				Msg: fmt.Sprintf("pull request %d's branch %s is the default branch of %s: it is not pushed to", s.PR, rework.HeadRef, rework.HeadRepo)}
		}
		target = rework.HeadRef
	}
	if err := o.pushSource(ctx, j.Sandbox, j.Key(), repo, s, target); err != nil {
		return actionResult{}, err
	}
	if s.PR != 0 {
		return actionResult{URL: rework.URL, Number: s.PR}, nil
	}
	pr, err := f.CreatePullRequest(ctx, repo, target, s.Base, s.Title, s.Body, s.Draft)
	return actionResult{URL: pr.URL, Number: pr.Number}, err
}

// pushSource brings the commit s names from the orchestrator's import ref
// into the host repository (through the bridge: upload-pack in the
// orchestrator's sandbox, host git fetching that one commit, no sandbox
// config read) and pushes that copy to branch. The ref must still point
// at source_sha. A refusal of the remote (not a fast-forward, a rule) is
// certain; any other push failure uncertain.
func (o *Orchestrator) pushSource(ctx context.Context, orch, key string, repo forge.Repo, s *manifest.PRSource, branch string) error {
	sb, err := o.Store.Sandbox(ctx, orch)
	if err != nil {
		return &forge.Error{Op: "push", Certain: true, Msg: "the orchestrator's record cannot be read"}
	}
	ctx, cancel := context.WithTimeout(ctx, importTimeout)
	defer cancel()
	src := o.checkout(orch)
	at, err := gitx.RevParse(ctx, src, s.Source)
	if err != nil {
		return &forge.Error{Op: "push", Certain: true, Msg: fmt.Sprintf("source %s cannot be read in your repository", s.Source)}
	}
	if at != s.SourceSHA {
		return &forge.Error{Op: "push", Certain: true, Msg: fmt.Sprintf("source %s is at %s, not at source_sha %s", s.Source, at, s.SourceSHA)}
	}
	child, _ := s.Import()
	ref := PublishRefPrefix + orch + "/" + child + "/" + branch
	host := gitx.HostRepo(sb.Repo)
	// Common ground the orchestrator has and the host too: its start (or
	// last fetched) commit. Without it the whole history came again, one
	// copy in the user's repository for each child's first publish.
	if err := o.bringSource(ctx, orch, key, src, host, s.SourceSHA, ref, []string{ref, sb.Imported}); err != nil {
		return err
	}
	url, auth := forge.GitURL(o.Publishing.GitURL, repo), gitx.PushAuth{Token: o.Publishing.Token}
	if s.PR != 0 {
		err = host.PushBranch(ctx, url, ref, branch, auth)
	} else {
		err = o.pushOwnBranch(ctx, sb.Repo, url, ref, PushedRefPrefix+orch+"/"+child+"/"+branch, branch, s.SourceSHA, auth)
	}
	switch {
	case err == nil:
		return nil
	case errors.As(err, new(*forge.Error)):
		return err
	case errors.Is(err, errNotOwnBranch):
		return &forge.Error{Op: "push", Certain: true, Msg: fmt.Sprintf("branch %s exists on the remote and is not where this orchestrator published it: a new pull request needs a new branch", branch)}
	case errors.Is(err, gitx.ErrNotFastForward), errors.Is(err, gitx.ErrPushRefused):
		return &forge.Error{Op: "push", Certain: true, Msg: err.Error()}
	}
	o.logger().Error("publish push", "sandbox", orch, "branch", branch, "err", err)
	return &forge.Error{Op: "push", Msg: "the push failed (see the broker log)"}
}

// bringSource transfers commit from the orchestrator's repository src to
// the host repository's ref, within what is left of the orchestrator's
// hourly byte budget (Publishing.BytesPerHour), reserved durably before
// and settled to what the source sent after (key names the reservation):
// each transfer may bring gitx.MaxTransferBytes, chosen by a sandbox.
func (o *Orchestrator) bringSource(ctx context.Context, orch, key string, src, host gitx.Repo, commit, ref string, common []string) error {
	limit := o.Publishing.bytesPerHour()
	allowed, err := o.Publishing.Journal.ReserveBytes(orch, key, gitx.MaxTransferBytes, limit, time.Now())
	var be *pubjournal.ByteBudgetError
	if errors.As(err, &be) {
		return &forge.Error{Op: "push", Certain: true, Msg: be.Error()}
	}
	if err != nil {
		o.logger().Error("publish: reserve the transfer's bytes", "sandbox", orch, "err", err)
		return &forge.Error{Op: "push", Certain: true, Msg: "the publish transfer budget cannot be read (see the broker log)"}
	}
	var carried int64
	err = gitx.Transfer(ctx, src, commit, host, ref, gitx.TransferOptions{Common: common, MaxBytes: allowed, Carried: &carried})
	if serr := o.Publishing.Journal.SettleBytes(orch, key, carried); serr != nil {
		o.logger().Error("publish: settle the transfer's bytes", "sandbox", orch, "err", serr)
	}
	switch {
	case errors.Is(err, gitx.ErrTransferTooLarge) && allowed < gitx.MaxTransferBytes:
		return &forge.Error{Op: "push", Certain: true, Msg: fmt.Sprintf(
			"the source is larger than what is left of this orchestrator's publish transfer budget: %d of its %d bytes an hour (publish.bytes_per_hour)", allowed, limit)}
	case err != nil:
		o.logger().Error("publish: bring the source to the host", "sandbox", orch, "err", err)
		return &forge.Error{Op: "push", Certain: true, Msg: "the source could not be brought to the host (see the broker log)"}
	}
	return nil
}

// errNotOwnBranch: a new pull request's branch is on the remote, but not
// where this orchestrator's publish left it.
var errNotOwnBranch = errors.New("not the orchestrator's own branch")

// pushOwnBranch pushes ref to branch only if the remote has no such branch
// or has it where pushed records this orchestrator's last push of it
// (gitx.PushBranchFrom), and records a push that moved it.
func (o *Orchestrator) pushOwnBranch(ctx context.Context, repo, url, ref, pushed, branch, commit string, auth gitx.PushAuth) error {
	host := gitx.HostRepo(repo)
	from, err := gitx.ResolveCommit(ctx, repo, pushed)
	if errors.Is(err, gitx.ErrUnknownRevision) {
		from, err = "", nil
	}
	if err != nil {
		o.logger().Error("publish: read the push record", "ref", pushed, "err", err)
		return &forge.Error{Op: "push", Certain: true, Msg: "the push record could not be read (see the broker log)"}
	}
	moved, err := host.PushBranchFrom(ctx, url, ref, branch, from, auth)
	if errors.Is(err, gitx.ErrBranchMoved) {
		return errNotOwnBranch
	}
	// A branch that was already at the commit is not recorded: that it is
	// there says nothing of who put it there.
	if err == nil && moved {
		if rerr := host.SetRef(ctx, pushed, commit); rerr != nil {
			o.logger().Error("publish: record the push", "ref", pushed, "err", rerr)
		}
	}
	return err
}
