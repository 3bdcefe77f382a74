package launch

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"agentbox/internal/gitx"
	"agentbox/internal/managed/engine"
	"agentbox/internal/managed/gitmeta"
	"agentbox/internal/secfs"
)

// Residue kinds a teardown receipt names.
const (
	KindContainer       = "container"
	KindNetwork         = "network"
	KindVolume          = "volume"
	KindPortProxy       = "port-proxy"
	KindSpoolVolume     = "tool-request-volume"
	KindMaterialization = "lease-materialization"
	KindLedger          = "tool-request-ledger"
	KindComposeInputs   = "compose-inputs"
	KindWorktree        = "worktree"
	// KindSetID: a file or directory with a set-user-ID or set-group-ID
	// bit in the worktree or the shared Git metadata.
	KindSetID = "setid-file"
	// KindGitExecutable: configuration, attributes or hooks of the shared
	// Git metadata that changed since the launch (host Git would run them).
	KindGitExecutable = "git-executable-config"
	// KindGitRedirect: what in the shared Git metadata makes host Git
	// read outside the repository or block: an alternates file, or a
	// symbolic link, FIFO, socket or device where Git reads objects, refs
	// or logs.
	KindGitRedirect = "git-redirect"
	KindEngine      = "engine" // the engine could not be asked: nothing is verified
)

// Receipt is what a teardown removed and what is left.
type Receipt struct {
	Provider    string    `json:"provider"`
	RuntimeID   string    `json:"runtime_id"`
	Verified    bool      `json:"verified"`
	ResidueFree bool      `json:"residue_free"`
	Residue     []Residue `json:"residue"`
}

// Residue is what is left of one kind.
type Residue struct {
	Kind        string   `json:"kind"`
	Identifiers []string `json:"identifiers"`
}

// ProviderInGuest names the runtime provider in summaries and receipts.
const ProviderInGuest = "in-guest"

// Teardown removes everything feature name's launch created, then looks
// again and reports what is left. The record goes only when nothing is.
func Teardown(ctx context.Context, cfg Config, name string) (*Receipt, error) {
	rec, err := Load(cfg.StateRoot, name)
	var le *Error
	if errors.As(err, &le) && le.Code == CodeNotFound && exists(featureDir(cfg.StateRoot, name)) {
		// A start killed between creating the directory and writing the
		// record: it created nothing else.
		if err := secfs.RemoveTree(featureDir(cfg.StateRoot, name)); err != nil {
			return nil, fail(CodeInternal, "remove the feature's directory: %v", err)
		}
		return &Receipt{Provider: ProviderInGuest, Verified: true, ResidueFree: true, Residue: []Residue{}}, nil
	}
	if err != nil {
		return nil, err
	}
	eng, err := engine.Open()
	if err != nil {
		return nil, &Error{Code: CodeEngine, Message: err.Error()}
	}
	defer eng.Close()
	r := teardown(ctx, cfg, eng, rec)
	if r.ResidueFree {
		if err := secfs.RemoveTree(featureDir(cfg.StateRoot, name)); err != nil {
			r.ResidueFree = false
			r.Residue = append(r.Residue, Residue{Kind: KindComposeInputs, Identifiers: []string{"launch record"}})
		}
	}
	return r, nil
}

// teardown removes, in order: the containers and proxies (so their
// networks and volumes can go), the networks and volumes, the spools, the
// lease materializations, the ledger, the generated inputs and the
// worktree; then it lists the engine again and checks every path.
// A failed start calls it too and keeps the record, for status; Teardown
// removes the record once nothing is left.
func teardown(ctx context.Context, cfg Config, eng *engine.Engine, rec *Record) *Receipt {
	r := &Receipt{Provider: ProviderInGuest, RuntimeID: rec.OuterRuntimeID, Residue: []Residue{}}
	dir := featureDir(cfg.StateRoot, rec.Name)

	owned, listErr := eng.Owned(ctx, rec.ComposeProject, rec.SpoolVolumes)
	if listErr == nil {
		owned.Proxies = union(owned.Proxies, rec.Proxies)
		if rec.ContainerID != "" {
			owned.Containers = union(owned.Containers, []string{rec.ContainerID})
		}
		_ = eng.Remove(ctx, owned) // what failed shows below, when listed again
	}
	for _, m := range rec.Materializations {
		_ = secfs.RemoveTree(m.Path)
	}
	_ = secfs.RemoveTree(filepath.Join(dir, ledgerDir))
	_ = secfs.RemoveTree(filepath.Join(dir, inputsDir))
	_ = secfs.RemoveTree(filepath.Join(dir, homeDir))
	gitResidue := gitMetadataResidue(rec)
	removeWorktree(ctx, rec)
	// After the worktree's Git directory went: what stays in the shared
	// metadata.
	gitResidue = append(gitResidue, gitRedirectResidue(rec)...)

	// Look again: only what is observed gone counts.
	left, err := eng.Owned(ctx, rec.ComposeProject, rec.SpoolVolumes)
	if err != nil {
		r.Residue = append(r.Residue, Residue{Kind: KindEngine, Identifiers: []string{"the Docker engine could not be listed"}})
	} else {
		r.Verified = true
		add := func(kind string, ids []string) {
			if len(ids) > 0 {
				r.Residue = append(r.Residue, Residue{Kind: kind, Identifiers: ids})
			}
		}
		add(KindContainer, shortIDs(left.Containers))
		add(KindPortProxy, shortIDs(left.Proxies))
		add(KindNetwork, left.Networks)
		var spools, vols []string
		for _, v := range left.Volumes {
			if slices.Contains(rec.SpoolVolumes, v) {
				spools = append(spools, v)
			} else {
				vols = append(vols, v)
			}
		}
		add(KindVolume, vols)
		add(KindSpoolVolume, spools)
	}
	var mats []string
	for _, m := range rec.Materializations {
		if exists(m.Path) {
			mats = append(mats, m.Field)
		}
	}
	if len(mats) > 0 {
		r.Residue = append(r.Residue, Residue{Kind: KindMaterialization, Identifiers: mats})
	}
	if exists(filepath.Join(dir, ledgerDir)) {
		r.Residue = append(r.Residue, Residue{Kind: KindLedger, Identifiers: []string{ledgerDir}})
	}
	if exists(filepath.Join(dir, inputsDir)) {
		r.Residue = append(r.Residue, Residue{Kind: KindComposeInputs, Identifiers: []string{inputsDir}})
	}
	var wt []string
	if exists(rec.Worktree) {
		wt = append(wt, rec.Name)
	}
	if rec.WorktreeGitDir != "" && exists(rec.WorktreeGitDir) {
		wt = append(wt, ".git/worktrees/"+filepath.Base(rec.WorktreeGitDir))
	}
	if len(wt) > 0 {
		r.Residue = append(r.Residue, Residue{Kind: KindWorktree, Identifiers: wt})
	}
	r.Residue = append(r.Residue, gitResidue...)
	r.ResidueFree = r.Verified && len(r.Residue) == 0
	return r
}

// gitMetadataResidue is what a consumer left in the repository that host
// Git or a host user could run: a set-user-ID or set-group-ID file in the
// worktree (looked at before it is removed) or in the shared Git
// metadata, and executable configuration, attributes or hooks of the
// shared metadata that changed since the launch. Only a launch that
// delegated anything is looked at. Nothing found is removed: the
// operator decides (docs/branchbox.md, "After a launch").
func gitMetadataResidue(rec *Record) []Residue {
	if !rec.Delegated {
		return nil
	}
	gitDir := filepath.Join(rec.Repo, ".git")
	var setID []string
	for _, p := range gitmeta.SetIDFiles(rec.Worktree) {
		setID = append(setID, "worktree: "+p)
	}
	for _, p := range gitmeta.SetIDFiles(gitDir) {
		setID = append(setID, ".git/"+p)
	}
	var out []Residue
	if len(setID) > 0 {
		out = append(out, Residue{Kind: KindSetID, Identifiers: setID})
	}
	changed := []string{"no baseline was recorded: check the Git metadata by hand"}
	if rec.GitBaseline != nil {
		changed = gitmeta.Changed(gitDir, rec.GitBaseline)
	}
	if len(changed) > 0 {
		out = append(out, Residue{Kind: KindGitExecutable, Identifiers: changed})
	}
	return out
}

// gitRedirectResidue is what a consumer left in the shared Git metadata
// that makes host Git read outside the repository or block (see
// gitmeta.Redirects). Only a launch that delegated anything is looked at;
// nothing is removed.
func gitRedirectResidue(rec *Record) []Residue {
	if !rec.Delegated {
		return nil
	}
	var ids []string
	for _, p := range gitmeta.Redirects(filepath.Join(rec.Repo, ".git")) {
		ids = append(ids, ".git/"+p)
	}
	if len(ids) == 0 {
		return nil
	}
	return []Residue{{Kind: KindGitRedirect, Identifiers: ids}}
}

// removeWorktree removes the worktree and its Git directory as plain
// files: after delegation the consumer could have changed that metadata,
// so host Git never runs on it. The branch stays (its commits are the
// work), unless the launch created it and failed before delegation, when
// Git still trusts the repository and the branch holds nothing new.
func removeWorktree(ctx context.Context, rec *Record) {
	_ = secfs.RemoveTree(rec.Worktree)
	if rec.WorktreeGitDir != "" {
		_ = secfs.RemoveTree(rec.WorktreeGitDir)
	}
	if rec.BranchCreated && !rec.Delegated {
		_ = gitx.DeleteBranch(ctx, rec.Repo, rec.TaskBranch, rec.Revision)
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

func union(a, b []string) []string {
	out := append([]string(nil), a...)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func shortIDs(ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = engine.ShortID(id)
	}
	return out
}
