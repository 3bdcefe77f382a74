package gitx

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"agentbox/internal/serial"
	"agentbox/internal/untrusted"
)

// Bounds of git inside sandboxes.
const (
	// MaxTransferBytes bounds what one Transfer carries from the source to
	// the destination (the pack and its protocol): a hostile source cannot
	// fill the destination's disk through the broker.
	MaxTransferBytes = 4 << 30
	// maxOutputBytes bounds what is read of a git command's output inside a
	// sandbox: a ref, a commit id, or the first lines of `git status`.
	maxOutputBytes = 64 << 10
	// maxListingBytes bounds a listing of changed paths (a merge's
	// checks): a larger one fails the merge rather than be half read.
	maxListingBytes = 16 << 20
	// MaxHostFetchMemory bounds the heap of host git fetching a sandbox's
	// objects (RLIMIT_DATA, inherited by its index-pack). A delta in a
	// pack declares the size of the object it makes, and git allocates
	// that whole: a pack of a few KiB can ask for any amount of the host's
	// memory. Stock git never deltifies a blob over core.bigFileThreshold
	// (512 MiB), so an honest pack needs a base and a result of at most
	// that per index-pack thread (3): this leaves room for them.
	MaxHostFetchMemory = 4 << 30
)

// ErrTransferTooLarge: the source sent more than the transfer's bound.
var ErrTransferTooLarge = errors.New("transfer larger than its bound")

// ErrTransferStalled: the source sent nothing for the transfer's idle
// bound. upload-pack sends a keepalive every 5 s while it prepares a pack
// (uploadpack.keepAlive), so a live source never goes that quiet.
var ErrTransferStalled = errors.New("the source sent nothing for too long")

// TransferIdleTimeout is the default idle bound of a transfer: a source
// that sends nothing for this long (it stopped its upload-pack, say) fails
// the transfer instead of holding it to its overall deadline.
const TransferIdleTimeout = 60 * time.Second

// ClientName is the jailbee client's name on a sandbox's PATH: it carries
// the fetch side of a transfer (FetchMain).
const ClientName = "jailbee"

// Runner runs a command inside a sandbox (the backend's Exec) and returns
// its exit status.
type Runner interface {
	Run(ctx context.Context, c Cmd) (int, error)
}

// RunnerFunc adapts a function to Runner.
type RunnerFunc func(ctx context.Context, c Cmd) (int, error)

// Run calls f.
func (f RunnerFunc) Run(ctx context.Context, c Cmd) (int, error) { return f(ctx, c) }

// Cmd is one command for a Runner.
type Cmd struct {
	Argv   []string
	Dir    string
	Env    map[string]string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Started is called once the command runs with its own copies of its
	// streams (backend.ExecOptions.Started).
	Started func()
}

// Repo is a repository and where git runs on it: the user's own
// repository on the host, or a sandbox's repository inside the sandbox.
type Repo struct {
	run  Runner // nil: the host
	dir  string
	name string // for errors: "the repository" or the sandbox's name
}

// HostRepo is the user's own repository at path: host git, fixed safe
// environment.
func HostRepo(path string) Repo { return Repo{dir: path, name: "the repository"} }

// SandboxRepo is the repository at dir inside a sandbox (name, for
// errors): every git command runs there through run, under the sandbox's
// own config.
func SandboxRepo(name string, run Runner, dir string) Repo {
	return Repo{run: run, dir: dir, name: "`" + name + "`"}
}

// sandboxEnv is the environment of git inside a sandbox: deterministic
// output, never a prompt.
var sandboxEnv = map[string]string{
	"LC_ALL":              "C",
	"GIT_TERMINAL_PROMPT": "0",
	"GIT_PAGER":           "cat",
}

// git runs git with args in r and returns its stdout, trimmed (at most
// maxOutputBytes kept, the rest discarded so git can finish).
func (r Repo) git(ctx context.Context, args ...string) (string, error) {
	if r.run == nil {
		return run(ctx, r.dir, args...)
	}
	out, code, err := r.gitRaw(ctx, maxOutputBytes, args...)
	if err == nil && code != 0 {
		err = &SandboxGitError{Sub: args[0], Where: r.name, Code: code, Stderr: out.stderr}
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out.stdout), nil
}

// gitOutput is what a git command in a sandbox wrote.
type gitOutput struct {
	stdout    string // the first limit bytes
	truncated bool   // stdout was longer
	stderr    string // short, printable
}

// gitRaw runs git with args inside r's sandbox and returns its output and
// exit code, keeping at most limit bytes of stdout.
func (r Repo) gitRaw(ctx context.Context, limit int, args ...string) (gitOutput, int, error) {
	stdout, stderr := output(limit), output(0)
	code, err := r.run.Run(ctx, Cmd{
		Argv: append([]string{"git"}, args...), Dir: r.dir, Env: sandboxEnv,
		Stdout: stdout, Stderr: stderr,
	})
	if err != nil {
		return gitOutput{}, 0, fmt.Errorf("git %s in %s: %w", args[0], r.name, err)
	}
	return gitOutput{stdout: stdout.String(), truncated: stdout.Truncated(), stderr: stderrText(stderr)}, code, nil
}

// SandboxGitError is a git command that failed inside a sandbox. Stderr is
// what the sandbox's git printed: bounded, control characters replaced,
// still sandbox-controlled, so for logs only.
type SandboxGitError struct {
	Sub    string
	Where  string
	Code   int
	Stderr string
}

func (e *SandboxGitError) Error() string {
	return fmt.Sprintf("git %s in %s exited %d: %q", e.Sub, e.Where, e.Code, e.Stderr)
}

// output is a buffer for what git in a sandbox prints: the first limit
// bytes (0: maxOutputBytes) kept, every byte counted.
func output(limit int) *untrusted.Buffer {
	return &untrusted.Buffer{Max: cmp.Or(limit, maxOutputBytes)}
}

// stderrText is what an error carries of git's stderr: short, printable.
func stderrText(b *untrusted.Buffer) string {
	s := b.String()
	if len(s) > maxStderrBytes {
		s = s[:maxStderrBytes] + "..."
	}
	return untrusted.Printable(strings.TrimSpace(s))
}

// Head returns the branch HEAD is on ("" when detached) and the commit it
// names. A sandbox may answer anything: both are checked for shape.
func Head(ctx context.Context, r Repo) (branch, commit string, err error) {
	commit, err = r.git(ctx, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
	if err != nil {
		return "", "", err
	}
	if !shaPattern.MatchString(commit) {
		return "", "", fmt.Errorf("git rev-parse in %s: not a commit id", r.name)
	}
	branch, err = r.git(ctx, "symbolic-ref", "--quiet", "--short", "HEAD")
	var ge *SandboxGitError
	if errors.As(err, &ge) && ge.Code == 1 {
		return "", commit, nil // detached
	}
	if err != nil {
		return "", "", err
	}
	if err := CheckBranchName(ctx, branch); err != nil {
		return "", "", fmt.Errorf("git symbolic-ref in %s: not a branch name", r.name)
	}
	return branch, commit, nil
}

// RevParse returns the commit rev names in r: a full ref (refs/...) or a
// full object id, nothing git would read as an option.
func RevParse(ctx context.Context, r Repo, rev string) (string, error) {
	if !strings.HasPrefix(rev, "refs/") && !shaPattern.MatchString(rev) {
		return "", fmt.Errorf("%w: %q is neither a full ref nor an object id", ErrInvalidArgument, rev)
	}
	if err := checkArg("revision", rev); err != nil {
		return "", err
	}
	out, err := r.git(ctx, "rev-parse", "--verify", "--quiet", "--end-of-options", rev+"^{commit}")
	if err != nil {
		return "", err
	}
	if !shaPattern.MatchString(out) {
		return "", fmt.Errorf("git rev-parse in %s: not a commit id", r.name)
	}
	return out, nil
}

// IsClean reports whether r's work tree and index match HEAD; untracked
// files count as dirty, ignored files do not, nor do changes inside a
// submodule's own work tree.
func IsClean(ctx context.Context, r Repo) (bool, error) {
	if r.run == nil {
		return false, errors.New("gitx: IsClean runs only inside a sandbox")
	}
	stdout, stderr := output(0), output(0)
	code, err := r.run.Run(ctx, Cmd{
		Argv: []string{"git", "status", "--porcelain=v1", "--untracked-files=all", "--ignore-submodules=dirty"},
		Dir:  r.dir, Env: sandboxEnv, Stdout: stdout, Stderr: stderr,
	})
	if err != nil {
		return false, fmt.Errorf("git status in %s: %w", r.name, err)
	}
	if code != 0 {
		return false, &SandboxGitError{Sub: "status", Where: r.name, Code: code, Stderr: stderrText(stderr)}
	}
	return stdout.Total() == 0, nil
}

// TransferOptions tune a Transfer.
type TransferOptions struct {
	// MaxBytes bounds the bytes from the source; 0 is MaxTransferBytes.
	MaxBytes int64
	// Init makes the destination an empty repository first (a new
	// sandbox's checkout), and Checkout, when set, puts its HEAD on that
	// branch at the commit afterwards: one command in the destination
	// instead of three (on Incus each costs 70-80 ms).
	Init     bool
	Checkout string
	// Common, for a transfer into the user's repository: commits (or
	// refs) the source already has; only their history is offered to it
	// as common ground, and those the repository lacks are left out.
	Common []string
	// IdleTimeout bounds a pause of the source; 0 is TransferIdleTimeout.
	IdleTimeout time.Duration
	// Carried, when set, receives how many bytes the source sent (at
	// most MaxBytes+1), whether the transfer succeeded or not.
	Carried *int64
}

// Transfer makes commit (with its history) available in dst at dstRef. The
// source's `git upload-pack` and the destination's `git fetch` (in a
// sandbox through the jailbee client's ext:: relay, FetchMain; on the
// host through fd::) are joined by pipes the
// caller's process holds: neither repository's config runs anywhere but
// where that repository lives. The source serves only what commit reaches
// (uploadPack), and no name of its refs: the destination's requests pass
// through filterRequests. The source or the destination
// may be the user's repository (fetchHost), not both.
func Transfer(ctx context.Context, src Repo, commit string, dst Repo, dstRef string, opts TransferOptions) error {
	if src.run == nil && dst.run == nil {
		return errors.New("gitx: Transfer joins a sandbox's repository to another")
	}
	if !shaPattern.MatchString(commit) {
		return fmt.Errorf("%w: commit %q is not a full object id", ErrInvalidArgument, commit)
	}
	if err := checkFullRef(ctx, "destination ref", dstRef); err != nil {
		return err
	}
	fetch, err := dst.fetcher(ctx, commit, dstRef, opts)
	if err != nil {
		return err
	}
	limit := opts.MaxBytes
	if limit <= 0 {
		limit = MaxTransferBytes
	}
	idle := opts.IdleTimeout
	if idle <= 0 {
		idle = TransferIdleTimeout
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// source stdout -> (bounded copy) -> destination stdin;
	// destination stdout -> (filterRequests) -> source stdin.
	fromSrc, srcOut, err := os.Pipe()
	if err != nil {
		return err
	}
	dstIn, toDst, err := os.Pipe()
	if err != nil {
		closeFiles(fromSrc, srcOut)
		return err
	}
	fromDst, dstOut, err := os.Pipe()
	if err != nil {
		closeFiles(fromSrc, srcOut, dstIn, toDst)
		return err
	}
	srcIn, toSrc, err := os.Pipe()
	if err != nil {
		closeFiles(fromSrc, srcOut, dstIn, toDst, fromDst, dstOut)
		return err
	}
	var wg, cmds sync.WaitGroup
	var copyErr, reqErr, srcErr, dstErr error
	// ended: both commands have; what the copies wait on then is only a
	// process either side left behind, and is cut (below).
	var ended atomic.Bool
	srcStderr, dstStderr := output(0), output(0)
	wg.Add(4)
	cmds.Add(2)
	go func() {
		defer wg.Done()
		defer closeFiles(fromDst, toSrc)
		// The source's upload-pack would honour more than a fetch of the
		// commit needs (its tags, a ref name to deepen from): only that
		// fetch's requests reach it.
		if err := filterRequests(toSrc, fromDst); errors.Is(err, ErrTransferRequestRefused) {
			reqErr = err
			cancel()
		}
	}()
	go func() {
		defer wg.Done()
		defer closeFiles(fromSrc, toDst)
		n, err := io.Copy(toDst, io.LimitReader(idleReader{fromSrc, idle}, limit+1))
		if opts.Carried != nil {
			*opts.Carried = n
		}
		switch {
		case n > limit:
			copyErr = fmt.Errorf("%w (%d bytes)", ErrTransferTooLarge, limit)
			cancel()
		case ended.Load():
			// Cut once both commands had ended: the destination has
			// what it took, and says whether that was enough.
		case errors.Is(err, os.ErrDeadlineExceeded):
			copyErr = fmt.Errorf("%w (%s)", ErrTransferStalled, idle)
			cancel()
		case err != nil:
			copyErr = err
		}
	}()
	go func() {
		defer wg.Done()
		defer cmds.Done()
		// Once a command holds its ends, ours are closed: each side then
		// sees the end of the other's stream when the other closes it.
		// A source that fails stops sending: the destination sees the end
		// of its stream. Not cancelled here: a destination that needed
		// nothing hangs up without a word, and upload-pack then fails.
		srcErr = src.uploadPack(ctx, commit, srcIn, srcOut, srcStderr, func() { closeFiles(srcIn, srcOut) })
		closeFiles(srcIn, srcOut)
	}()
	go func() {
		defer wg.Done()
		defer cmds.Done()
		dstErr = fetch(ctx, dstIn, dstOut, dstStderr, func() { closeFiles(dstIn, dstOut) })
		closeFiles(dstIn, dstOut)
		// Its requests end with it, whatever else of the destination's
		// (a process it left behind) still holds its stdout.
		fromDst.SetReadDeadline(time.Now())
		if dstErr != nil {
			cancel()
		}
	}()
	// Once both commands have ended, a process of a sandbox that still
	// holds a pipe's other end (it opened /proc/PID/fd/N of a command) must
	// not keep a copy waiting: one blocked writing to a pipe nobody reads
	// would hold the Transfer, and its caller, for ever. Closing our ends
	// wakes a blocked write; a past deadline wakes a read.
	go func() {
		cmds.Wait()
		ended.Store(true)
		fromSrc.SetReadDeadline(time.Now())
		fromDst.SetReadDeadline(time.Now())
		closeFiles(toSrc, toDst)
	}()
	// Nothing here needs the caller's turn (serial): it waits on the
	// processes of a sandbox, and on host git paced by them.
	serial.Outside(ctx, wg.Wait)
	switch {
	case errors.Is(copyErr, ErrTransferTooLarge), errors.Is(copyErr, ErrTransferStalled):
		return fmt.Errorf("transfer from %s to %s: %w", src.name, dst.name, copyErr)
	case reqErr != nil:
		return fmt.Errorf("transfer from %s to %s: %w", src.name, dst.name, reqErr)
	case dstErr != nil && srcErr != nil:
		return fmt.Errorf("transfer from %s to %s: %w (the source: %v)", src.name, dst.name, dstErr, srcErr)
	case dstErr != nil:
		return fmt.Errorf("transfer from %s to %s: %w", src.name, dst.name, dstErr)
	}
	// The destination checked that its ref names the commit: whatever the
	// source said of the way it ended, the transfer is done.
	return nil
}

// idleReader reads f with a deadline renewed at each read: a read that
// waits longer than idle fails with os.ErrDeadlineExceeded.
type idleReader struct {
	f    *os.File
	idle time.Duration
}

func (r idleReader) Read(p []byte) (int, error) {
	if err := r.f.SetReadDeadline(time.Now().Add(r.idle)); err != nil {
		return 0, err
	}
	return r.f.Read(p)
}

// fetchFunc runs the destination side of a Transfer on the given streams
// (started: as uploadPack's).
type fetchFunc func(ctx context.Context, stdin, stdout *os.File, stderr *untrusted.Buffer, started func()) error

// fetcher checks a Transfer's options for r and returns its destination
// side: `jailbee _git-fetch` in a sandbox, or host git (fetchHost).
func (r Repo) fetcher(ctx context.Context, commit, ref string, opts TransferOptions) (fetchFunc, error) {
	if r.run == nil {
		if opts.Init || opts.Checkout != "" {
			return nil, errors.New("gitx: a transfer to the host neither inits nor checks out")
		}
		return func(ctx context.Context, stdin, stdout *os.File, stderr *untrusted.Buffer, started func()) error {
			return r.fetchHost(ctx, commit, ref, opts.Common, stdin, stdout, stderr, started)
		}, nil
	}
	argv := []string{ClientName, fetchCommand}
	if opts.Init {
		argv = append(argv, "--init")
	}
	if opts.Checkout != "" {
		if err := CheckBranchName(ctx, opts.Checkout); err != nil {
			return nil, err
		}
		argv = append(argv, "--checkout", opts.Checkout)
	}
	argv = append(argv, commit, ref)
	return func(ctx context.Context, stdin, stdout *os.File, stderr *untrusted.Buffer, started func()) error {
		code, err := r.run.Run(ctx, Cmd{
			Argv: argv, Dir: r.dir, Env: sandboxEnv,
			Stdin: stdin, Stdout: stdout, Stderr: stderr, Started: started,
		})
		if err == nil && code != 0 {
			err = &SandboxGitError{Sub: "fetch", Where: r.name, Code: code, Stderr: stderrText(stderr)}
		}
		return err
	}, nil
}

// fetchHost is the destination side of a Transfer into the user's
// repository: host git fetches commit to ref through fd:: on the pipe to
// the source, a sandbox whose bytes are checked as git checks an untrusted
// remote's. Nothing but ref is written (no tag, no FETCH_HEAD), the
// source is offered as common ground only the history of the commits in
// common that the repository has (none: no negotiation), so it learns no
// other commit of the user's, and git runs as the repository's owner.
func (r Repo) fetchHost(ctx context.Context, commit, ref string, common []string, stdin, stdout *os.File, stderr *untrusted.Buffer, started func()) error {
	config := []string{"-c", "protocol.fd.allow=always", "-c", "protocol.version=0"}
	var tips []string
	for _, c := range common {
		if id, err := ResolveCommit(ctx, r.dir, c); err == nil {
			tips = append(tips, "--negotiation-tip="+id)
		}
	}
	if len(tips) == 0 {
		config = append(config, "-c", "fetch.negotiationAlgorithm=noop")
	}
	cmd := untrustedFetch(ctx, r.dir, config, append(tips, "fd::3,4", "+"+commit+":"+ref)...)
	cmd.ExtraFiles = []*os.File{stdin, stdout}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return commandError(ctx, []string{"fetch"}, nil, err)
	}
	started()
	if err := cmd.Wait(); err != nil {
		return commandError(ctx, []string{"fetch"}, []byte(stderrText(stderr)), err)
	}
	if got, err := ResolveCommit(ctx, r.dir, ref); err != nil || got != commit {
		return fmt.Errorf("git fetch: %s does not name the commit fetched", ref)
	}
	return nil
}

// untrustedFetch is host git fetching from a source whose objects are not
// trusted, into the repository at dir: `git fetch` with args, after
// safeConfig and config. The objects are checked as git checks an
// untrusted remote's (fetch.fsckObjects, with the paths no checkout may
// hold as errors) and kept as the pack they came
// in; nothing but the refspec's ref is written (no tag, no FETCH_HEAD, no
// submodule, no maintenance); git's heap is bounded by MaxHostFetchMemory;
// and git runs as the repository's owner (ownerCredential).
func untrustedFetch(ctx context.Context, dir string, config []string, args ...string) *exec.Cmd {
	checks := append(append([]string{}, config...),
		"-c", "fetch.fsckObjects=true", "-c", "fetch.unpackLimit=1",
		// git only warns of a tree entry named ".", ".." or ".git" (in
		// any case, or as NTFS and HFS+ read it) or holding a "/", and
		// refuses to check one out: such a tree is refused here.
		"-c", "fetch.fsck.hasDot=error", "-c", "fetch.fsck.hasDotdot=error",
		"-c", "fetch.fsck.hasDotgit=error", "-c", "fetch.fsck.fullPathname=error")
	return boundedHostGit(ctx, ownerCredential(dir), dir, checks, append([]string{"fetch", "--quiet", "--no-tags",
		"--no-write-fetch-head", "--no-recurse-submodules", "--no-auto-maintenance"}, args...)...)
}

// boundedHostGit is gitCommand (safeConfig, then config, then args) for a
// host git that reads objects a sandbox made: its heap (and that of every
// git it starts: index-pack, pack-objects) is bounded by
// MaxHostFetchMemory, and it ends whole on cancel (endsWholeOnCancel).
func boundedHostGit(ctx context.Context, attr *syscall.SysProcAttr, dir string, config []string, args ...string) *exec.Cmd {
	// Through sh, so that the limit holds from git's first instruction
	// (Go sets no rlimit on a child): ulimit -d is in KiB. It fails only
	// where a lower hard limit holds already.
	limited := append([]string{"-c", `ulimit -d "$0" 2>/dev/null; exec git "$@"`, strconv.Itoa(MaxHostFetchMemory >> 10)}, safeConfig...)
	limited = append(append(limited, config...), args...)
	cmd := exec.CommandContext(ctx, "/bin/sh", limited...)
	cmd.Dir, cmd.Env, cmd.SysProcAttr = dir, gitEnv(), attr
	endsWholeOnCancel(cmd)
	return cmd
}

// hostGitWaitDelay bounds how long a host git's Wait waits, once git is
// killed, for its output pipes to close: a backstop for a process outside
// its group still holding one.
const hostGitWaitDelay = 10 * time.Second

// endsWholeOnCancel makes cmd, a host git that a sandbox paces, end with
// every process it started when its context ends: git fetch runs its
// transport in a child (git remote-fd) that killing git alone leaves
// behind, blocked on the sandbox and holding git's stderr, so Wait, and
// the Transfer waiting on it, would never return.
func endsWholeOnCancel(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = hostGitWaitDelay
}

// ownerCredential makes a root process run as the owner of dir (the
// files git writes there stay the user's), when that is another user.
func ownerCredential(dir string) *syscall.SysProcAttr {
	fi, err := os.Stat(dir)
	if err != nil || os.Geteuid() != 0 {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return nil
	}
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: st.Uid, Gid: st.Gid, NoSetGroups: true}}
}

// serveRef is the one ref a source's upload-pack advertises: the commit
// sent, set for the transfer's length in a namespace of its own
// (GIT_NAMESPACE), so upload-pack sees no other ref. It speaks protocol
// version 0, which serves only what an advertised tip reaches: whatever
// object ids a destination knows, it gets that commit's history and
// nothing else of the source (version 2 serves any object asked for by id).
const serveRef = "refs/jailbee/transfer"

// uploadArgs make upload-pack serve serveRef alone, whatever the source's
// config allows: no object by id, every other ref (HEAD too) hidden, so a
// destination learns no branch name of the source.
var uploadArgs = []string{
	"-c", "uploadpack.allowAnySHA1InWant=false",
	"-c", "uploadpack.allowTipSHA1InWant=false",
	"-c", "uploadpack.allowReachableSHA1InWant=false",
	"-c", "uploadpack.hideRefs=refs/",
	"-c", "uploadpack.hideRefs=HEAD",
	"-c", "uploadpack.hideRefs=!" + serveRef,
	"upload-pack",
}

// serveNamespace is a fresh namespace for one transfer's serveRef and the
// ref's full name in the repository.
func serveNamespace() (ns, full string, err error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	ns = "jailbee-transfer-" + hex.EncodeToString(b[:])
	return ns, "refs/namespaces/" + ns + "/" + serveRef, nil
}

// uploadPack serves commit from r with the given streams: on the host,
// upload-pack on the user's repository with serveRef set for the
// transfer; in a sandbox, the jailbee client does the same there
// (serveMain).
func (r Repo) uploadPack(ctx context.Context, commit string, stdin, stdout *os.File, stderr *untrusted.Buffer, started func()) error {
	if r.run != nil {
		code, err := r.run.Run(ctx, Cmd{
			Argv: []string{ClientName, serveCommand, commit},
			Dir:  r.dir, Env: sandboxEnv,
			Stdin: stdin, Stdout: stdout, Stderr: stderr, Started: started,
		})
		if err != nil {
			return fmt.Errorf("git upload-pack in %s: %w", r.name, err)
		}
		if code != 0 {
			return &SandboxGitError{Sub: "upload-pack", Where: r.name, Code: code, Stderr: stderrText(stderr)}
		}
		return nil
	}
	ns, ref, err := serveNamespace()
	if err != nil {
		return err
	}
	if _, err := runAsOwner(ctx, r.dir, "update-ref", "--no-deref", ref, commit, ""); err != nil {
		return err
	}
	defer runAsOwner(context.WithoutCancel(ctx), r.dir, "update-ref", "--no-deref", "-d", ref, commit)
	args := append(append(append([]string{}, safeConfig...), uploadArgs...), "--", r.dir)
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = append(gitEnv(), "GIT_NAMESPACE="+ns)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	endsWholeOnCancel(cmd) // its pack-objects would outlive it
	if err := cmd.Start(); err != nil {
		return commandError(ctx, []string{"upload-pack"}, nil, err)
	}
	started()
	if err := cmd.Wait(); err != nil {
		return commandError(ctx, []string{"upload-pack"}, []byte(stderrText(stderr)), err)
	}
	return nil
}

func closeFiles(files ...*os.File) {
	for _, f := range files {
		f.Close()
	}
}
