package gitx

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// How a Merge changed the branch.
const (
	MergeContained   = "contained"    // the commit was already in HEAD's history
	MergeFastForward = "fast-forward" // the branch moved to the commit
	MergeCommit      = "merge-commit" // a merge commit joins both histories
)

// MergeResult is what a Merge did: how, and the HEAD after it.
type MergeResult struct {
	How  string
	Head string
}

// ConflictError is a merge refused before it started: Paths names (some
// of) the conflicting paths, quoted, for the orchestrator that asked.
type ConflictError struct {
	Paths string
}

func (e *ConflictError) Error() string { return "merge conflicts in " + e.Paths }

// maxConflictPaths bounds the paths a ConflictError names.
const maxConflictPaths = 5

// gitlinkMode is the tree mode of a submodule entry.
const gitlinkMode = "160000"

// mergeIdentity is who a merge commit the broker makes is by.
var mergeIdentity = []string{"-c", "user.name=jailbee", "-c", "user.email=jailbee@localhost"}

// MergeInProgress reports whether r (a sandbox repository) is in the
// middle of a merge.
func MergeInProgress(ctx context.Context, r Repo) (bool, error) {
	_, err := r.git(ctx, "rev-parse", "--quiet", "--verify", "MERGE_HEAD")
	var ge *SandboxGitError
	if errors.As(err, &ge) && ge.Code == 1 {
		return false, nil
	}
	return err == nil, err
}

// Merge applies commit to the branch checked out in r (a sandbox
// repository, clean, on a branch: the caller checks): nothing when commit
// is already contained, a fast-forward when it can, otherwise a merge
// commit with message. Conflicts are found before anything moves, with
// `git merge-tree`, and refused with a *ConflictError; a path where either
// side changes a submodule (gitlink) counts as a conflict even when git
// could resolve it.
func Merge(ctx context.Context, r Repo, commit, message string) (MergeResult, error) {
	if r.run == nil {
		return MergeResult{}, errors.New("gitx: Merge runs only inside a sandbox")
	}
	if !shaPattern.MatchString(commit) {
		return MergeResult{}, fmt.Errorf("%w: commit %q is not a full object id", ErrInvalidArgument, commit)
	}
	_, head, err := Head(ctx, r)
	if err != nil {
		return MergeResult{}, err
	}
	if ok, err := r.isAncestor(ctx, commit, head); err != nil || ok {
		return MergeResult{How: MergeContained, Head: head}, err
	}
	how := MergeCommit
	if ok, err := r.isAncestor(ctx, head, commit); err != nil {
		return MergeResult{}, err
	} else if ok {
		how = MergeFastForward
		_, err = r.git(ctx, "merge", "--quiet", "--ff-only", "--end-of-options", commit)
		if err != nil {
			return MergeResult{}, err
		}
	} else {
		if err := r.checkMergeable(ctx, head, commit); err != nil {
			return MergeResult{}, err
		}
		args := append(append([]string{}, mergeIdentity...), "merge", "--quiet", "--no-ff", "--no-edit", "-m", message, "--end-of-options", commit)
		if _, err := r.git(ctx, args...); err != nil {
			r.git(context.WithoutCancel(ctx), "merge", "--abort") // leave the tree as it was
			return MergeResult{}, err
		}
	}
	_, after, err := Head(ctx, r)
	if err != nil {
		return MergeResult{}, err
	}
	if after == head {
		return MergeResult{}, fmt.Errorf("git merge in %s: HEAD did not move", r.name)
	}
	return MergeResult{How: how, Head: after}, nil
}

// isAncestor reports whether a is in b's history.
func (r Repo) isAncestor(ctx context.Context, a, b string) (bool, error) {
	_, err := r.git(ctx, "merge-base", "--is-ancestor", a, b)
	var ge *SandboxGitError
	if errors.As(err, &ge) && ge.Code == 1 {
		return false, nil
	}
	return err == nil, err
}

// checkMergeable refuses with a *ConflictError a merge of commit into head
// that would conflict, or that changes a submodule on both sides.
func (r Repo) checkMergeable(ctx context.Context, head, commit string) error {
	out, err := r.listing(ctx, 1, "merge-tree", "--write-tree", "--name-only", "--no-messages", "-z", head, commit)
	if err != nil {
		return err
	}
	if out != nil {
		// exit 1: the tree id, then each conflicted path, NUL-terminated
		return conflict(out[min(1, len(out)):])
	}
	base, err := r.git(ctx, "merge-base", head, commit)
	if err != nil {
		return err
	}
	ours, err := r.changedPaths(ctx, base, head)
	if err != nil {
		return err
	}
	theirs, err := r.changedPaths(ctx, base, commit)
	if err != nil {
		return err
	}
	var both []string
	for path, linkOurs := range ours {
		if linkTheirs, ok := theirs[path]; ok && (linkOurs || linkTheirs) {
			both = append(both, path)
		}
	}
	if len(both) > 0 {
		sort.Strings(both)
		return conflict(both)
	}
	return nil
}

// listing runs a git command that prints NUL-terminated fields, up to
// maxListingBytes. It returns the fields when git exits with want (nil
// when it exits 0), and an error for any other exit or a longer listing.
func (r Repo) listing(ctx context.Context, want int, args ...string) ([]string, error) {
	out, code, err := r.gitRaw(ctx, maxListingBytes, args...)
	switch {
	case err != nil:
		return nil, err
	case code != 0 && code != want:
		return nil, &SandboxGitError{Sub: args[0], Where: r.name, Code: code, Stderr: out.stderr}
	case out.truncated:
		return nil, fmt.Errorf("git %s in %s: output longer than %d bytes", args[0], r.name, maxListingBytes)
	case code == 0 && want != 0:
		return nil, nil
	}
	return strings.Split(strings.TrimSuffix(out.stdout, "\x00"), "\x00"), nil
}

// changedPaths lists the paths that differ between two commits, each
// with whether a gitlink is on either side.
func (r Repo) changedPaths(ctx context.Context, from, to string) (map[string]bool, error) {
	fields, err := r.listing(ctx, 0, "diff-tree", "-r", "-z", "--no-renames", from, to)
	if err != nil {
		return nil, err
	}
	paths := map[string]bool{}
	if len(fields) == 1 && fields[0] == "" {
		return paths, nil
	}
	if len(fields)%2 != 0 {
		return nil, fmt.Errorf("git diff-tree in %s: unexpected output", r.name)
	}
	for i := 0; i < len(fields); i += 2 {
		// ":<old mode> <new mode> <old id> <new id> <status>", then the path
		meta := strings.Fields(strings.TrimPrefix(fields[i], ":"))
		if len(meta) < 2 {
			return nil, fmt.Errorf("git diff-tree in %s: unexpected output", r.name)
		}
		paths[fields[i+1]] = meta[0] == gitlinkMode || meta[1] == gitlinkMode
	}
	return paths, nil
}

// conflict names up to maxConflictPaths paths, quoted with control
// characters escaped: the names come from a sandbox.
func conflict(paths []string) error {
	var named []string
	for _, p := range paths {
		if p == "" {
			continue
		}
		if len(named) == maxConflictPaths {
			named = append(named, "...")
			break
		}
		named = append(named, fmt.Sprintf("%q", p))
	}
	if len(named) == 0 {
		named = []string{"(unnamed paths)"}
	}
	return &ConflictError{Paths: strings.Join(named, ", ")}
}

// IgnoredEntries lists the git-ignored, untracked entries of r's work
// tree (a sandbox repository): files, and directories that hold only
// ignored files as one entry with a trailing "/".
func IgnoredEntries(ctx context.Context, r Repo) ([]string, error) {
	if r.run == nil {
		return nil, errors.New("gitx: IgnoredEntries runs only inside a sandbox")
	}
	fields, err := r.listing(ctx, 0, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory")
	if err != nil {
		return nil, err
	}
	if len(fields) == 1 && fields[0] == "" {
		return nil, nil
	}
	return fields, nil
}
