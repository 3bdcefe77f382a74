package orchestrate

import (
	"context"
	"errors"
	"fmt"

	"agentbox/internal/backend"
	"agentbox/internal/crashpoint"
	"agentbox/internal/gitx"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// UpdateRefPrefix is where an update with an explicit source (ref or
// base) lands in the child: UpdateRefPrefix + <orchestrator> + "/" + <id>.
const UpdateRefPrefix = "refs/jailbee/update/"

// MsgUpdate is the kind of the message an update delivers to the child.
const MsgUpdate = "update"

// updateMessageRoom is the room an update's message is checked for
// before the update: more than its document takes (names, a ref, two
// commit ids and a sentence).
const updateMessageRoom = 1 << 10

// Update runs an update manifest: a source (the orchestrator's current
// branch, or its ref, or a host base) is fetched into a running child,
// and with merge applied to the child's branch after a conflict check;
// the child gets a message of kind update with the ref and commit (and
// merged_head when the merge moved its HEAD).
func (o *Orchestrator) Update(ctx context.Context, req wire.Caller, m *manifest.Manifest) (store.Sent, error) {
	u := m.Update
	return o.childManifestDelivering(ctx, req, m, u.Child, func(child store.Sandbox) (string, *store.Delivery, error) {
		ctx, cancel := context.WithTimeout(ctx, importTimeout)
		defer cancel()
		orch, err := o.Store.Sandbox(ctx, req.Sandbox)
		if err != nil {
			return "", nil, err
		}
		src, commit, ref, what, err := o.updateSource(ctx, orch, m)
		if err != nil {
			return "", nil, err
		}
		switch child.State {
		case store.StateQueued:
			return "", nil, refusef("`%s` is queued: it has not started", child.Name)
		case store.StateStopped:
			return "", nil, refusef("`%s` is stopped: restart it before updating it", child.Name)
		}
		// The message reports a change already made, so its delivery is
		// not refused: its room is checked before the change instead.
		// Without that, updates nobody reads would pile up in the child's
		// inbox without bound.
		if err := o.Store.CheckRoom(ctx, orch.Name, child.Name, updateMessageRoom); err != nil {
			return "", nil, quotaRefusal(err)
		}
		dst := o.checkout(child.Name)
		var work workState
		if u.Merge {
			if work, err = o.mergeable(ctx, child); err != nil {
				return "", nil, err
			}
		}
		if err := gitx.Transfer(ctx, src, commit, dst, ref, gitx.TransferOptions{}); err != nil {
			return "", nil, fmt.Errorf("update %s: %w", child.Name, err)
		}
		detail := fmt.Sprintf("delivered to %s: %s at %s", child.Name, ref, short(commit))
		body := fmt.Sprintf("update from %s: %s is at %s as %s; merge it when convenient", orch.Name, what, short(commit), ref)
		imp := &store.ImportResult{Ref: ref, SHA: commit}
		if u.Merge {
			merged, how, err := o.merge(ctx, child, work, commit)
			if err != nil {
				return "", nil, err
			}
			crashpoint.Hit(crashpoint.UpdateMerged)
			detail += "; " + how
			if merged != "" {
				imp.MergedHead = merged
				body = fmt.Sprintf("update from %s: %s (%s) was merged into %s: %s; re-read the files you work on", orch.Name, what, short(commit), work.branch, how)
			} else {
				body = fmt.Sprintf("update from %s: %s (%s) is already in %s: nothing changed", orch.Name, what, short(commit), work.branch)
			}
		}
		msg := &store.Delivery{From: orch.Name, To: child.Name, ManifestID: m.ID, Kind: MsgUpdate, Body: body, Import: imp, Unmetered: true}
		return detail, msg, nil
	})
}

// updateSource resolves an update's source: the commit, where it comes
// from, the ref it lands at in the child, and words for the message.
func (o *Orchestrator) updateSource(ctx context.Context, orch store.Sandbox, m *manifest.Manifest) (gitx.Repo, string, string, string, error) {
	u := m.Update
	switch {
	case u.Base != "":
		commit, err := hostBase(ctx, orch.Repo, u.Base)
		if err != nil {
			return gitx.Repo{}, "", "", "", err
		}
		return gitx.HostRepo(orch.Repo), commit, UpdateRefPrefix + orch.Name + "/" + m.ID, "base " + u.Base, nil
	case u.Ref != "":
		commit, err := gitx.RevParse(ctx, o.checkout(orch.Name), u.Ref)
		if err != nil {
			return gitx.Repo{}, "", "", "", refusef("`ref` %s names no commit in your repository", u.Ref)
		}
		return o.checkout(orch.Name), commit, UpdateRefPrefix + orch.Name + "/" + m.ID, u.Ref, nil
	}
	branch, commit, err := gitx.Head(ctx, o.checkout(orch.Name))
	if err != nil {
		return gitx.Repo{}, "", "", "", refusef("cannot read your repository's HEAD")
	}
	if branch == "" {
		return gitx.Repo{}, "", "", "", refusef("your HEAD is detached: check out a branch, or name a source with --ref or --base")
	}
	return o.checkout(orch.Name), commit, ImportRefPrefix + orch.Name + "/" + branch, "branch " + branch, nil
}

// mergeable refuses a merge into a child that is stopped, dirty,
// detached or in the middle of a merge.
func (o *Orchestrator) mergeable(ctx context.Context, child store.Sandbox) (workState, error) {
	work, err := o.readWork(ctx, child.Name)
	if errors.Is(err, backend.ErrNotRunning) {
		return work, refusef("`%s` is stopped: restart it before updating it", child.Name)
	}
	if err != nil {
		return work, refusef("cannot read the repository of `%s`", child.Name)
	}
	if work.branch == "" {
		return work, refusef("the HEAD of `%s` is detached: it must be on its branch to merge an update", child.Name)
	}
	if work.dirty {
		return work, refusef("`%s` has uncommitted changes: a merge needs a clean work tree", child.Name)
	}
	if inMerge, err := gitx.MergeInProgress(ctx, o.checkout(child.Name)); err != nil || inMerge {
		return work, refusef("`%s` is in the middle of a merge: it must finish or abort it first", child.Name)
	}
	return work, nil
}

// merge applies commit to the child's branch: nothing when it is already
// contained, a fast-forward, or a merge commit after a conflict check
// (gitlink conflicts refused conservatively). It returns the new HEAD
// ("" when unchanged) and how.
func (o *Orchestrator) merge(ctx context.Context, child store.Sandbox, work workState, commit string) (string, string, error) {
	repo := o.checkout(child.Name)
	res, err := gitx.Merge(ctx, repo, commit, "Merge update "+short(commit)+" into "+work.branch)
	var conflict *gitx.ConflictError
	switch {
	case errors.As(err, &conflict):
		return "", "", refusef("the update conflicts with `%s`'s branch %s in %s: nothing was merged", child.Name, work.branch, conflict.Paths)
	case err != nil:
		return "", "", fmt.Errorf("merge in %s: %w", child.Name, err)
	}
	switch res.How {
	case gitx.MergeContained:
		return "", fmt.Sprintf("already contained in %s, HEAD unchanged", work.branch), nil
	case gitx.MergeFastForward:
		return res.Head, fmt.Sprintf("%s fast-forwarded to %s", work.branch, short(res.Head)), nil
	}
	return res.Head, fmt.Sprintf("merged into %s as %s", work.branch, short(res.Head)), nil
}
