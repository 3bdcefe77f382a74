package orchestrate

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"agentbox/internal/forge"
	"agentbox/internal/gitx"
	"agentbox/internal/manifest"
	"agentbox/internal/pubjournal"
	"agentbox/internal/store"
)

// prPolicy checks a pr-outbox manifest beyond the grant: its repository
// must be the orchestrator's own (the host repository's origin is that
// repository's git remote); a source's branch the orchestrator's own or
// one of its children's; a review's pull request one a child of the
// orchestrator was spawned from (kind pr).
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
	kids, err := o.Store.Children(ctx, orch.Name)
	if err != nil {
		return err
	}
	if s := w.pr.Source; s != nil {
		if _, ok := branchOwner(orch, kids, s.Branch); !ok {
			return refusef("branch `%s` is neither this orchestrator's branch nor one of its children's", s.Branch)
		}
		return nil
	}
	for _, k := range kids {
		var doc spawnDoc
		if json.Unmarshal([]byte(k.SpawnDoc), &doc) == nil && doc.Kind == manifest.KindPR && doc.PR == w.pr.Review.PR {
			return nil
		}
	}
	return refusef("pull request %d is not bound to this orchestrator: review only pull requests a child was spawned from (kind pr)", w.pr.Review.PR)
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

// branchOwner is the sandbox of the tree whose branch is branch: the
// orchestrator or one of its children.
func branchOwner(orch store.Sandbox, kids []store.Sandbox, branch string) (string, bool) {
	if orch.Branch == branch {
		return orch.Name, true
	}
	for _, k := range kids {
		if k.Branch == branch {
			return k.Name, true
		}
	}
	return "", false
}

// applyPR makes a pr-outbox manifest's one action: a source's branch is
// brought into the host repository from its sandbox, pushed from there to
// the forge (a fast-forward only, never forced) and its pull request
// opened; a review is submitted.
func (o *Orchestrator) applyPR(ctx context.Context, j *pubjournal.Journal) (actionResult, error) {
	m, err := manifest.DecodePRManifest(j.Proposal)
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
	if err := o.pushSource(ctx, j.Sandbox, repo, s.Branch); err != nil {
		return actionResult{}, err
	}
	pr, err := f.CreatePullRequest(ctx, repo, s.Branch, s.Base, s.Title, s.Body, s.Draft)
	return actionResult{URL: pr.URL, Number: pr.Number}, err
}

// pushSource fetches branch from the sandbox of orch's tree that has it
// into the host repository (jailbee fetch's ref) and pushes that copy.
// A refusal of the remote (not a fast-forward, a rule) is certain; any
// other push failure uncertain.
func (o *Orchestrator) pushSource(ctx context.Context, orch string, repo forge.Repo, branch string) error {
	sb, err := o.Store.Sandbox(ctx, orch)
	if err != nil {
		return &forge.Error{Op: "push", Certain: true, Msg: "the orchestrator's record cannot be read"}
	}
	kids, err := o.Store.Children(ctx, orch)
	owner, ok := branchOwner(sb, kids, branch)
	if err != nil || !ok {
		return &forge.Error{Op: "push", Certain: true, Msg: "the branch is no longer in this orchestrator's tree"}
	}
	fetched, err := o.FetchSandbox(ctx, FetchRequest{Name: owner, Branch: branch})
	if err != nil {
		return &forge.Error{Op: "push", Certain: true, Msg: "the branch could not be brought to the host: " + refusalText(err)}
	}
	err = gitx.HostRepo(sb.Repo).PushBranch(ctx, forge.GitURL(o.Publishing.GitURL, repo), fetched.Ref, branch, gitx.PushAuth{Token: o.Publishing.Token})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, gitx.ErrNotFastForward), errors.Is(err, gitx.ErrPushRefused):
		return &forge.Error{Op: "push", Certain: true, Msg: err.Error()}
	}
	o.logger().Error("publish push", "sandbox", orch, "branch", branch, "err", err)
	return &forge.Error{Op: "push", Msg: "the push failed (see the broker log)"}
}

func refusalText(err error) string {
	if r, ok := AsRefusal(err); ok {
		return r.Detail
	}
	return "see the broker log"
}
