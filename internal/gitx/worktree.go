package gitx

import (
	"context"
	"fmt"
)

// BranchExists reports whether repo has a local branch named branch.
// The repository must be one the caller trusts (its configuration is
// read, though no command it names runs: see safeConfig).
func BranchExists(ctx context.Context, repo, branch string) (bool, error) {
	if err := CheckBranchName(ctx, branch); err != nil {
		return false, err
	}
	_, err := run(ctx, repo, "rev-parse", "--verify", "--quiet", "refs/heads/"+branch)
	if err == nil {
		return true, nil
	}
	if exitCode(err) == 1 {
		return false, nil
	}
	return false, err
}

// AddWorktree creates a linked worktree of repo at path on a new branch
// starting at commit (a full object name). It never reuses a branch, and
// checks out commit's own tree: replace refs are ignored.
func AddWorktree(ctx context.Context, repo, path, branch, commit string) error {
	if err := CheckBranchName(ctx, branch); err != nil {
		return err
	}
	if !shaPattern.MatchString(commit) {
		return fmt.Errorf("%w: commit %q", ErrInvalidArgument, commit)
	}
	if err := checkArg("path", path); err != nil {
		return err
	}
	// --no-replace-objects (inherited by the git processes worktree add
	// starts): a replace ref would check another tree out for commit.
	_, err := run(ctx, repo, "--no-replace-objects", "worktree", "add", "--no-track", "-b", branch, "--", path, commit)
	return err
}

// DeleteBranch deletes branch of repo if it still points at commit.
func DeleteBranch(ctx context.Context, repo, branch, commit string) error {
	if err := CheckBranchName(ctx, branch); err != nil {
		return err
	}
	_, err := run(ctx, repo, "update-ref", "-d", "refs/heads/"+branch, commit)
	return err
}

// InitCommit makes dir (which must exist) a new repository on branch
// main holding everything in it in one commit by a fixed author, and
// returns the commit's id.
func InitCommit(ctx context.Context, dir, message string) (string, error) {
	author := []string{"-c", "user.name=branchbox", "-c", "user.email=branchbox@example.invalid"}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-q", "--no-verify", "-m", message}} {
		if _, err := runWithConfig(ctx, dir, author, args...); err != nil {
			return "", err
		}
	}
	return HeadCommit(ctx, dir)
}
