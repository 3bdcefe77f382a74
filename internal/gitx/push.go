package gitx

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"
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
}

// PushBranch pushes the commit localRef names in r (the user's own
// repository on the host, e.g. a child's imported ref) to refs/heads/branch
// of remoteURL (an https, http or file URL without credentials), as a
// fast-forward only: a branch that moved elsewhere is ErrNotFastForward, a
// remote rule ErrPushRefused. Other errors leave open whether the branch
// was updated. No hook runs; the token is never in an error.
func (r Repo) PushBranch(ctx context.Context, remoteURL, localRef, branch string, auth PushAuth) error {
	if r.run != nil {
		return fmt.Errorf("%w: PushBranch runs on the host's repository only", ErrInvalidArgument)
	}
	if err := checkRemoteURL(remoteURL); err != nil {
		return err
	}
	if err := checkFullRef(ctx, "ref", localRef); err != nil {
		return err
	}
	if err := CheckBranchName(ctx, branch); err != nil {
		return err
	}
	commit, err := ResolveCommit(ctx, r.dir, localRef)
	if err != nil {
		return err
	}
	dst := "refs/heads/" + branch
	cmd := gitCommand(ctx, nil, r.dir, pushConfig,
		"push", "--porcelain", "--no-verify", "--end-of-options", remoteURL, commit+":"+dst)
	credentials := ""
	if auth.Token != "" {
		credentials = base64.StdEncoding.EncodeToString([]byte("x-access-token:" + auth.Token))
		header := "Authorization: Basic " + credentials
		// Scoped to the remote: should the repository's own config rewrite
		// the URL (url.*.insteadOf), the header does not follow.
		cmd.Env = append(cmd.Env, "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http."+remoteURL+".extraHeader", "GIT_CONFIG_VALUE_0="+header)
	}
	var stdout, stderr boundedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if runErr == nil {
		return nil
	}
	if err := rejection(stdout.String(), dst); err != nil {
		return err
	}
	// The remote's messages are in git's stderr: the secrets go before it
	// is cut (a cut could leave part of one), the rest made printable.
	msg := printable(redact(stderr.String(), auth.Token, credentials))
	return commandError(ctx, []string{"push"}, []byte(msg), runErr)
}

// rejection reads git push --porcelain's line for dst: a rejected
// non-fast-forward or a remote refusal; nil for anything else.
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
		if strings.HasPrefix(summary, "[remote rejected]") {
			return ErrPushRefused
		}
		return ErrNotFastForward
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
