package orchestrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"agentbox/internal/backend"
	"agentbox/internal/gitx"
	"agentbox/internal/store"
)

// FetchRefPrefix is where `jailbee fetch` puts a sandbox's branch in the
// user's repository: FetchRefPrefix + <sandbox> + "/" + <branch>.
const FetchRefPrefix = "refs/jailbee/sandboxes/"

// FetchRequest is `jailbee fetch`.
type FetchRequest struct {
	Name   string
	Repo   string // host path; "": the repository the sandbox was made from
	Branch string // "": the sandbox's branch
}

// FetchResult is where a fetch put the branch.
type FetchResult struct {
	Ref, SHA string
}

// FetchSandbox brings a sandbox's branch into the user's repository at
// FetchRefPrefix<name>/<branch>, through the same bridge that fills
// sandboxes: upload-pack inside the sandbox, host git fetching only that
// ref (no config of the sandbox's is read on the host). A stopped
// sandbox is started for the transfer and stopped again. When the commit
// is the sandbox's HEAD, it becomes its import point (destroy's guard).
func (o *Orchestrator) FetchSandbox(ctx context.Context, req FetchRequest) (FetchResult, error) {
	sb, err := o.Store.Sandbox(ctx, req.Name)
	if errors.Is(err, store.ErrNotFound) {
		return FetchResult{}, o.NoSuchSandbox(ctx, req.Name)
	}
	if err != nil {
		return FetchResult{}, err
	}
	repo := sb.Repo
	if req.Repo != "" {
		if repo, err = hostRepoRoot(ctx, req.Repo); err != nil {
			return FetchResult{}, err
		}
	}
	branch := req.Branch
	if branch == "" {
		branch = sb.Branch
	}
	if gitx.CheckBranchName(ctx, branch) != nil {
		return FetchResult{}, refusef("invalid branch name: %q", truncate(branch, 200))
	}
	switch sb.State {
	case store.StateQueued, store.StateCreating, store.StateDestroying:
		return FetchResult{}, refusef("`%s` is %s: there is nothing to fetch yet", sb.Name, sb.State)
	}
	ctx, cancel := context.WithTimeout(ctx, importTimeout)
	defer cancel()
	if sb.State == store.StateStopped {
		stop, err := o.startStopped(ctx, sb.Name)
		if err != nil {
			return FetchResult{}, fmt.Errorf("start `%s` for the fetch: %w", sb.Name, err)
		}
		defer stop()
	}
	src := o.checkout(sb.Name)
	commit, err := gitx.RevParse(ctx, src, "refs/heads/"+branch)
	if errors.Is(err, backend.ErrNotRunning) {
		return FetchResult{}, refusef("`%s` is not running and was not stopped by the broker: start it again to fetch from it", sb.Name)
	}
	if err != nil {
		return FetchResult{}, refusef("`%s` has no branch %s", sb.Name, branch)
	}
	ref := FetchRefPrefix + sb.Name + "/" + branch
	err = gitx.Transfer(ctx, src, commit, gitx.HostRepo(repo), ref, gitx.TransferOptions{Common: []string{ref, sb.Imported}})
	if err != nil {
		// What the sandbox's git said stays in the log.
		o.logger().Error("fetch failed", "sandbox", sb.Name, "err", err)
		return FetchResult{}, refusef("could not fetch branch %s of `%s` (see the broker log)", branch, sb.Name)
	}
	if _, head, err := gitx.Head(ctx, src); err == nil && head == commit {
		if err := o.Store.SetImported(ctx, sb.Name, commit); err != nil {
			return FetchResult{}, err
		}
	}
	return FetchResult{Ref: ref, SHA: commit}, nil
}

// hostRepoRoot is the top of the host repository at path, an absolute
// path, or the refusal that says why it is none.
func hostRepoRoot(ctx context.Context, path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", refusef("the repository must be an absolute path")
	}
	repo, err := gitx.RepoRoot(ctx, path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", refusef("no such directory: %s", path)
	case errors.Is(err, gitx.ErrNotRepository):
		return "", refusef("not a git repository: %s", path)
	case err != nil:
		return "", refusef("cannot read the repository %s: %v", path, err)
	}
	return repo, nil
}
