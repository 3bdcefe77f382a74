package gitx

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"agentbox/internal/untrusted"
)

// PushAuth is how PushBranch authenticates to the forge's git remote.
type PushAuth struct {
	// Token is the host's forge token ("": none, for a file:// remote).
	// It reaches git through its environment as an HTTP header, never in
	// argv or the URL.
	Token string
}

// ErrNotFastForward reports a push refused because the remote branch has
// commits the pushed commit does not contain: PushBranch never forces.
// Nothing was changed.
var ErrNotFastForward = errors.New("the remote branch has commits the pushed one does not contain (not a fast-forward); never forced")

// ErrPushRefused reports a push the remote itself refused (a protected
// branch, a rule, a hook). Nothing was changed.
var ErrPushRefused = errors.New("the remote refused the push")

// pushConfig hardens a push beyond safeConfig: only http(s) and file
// transports, no redirect that could carry the token elsewhere, no
// signing or submodule pushes the user's config might ask for.
var pushConfig = []string{
	"-c", "protocol.allow=never",
	"-c", "protocol.https.allow=always",
	"-c", "protocol.http.allow=always",
	"-c", "protocol.file.allow=always",
	"-c", "http.followRedirects=false",
	"-c", "push.gpgSign=false",
	"-c", "push.recurseSubmodules=no",
	// The pushed objects are a sandbox's. pack-objects sends a pack's
	// whole objects as they are (measured: 6 MiB of memory to send ten
	// blobs of 100 MiB of zeros); one it must deltify (with
	// --no-reuse-object: 1.2 GiB) is inflated whole, up to
	// core.bigFileThreshold (512 MiB), in a window of 10 per thread, one
	// thread per CPU. Should any be so searched: blobs past 16 MiB are
	// sent as they are, the window holds at most 256 MiB, one thread
	// looks, and boundedHostGit bounds the heap.
	"-c", "core.bigFileThreshold=16m",
	"-c", "pack.windowMemory=256m",
	"-c", "pack.threads=1",
}

// ErrBranchMoved reports a leased push (PushBranchFrom) refused because
// the remote branch is not where the caller expected it: nothing was
// changed.
var ErrBranchMoved = errors.New("the remote branch is not where this push expected it")

// PushBranch pushes the commit localRef names in r (the user's own
// repository on the host, e.g. a child's imported ref) to refs/heads/branch
// of remoteURL (an https, http or file URL without credentials), as a
// fast-forward only: a branch that moved elsewhere is ErrNotFastForward, a
// remote rule ErrPushRefused. Other errors leave open whether the branch
// was updated. No hook runs; the token is never in an error.
func (r Repo) PushBranch(ctx context.Context, remoteURL, localRef, branch string, auth PushAuth) error {
	_, err := r.push(ctx, remoteURL, localRef, branch, nil, auth)
	return err
}

// PushBranchFrom is PushBranch for a branch the remote must have at from,
// or not at all (from ""): a remote branch anywhere else, including one
// made since the caller looked, is ErrBranchMoved (git's
// --force-with-lease, checked on the remote as it updates). from must be
// an ancestor of the pushed commit, so the push is still a fast-forward.
// A remote branch already at the commit is no change: moved reports
// whether the push changed the remote branch.
func (r Repo) PushBranchFrom(ctx context.Context, remoteURL, localRef, branch, from string, auth PushAuth) (moved bool, err error) {
	return r.push(ctx, remoteURL, localRef, branch, &from, auth)
}

// push is PushBranch, leased to *from when from is not nil.
func (r Repo) push(ctx context.Context, remoteURL, localRef, branch string, from *string, auth PushAuth) (bool, error) {
	if r.run != nil {
		return false, fmt.Errorf("%w: PushBranch runs on the host's repository only", ErrInvalidArgument)
	}
	if err := checkRemoteURL(remoteURL); err != nil {
		return false, err
	}
	if err := checkFullRef(ctx, "ref", localRef); err != nil {
		return false, err
	}
	if err := CheckBranchName(ctx, branch); err != nil {
		return false, err
	}
	commit, err := ResolveCommit(ctx, r.dir, localRef)
	if err != nil {
		return false, err
	}
	dst := "refs/heads/" + branch
	args := []string{"push", "--porcelain", "--no-verify"}
	if from != nil {
		if *from != "" {
			if !shaPattern.MatchString(*from) {
				return false, fmt.Errorf("%w: lease %q is not a full object id", ErrInvalidArgument, *from)
			}
			// The lease lets git move the branch from *from to anything:
			// only a descendant keeps it a fast-forward.
			_, err := run(ctx, r.dir, "merge-base", "--is-ancestor", *from, commit)
			if exitCode(err) == 1 {
				return false, ErrNotFastForward
			}
			if err != nil {
				return false, err
			}
		}
		args = append(args, "--force-with-lease="+dst+":"+*from)
	}
	// Ended whole: killing git push alone left its git-remote-http running.
	cmd := boundedHostGit(ctx, nil, r.dir, pushConfig, append(args, "--end-of-options", remoteURL, commit+":"+dst)...)
	credentials := ""
	if auth.Token != "" {
		credentials = base64.StdEncoding.EncodeToString([]byte("x-access-token:" + auth.Token))
		header := "Authorization: Basic " + credentials
		// Scoped to the remote: should the repository's own config rewrite
		// the URL (url.*.insteadOf), the header does not follow.
		cmd.Env = append(cmd.Env, "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http."+remoteURL+".extraHeader", "GIT_CONFIG_VALUE_0="+header)
	}
	stdout, stderr := output(0), output(0)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	runErr := cmd.Run()
	if runErr == nil {
		return updated(stdout.String(), dst), nil
	}
	if err := rejection(stdout.String(), dst); err != nil {
		return false, err
	}
	// The remote's messages are in git's stderr: the secrets go before it
	// is cut (a cut could leave part of one), the rest made printable.
	msg := untrusted.Printable(redact(stderr.String(), auth.Token, credentials))
	return false, commandError(ctx, []string{"push"}, []byte(msg), runErr)
}

// updated reads git push --porcelain's line for dst: whether the remote
// branch was made (*) or moved ( , +), not found where it was already (=).
// Anything unexpected is no move: a caller records a move as its own.
func updated(porcelain, dst string) bool {
	for line := range strings.SplitSeq(porcelain, "\n") {
		flag, rest, ok := strings.Cut(line, "\t")
		refs, _, _ := strings.Cut(rest, "\t")
		if ok && strings.HasSuffix(refs, ":"+dst) {
			return flag == "*" || flag == " " || flag == "+"
		}
	}
	return false
}

// rejection reads git push --porcelain's line for dst: a rejected
// non-fast-forward, a remote refusal or a lease that no longer holds; nil
// for anything else, which the caller reports as a failure it cannot be
// sure of: "[remote failure] (remote failed to report status)" is a
// remote that may have applied the update.
func rejection(porcelain, dst string) error {
	for line := range strings.SplitSeq(porcelain, "\n") {
		flag, rest, ok := strings.Cut(line, "\t")
		if !ok || flag != "!" {
			continue
		}
		refs, summary, _ := strings.Cut(rest, "\t")
		if !strings.HasSuffix(refs, ":"+dst) {
			continue
		}
		switch {
		case strings.HasPrefix(summary, "[remote rejected]"):
			return ErrPushRefused
		case strings.HasPrefix(summary, "[rejected] (stale info)"):
			return ErrBranchMoved
		case strings.HasPrefix(summary, "[rejected]"):
			return ErrNotFastForward
		}
		return nil
	}
	return nil
}

// checkRemoteURL accepts an https, http or file URL without credentials,
// query or fragment.
func checkRemoteURL(remote string) error {
	if err := checkArg("remote", remote); err != nil {
		return err
	}
	u, err := url.Parse(remote)
	ok := err == nil && u.User == nil && u.RawQuery == "" && u.Fragment == "" && !strings.ContainsAny(remote, "?#")
	switch {
	case !ok:
	case u.Scheme == "https" || u.Scheme == "http":
		ok = u.Host != ""
	case u.Scheme == "file":
		ok = u.Host == "" && strings.HasPrefix(u.Path, "/")
	default:
		ok = false
	}
	if !ok {
		return fmt.Errorf("%w: the remote must be an https, http or file URL without credentials", ErrInvalidArgument)
	}
	return nil
}

// redact is s with each non-empty secret replaced.
func redact(s string, secrets ...string) string {
	for _, secret := range secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	return s
}

// SetRef points ref (a full ref) at commit in r, the user's repository on
// the host, as the repository's owner.
func (r Repo) SetRef(ctx context.Context, ref, commit string) error {
	if r.run != nil {
		return fmt.Errorf("%w: SetRef runs on the host's repository only", ErrInvalidArgument)
	}
	if err := checkFullRef(ctx, "ref", ref); err != nil {
		return err
	}
	if !shaPattern.MatchString(commit) {
		return fmt.Errorf("%w: commit %q is not a full object id", ErrInvalidArgument, commit)
	}
	_, err := runAsOwner(ctx, r.dir, "update-ref", "--no-deref", ref, commit)
	return err
}
