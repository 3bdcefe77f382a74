// Package gitx is the one way agentbox touches git, through the git
// command line.
//
// Host git runs only on the user's own repository (the one named with
// `jb new --repo`), with a fixed environment: no prompts, no user or
// system config, no hooks, git's stderr trimmed into errors. A repository
// a sandbox can write is never opened by a git process on the host: its
// config, hooks, filters and work tree are the sandbox's own business.
// Every git command on it runs inside its sandbox (SandboxRepo, through
// the backend's Exec), and commits move between repositories through a
// pipe the broker holds (Transfer): `git upload-pack` where the source
// lives, `git fetch` where the destination lives.
package gitx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"

	"agentbox/internal/untrusted"
)

// maxStderrBytes bounds how much of git's stderr an error carries: enough
// for git's one-line fatal messages, not a dump.
const maxStderrBytes = 1024

// ErrDetachedHead reports a repository whose HEAD is not on a branch.
var ErrDetachedHead = errors.New("HEAD is detached")

// ErrUnknownRevision reports a revision that names no commit in the repository.
var ErrUnknownRevision = errors.New("unknown revision")

// ErrInvalidArgument reports a ref, revision or branch gitx refuses to
// hand to git (empty, option-like or malformed).
var ErrInvalidArgument = errors.New("invalid git argument")

// shaPattern is a full object name (SHA-1 or SHA-256).
var shaPattern = regexp.MustCompile(`^(?:[0-9a-f]{40}|[0-9a-f]{64})$`)

// safeConfig is passed to every git call (and, through git's own
// GIT_CONFIG_PARAMETERS, to the git processes it starts): hooks, fsmonitor
// and alternate-refs commands would run what the repository chose; ext::
// stays off unless Fetch is handed an ext:: URL; never a pager or prompt.
var safeConfig = []string{
	"-c", "core.hooksPath=/dev/null",
	"-c", "core.fsmonitor=false",
	"-c", "core.alternateRefsCommand=true",
	"-c", "protocol.ext.allow=never",
	"-c", "core.pager=cat",
	"-c", "credential.helper=",
	// The user's repository may belong to another uid than a root broker;
	// the commands gitx runs on it honour none of its command-running keys.
	"-c", "safe.directory=*",
}

// gitEnv is the environment of every git call: the process's own minus
// any GIT_* variable (a GIT_DIR inherited from a hook would redirect every
// call), plus the settings that make git non-interactive and deterministic.
func gitEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GIT_") || strings.HasPrefix(kv, "LC_ALL=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"GIT_TERMINAL_PROMPT=0",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_ASKPASS=/bin/false",
		"GIT_PAGER=cat",
		"LC_ALL=C",
	)
}

// run runs git with args in dir and returns its trimmed stdout.
func run(ctx context.Context, dir string, args ...string) (string, error) {
	return runWithConfig(ctx, dir, nil, args...)
}

// runWithConfig is run with extra "-c key=value" settings for this call.
func runWithConfig(ctx context.Context, dir string, config []string, args ...string) (string, error) {
	return runAs(ctx, nil, dir, config, args...)
}

// runAsOwner is run as the owner of the repository at dir
// (ownerCredential): what it writes there stays the user's.
func runAsOwner(ctx context.Context, dir string, args ...string) (string, error) {
	return runAs(ctx, ownerCredential(dir), dir, nil, args...)
}

// runAs is runWithConfig with the process's attributes (nil: the broker's).
func runAs(ctx context.Context, attr *syscall.SysProcAttr, dir string, config []string, args ...string) (string, error) {
	cmd := gitCommand(ctx, attr, dir, config, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", commandError(ctx, args, stderr.Bytes(), err)
	}
	return strings.TrimSpace(stdout.String()), nil
}

// gitCommand is host git with args in dir: safeConfig, then config, then
// args; gitEnv; the process's attributes attr (nil: the broker's).
func gitCommand(ctx context.Context, attr *syscall.SysProcAttr, dir string, config []string, args ...string) *exec.Cmd {
	full := append(append([]string{}, safeConfig...), config...)
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Dir = dir
	cmd.Env = gitEnv()
	cmd.SysProcAttr = attr
	return cmd
}

// commandError names the git subcommand and carries git's own message,
// bounded; a cancelled context wins over the exit status it caused.
func commandError(ctx context.Context, args []string, stderr []byte, err error) error {
	sub := "git"
	if len(args) > 0 {
		sub = "git " + args[0]
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", sub, ctxErr)
	}
	msg := strings.TrimSpace(string(stderr))
	if len(msg) > maxStderrBytes {
		msg = msg[:maxStderrBytes] + "..."
	}
	if msg == "" {
		return fmt.Errorf("%s: %w", sub, err)
	}
	return fmt.Errorf("%s: %w: %s", sub, err, msg)
}

// checkArg refuses values git would read as options or that are empty.
func checkArg(what, v string) error {
	if v == "" || strings.HasPrefix(v, "-") || strings.ContainsAny(v, "\x00\n") {
		return fmt.Errorf("%w: %s %q", ErrInvalidArgument, what, v)
	}
	return nil
}

// CheckBranchName reports whether name is a valid branch name for git,
// and one a terminal shows as it is: git takes any byte from 0x80 on, so
// invalid UTF-8, C1 controls (U+009B is a CSI) and format characters
// (bidi overrides, zero-width) are refused here. A sandbox names its own
// branches, which the host's refs, logs and output show.
func CheckBranchName(ctx context.Context, name string) error {
	if err := checkArg("branch", name); err != nil {
		return err
	}
	if !utf8.ValidString(name) || strings.ContainsFunc(name, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) {
		return fmt.Errorf("%w: branch %q", ErrInvalidArgument, name)
	}
	if _, err := run(ctx, "", "check-ref-format", "--branch", name); err != nil {
		return fmt.Errorf("%w: branch %q", ErrInvalidArgument, name)
	}
	return nil
}

// checkFullRef accepts only full refs ("refs/...") that git considers well formed.
func checkFullRef(ctx context.Context, what, ref string) error {
	if err := checkArg(what, ref); err != nil {
		return err
	}
	if !strings.HasPrefix(ref, "refs/") {
		return fmt.Errorf("%w: %s %q is not a full ref", ErrInvalidArgument, what, ref)
	}
	if _, err := run(ctx, "", "check-ref-format", ref); err != nil {
		return fmt.Errorf("%w: %s %q", ErrInvalidArgument, what, ref)
	}
	return nil
}

// CurrentBranch returns the short name of the branch HEAD points to, or
// ErrDetachedHead.
func CurrentBranch(ctx context.Context, repo string) (string, error) {
	// symbolic-ref exits 1 quietly on a detached HEAD; anything else is a
	// real failure (not a repository, ...), told apart by rev-parse below.
	out, err := run(ctx, repo, "symbolic-ref", "--quiet", "--short", "HEAD")
	if exitCode(err) == 1 {
		return "", ErrDetachedHead
	}
	return out, err
}

// exitCode is git's exit status behind err, or -1.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// HeadCommit returns the full commit id HEAD points to.
func HeadCommit(ctx context.Context, repo string) (string, error) {
	return ResolveCommit(ctx, repo, "HEAD")
}

// ResolveCommit returns the full id of the commit rev names in repo.
func ResolveCommit(ctx context.Context, repo, rev string) (string, error) {
	if err := checkArg("revision", rev); err != nil {
		return "", err
	}
	out, err := run(ctx, repo, "rev-parse", "--verify", "--quiet", "--end-of-options", rev+"^{commit}")
	if exitCode(err) == 1 { // --quiet: exit 1 and no message for a missing rev
		return "", fmt.Errorf("%w: %q", ErrUnknownRevision, rev)
	}
	return out, err
}

// ErrNotRepository reports a host path that is not a git repository.
var ErrNotRepository = errors.New("not a git repository")

// RepoRoot returns the top level of the repository at path on the host
// (the repository itself when it is bare), or an error wrapping
// os.ErrNotExist (no such directory) or ErrNotRepository.
func RepoRoot(ctx context.Context, path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%w: not a directory", ErrNotRepository)
	}
	bare, err := run(ctx, path, "rev-parse", "--is-bare-repository")
	if err != nil {
		return "", ErrNotRepository
	}
	if bare == "true" {
		return run(ctx, path, "rev-parse", "--absolute-git-dir")
	}
	return run(ctx, path, "rev-parse", "--show-toplevel")
}

// PRRefPrefix is where FetchPR keeps a fetched pull request's head in the
// user's repository: PRRefPrefix + <number>.
const PRRefPrefix = "refs/jailbee/pr/"

// FetchPR fetches refs/pull/<pr>/head from remote into repo (the user's
// own repository) at PRRefPrefix<pr> and returns its commit. The remote
// is the user's, but a pull request's objects are its author's: they are
// checked as an untrusted remote's and fetched under the same memory
// bound as a sandbox's (untrustedFetch), and git runs as the repository's
// owner, so what it writes there stays the user's.
func FetchPR(ctx context.Context, repo, remote string, pr int) (string, error) {
	if pr <= 0 {
		return "", fmt.Errorf("%w: pull request %d", ErrInvalidArgument, pr)
	}
	if err := checkArg("remote", remote); err != nil {
		return "", err
	}
	ref := fmt.Sprintf("%s%d", PRRefPrefix, pr)
	spec := fmt.Sprintf("+refs/pull/%d/head:%s", pr, ref)
	cmd := untrustedFetch(ctx, repo, nil, "--end-of-options", remote, spec)
	stderr := &untrusted.Buffer{Max: maxOutputBytes} // the remote's messages, the author's ref names
	cmd.Stderr = stderr
	if err := cmd.Run(); err != nil {
		return "", commandError(ctx, []string{"fetch"}, []byte(stderrText(stderr)), err)
	}
	return ResolveCommit(ctx, repo, ref)
}
