package gitx

import "context"

// RemoteURL returns the URL of remote in the host repository repo, "" when
// it has none.
func RemoteURL(ctx context.Context, repo, remote string) string {
	if checkArg("remote", remote) != nil {
		return ""
	}
	out, err := run(ctx, repo, "config", "--get", "remote."+remote+".url")
	if err != nil {
		return ""
	}
	return out
}
