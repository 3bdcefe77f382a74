// Package gitx is the one way agentbox touches git: small operations
// through the git command line, with a fixed environment (no prompts, no
// user or system config, no hooks) and git's stderr trimmed into errors.
//
// Repositories a sandbox can write are untrusted: their config can name
// filter commands that `git status` runs. Query such a repository inside
// its sandbox, or only fetch from it (upload-pack honours none of those).
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
	full := append(append([]string{}, safeConfig...), config...)
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Dir = dir
	cmd.Env = gitEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", commandError(ctx, args, stderr.Bytes(), err)
	}
	return strings.TrimSpace(stdout.String()), nil
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

// CheckBranchName reports whether name is a valid branch name for git.
func CheckBranchName(ctx context.Context, name string) error {
	if err := checkArg("branch", name); err != nil {
		return err
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

// IsClean reports whether repo's work tree and index match HEAD; untracked
// files count as dirty, ignored files do not, nor do changes inside a
// submodule's own work tree (a changed submodule commit does count).
//
// It is safe on a repository a sandbox wrote: the filter drivers its
// config names (which `git status` would run on changed files) are
// switched off for the call, and submodules, whose config is not checked,
// are not entered. A file that depends on a filter may then read as dirty.
func IsClean(ctx context.Context, repo string) (bool, error) {
	noFilters, err := filterOverrides(ctx, repo)
	if err != nil {
		return false, err
	}
	out, err := runWithConfig(ctx, repo, noFilters, "status", "--porcelain=v1", "--untracked-files=all", "--ignore-submodules=dirty")
	if err != nil {
		return false, err
	}
	return out == "", nil
}

// filterOverrides returns "-c" settings that disable every filter driver
// repo's config (includes followed) defines. Reading config runs nothing.
func filterOverrides(ctx context.Context, repo string) ([]string, error) {
	out, err := run(ctx, repo, "config", "--null", "--name-only", "--get-regexp", `^filter\.`)
	if exitCode(err) == 1 { // no filter keys at all
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var overrides []string
	for _, key := range strings.Split(out, "\x00") {
		if key == "" {
			continue
		}
		dot := strings.LastIndexByte(key, '.')
		driver := key[len("filter."):max(dot, len("filter."))]
		if seen[driver] {
			continue
		}
		seen[driver] = true
		// "-c" splits at the first "=": a driver name holding one cannot
		// be overridden, so such a repository is refused.
		if strings.ContainsAny(driver, "=\n") {
			return nil, fmt.Errorf("%w: repository config names filter driver %q", ErrInvalidArgument, driver)
		}
		for _, k := range []string{"clean=", "smudge=", "process=", "required=false"} {
			overrides = append(overrides, "-c", "filter."+driver+"."+k)
		}
	}
	return overrides, nil
}

// Clone makes dst a fresh, independent clone of the repository at src
// (a host path) with branch checked out at commit; an empty commit means
// the tip of branch in src. Objects are copied, never hardlinked or shared
// through alternates: whoever writes dst must not reach src's objects.
func Clone(ctx context.Context, src, dst, branch, commit string) error {
	if err := checkArg("source", src); err != nil {
		return err
	}
	if err := checkArg("destination", dst); err != nil {
		return err
	}
	if err := CheckBranchName(ctx, branch); err != nil {
		return err
	}
	if commit == "" {
		sha, err := ResolveCommit(ctx, src, "refs/heads/"+branch)
		if err != nil {
			return fmt.Errorf("branch %q in source: %w", branch, err)
		}
		commit = sha
	} else if !shaPattern.MatchString(commit) {
		return fmt.Errorf("%w: commit %q is not a full object id", ErrInvalidArgument, commit)
	}
	if _, err := run(ctx, "", "clone", "--quiet", "--no-hardlinks", "--no-checkout", "--", src, dst); err != nil {
		return err
	}
	// A commit no ref of src reaches may be missing from the clone.
	if _, err := run(ctx, dst, "cat-file", "-e", commit+"^{commit}"); err != nil {
		if _, err := run(ctx, dst, "fetch", "--quiet", "--no-tags", "origin", commit); err != nil {
			return err
		}
	}
	if _, err := run(ctx, dst, "checkout", "--quiet", "-B", branch, commit, "--"); err != nil {
		return err
	}
	// The clone's origin names the host repository's path, which a sandbox
	// must not learn; commits move through the broker, not through origin.
	_, err := run(ctx, dst, "remote", "remove", "origin")
	return err
}

// Fetch fetches srcRef (a full ref, or HEAD) from srcURL into dstRef of dstRepo, replacing what
// dstRef held (it is a ref the caller owns, such as refs/jailbee/...), and
// returns the commit dstRef now names. srcURL is a path or a URL a backend
// produced (ext:: is allowed when srcURL itself is ext::, for container
// backends): never pass one that came from a sandbox.
//
// dstRepo's config steers the fetch (url.*.insteadOf can redirect srcURL):
// dstRepo must be a repository the host owns. To move commits into a
// sandbox's repository, run the fetch inside the sandbox instead.
func Fetch(ctx context.Context, dstRepo, srcURL, srcRef, dstRef string) (string, error) {
	if err := checkArg("source url", srcURL); err != nil {
		return "", err
	}
	if srcRef != "HEAD" { // the source's checked-out commit
		if err := checkFullRef(ctx, "source ref", srcRef); err != nil {
			return "", err
		}
	}
	if err := checkFullRef(ctx, "destination ref", dstRef); err != nil {
		return "", err
	}
	var config []string
	if strings.HasPrefix(srcURL, "ext::") {
		config = []string{"-c", "protocol.ext.allow=always"}
	}
	if _, err := runWithConfig(ctx, dstRepo, config,
		"fetch", "--quiet", "--no-tags", "--no-write-fetch-head",
		"--no-recurse-submodules", "--no-auto-gc", "--",
		srcURL, "+"+srcRef+":"+dstRef); err != nil {
		return "", err
	}
	return ResolveCommit(ctx, dstRepo, dstRef)
}
