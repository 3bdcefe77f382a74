package orchestrate

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/config"
	"agentbox/internal/crashpoint"
	"agentbox/internal/gitx"
	"agentbox/internal/serial"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// Bounds of sandbox lifecycle work.
const (
	// checkoutTimeout bounds filling a new sandbox's checkout from the
	// host repository.
	checkoutTimeout = 10 * time.Minute
	// workCheckTimeout bounds the git checks destroy runs inside a sandbox
	// (its fsmonitor or filters may be slow on purpose).
	workCheckTimeout = time.Minute
	// hostUIDAttempts bounds the random picks for a free host uid.
	hostUIDAttempts = 64
	// startRef is a new sandbox's start commit, in its own repository: the
	// fetch lands there, and it stays (git log refs/jailbee/start..HEAD is
	// the sandbox's own work).
	startRef = "refs/jailbee/start"
)

// Sandboxes configures the sandboxes an orchestrator creates.
type Sandboxes struct {
	// Limits are the broker's per-sandbox defaults; a repository's config
	// overrides them key by key. Ignored with NoLimits.
	Limits   config.Limits
	NoLimits bool
	// HostUIDs is the range a root broker gives sandboxes their own host
	// uid from; nil: sandboxes run as the broker's own uid.
	HostUIDs *config.UIDRange
	// Mounts are broker.yaml's named host directories: a mount right
	// attaches one to a sandbox at HostMountDir/NAME.
	Mounts map[string]config.MountDir
}

// CreateRequest is `jailbee new`.
type CreateRequest struct {
	Name   string
	Role   wire.Role
	Parent string // a child's orchestrator
	Repo   string // host path; a child defaults to its orchestrator's
	Branch string // "" = the repository's current branch
	Grant  string // an orchestrator's grant document (canonical JSON)
}

// Runner runs commands inside the sandbox name, for gitx.
//
// What runs in a sandbox is the sandbox's to stall, so it runs outside
// the broker's serial turn (serial.Outside): other sandboxes' requests go
// on meanwhile. It can be cut short by Interrupt.
func (o *Orchestrator) Runner(name string) gitx.Runner {
	return gitx.RunnerFunc(func(ctx context.Context, c gitx.Cmd) (code int, err error) {
		ctx, done := o.inflight.begin(ctx, name)
		defer done()
		serial.Outside(ctx, func() {
			code, err = o.Backend.Exec(ctx, name, backend.ExecOptions{
				Argv: c.Argv, Dir: c.Dir, Env: c.Env, Stdin: c.Stdin, Stdout: c.Stdout, Stderr: c.Stderr,
				Started: c.Started,
			})
		})
		if err == nil && ctx.Err() != nil && context.Cause(ctx) == errInterrupted {
			err = errInterrupted
		}
		return code, err
	})
}

// checkout is a sandbox's repository, where git runs on it.
func (o *Orchestrator) checkout(name string) gitx.Repo {
	return gitx.SandboxRepo(name, o.Runner(name), backend.WorkspacePath)
}

// CreateSandbox makes a running sandbox whose checkout is req.Branch of
// the host repository, serves its socket, and records it (`jailbee new`).
// Every step is undone if a later one fails. Refusals (*Refusal) name the
// cause for the host user who asked.
func (o *Orchestrator) CreateSandbox(ctx context.Context, req CreateRequest) (store.Sandbox, error) {
	src, err := o.checkCreate(ctx, &req)
	if err != nil {
		return store.Sandbox{}, err
	}
	sb := store.Sandbox{Name: req.Name, Role: req.Role, Parent: req.Parent, Branch: src.branch,
		Repo: src.repo, State: store.StateCreating, Grant: req.Grant, Imported: src.commit}
	err = o.makeSandbox(ctx, &sb, true, func(ctx context.Context) error { return o.fillCheckout(ctx, req.Name, src) })
	if errors.Is(err, backend.ErrExists) {
		// Not in broker.db but present in the backend: left by a create
		// the broker did not finish.
		return store.Sandbox{}, refusef("a sandbox `%s` exists in the backend without a broker record (an interrupted create?): remove it with 'jailbee destroy %s --force'", req.Name, req.Name)
	}
	if err != nil {
		return store.Sandbox{}, err
	}
	return sb, nil
}

// makeSandbox takes the steps every new sandbox takes, `jailbee new` and
// a spawn's worker alike: its limits and host uid, the backend's sandbox,
// its record, its socket, its start, its checkout (fill), and running.
// Each step is recorded as it is taken, and on error one deferred cleanup
// undoes them in reverse (containerd's NewBundle is the model). A new
// record (fresh) is inserted and removed by the cleanup; a spawn's record
// exists from its admission and is updated instead: its worker reports
// the failure and removes it (it must say why first).
func (o *Orchestrator) makeSandbox(ctx context.Context, sb *store.Sandbox, fresh bool, fill func(context.Context) error) (err error) {
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	cleanup := context.WithoutCancel(ctx)

	limits, err := o.limitsFor(sb.Repo)
	if err != nil {
		return err
	}
	if sb.HostUID, err = o.claimHostUID(ctx); err != nil {
		return err
	}
	labels := map[string]string{"role": string(sb.Role), "branch": sb.Branch, "repo": sb.Repo}
	if sb.Parent != "" {
		labels["parent"] = sb.Parent
	}
	inst, err := o.Backend.Create(ctx, backend.CreateOptions{Name: sb.Name, HostUID: sb.HostUID, Limits: limits, Labels: labels})
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	undo = append(undo, func() { o.Backend.Destroy(cleanup, sb.Name) })
	if !fresh {
		crashpoint.Hit(crashpoint.SpawnCreated)
	}
	sb.UUID = inst.UUID
	if fresh {
		if err = o.Store.CreateSandbox(ctx, *sb); err != nil {
			return fmt.Errorf("record sandbox: %w", err)
		}
		undo = append(undo, func() { o.Store.DeleteSandbox(cleanup, sb.Name) })
	} else if err = o.Store.SetCreated(ctx, sb.Name, inst.UUID, sb.HostUID); err != nil {
		return fmt.Errorf("record sandbox: %w", err)
	}
	if *sb, err = o.Store.Sandbox(ctx, sb.Name); err != nil {
		return fmt.Errorf("read sandbox record: %w", err)
	}
	if o.Serve != nil {
		if err = o.Serve(*sb); err != nil {
			return fmt.Errorf("serve the sandbox's socket: %w", err)
		}
		name := sb.Name
		undo = append(undo, func() { o.Unserve(name) })
	}
	if err = o.Backend.Start(ctx, sb.Name); err != nil {
		return fmt.Errorf("start sandbox: %w", err)
	}
	if err = fill(ctx); err != nil {
		return err
	}
	if o.ModelSockets && (sb.Role == wire.RoleOrchestrator || sb.Role == wire.RoleChild) {
		if err = o.seedClaudeHome(ctx, sb.Name); err != nil {
			return err
		}
	}
	if err = o.Store.SetState(ctx, sb.Name, store.StateRunning); err != nil {
		return fmt.Errorf("record sandbox: %w", err)
	}
	sb.State = store.StateRunning
	return nil
}

// source is where a new sandbox's checkout comes from.
type source struct {
	repo, branch, commit string
}

// checkCreate applies every rule of a create before anything is made.
func (o *Orchestrator) checkCreate(ctx context.Context, req *CreateRequest) (source, error) {
	if backend.ValidateName(req.Name) != nil {
		return source{}, refusef("invalid sandbox name %q: use lowercase letters, digits and dashes (at most %d), not starting with a dash", truncate(req.Name, 80), backend.NameMaxLen)
	}
	if _, err := o.Store.Sandbox(ctx, req.Name); err == nil {
		return source{}, refusef("sandbox `%s` already exists", req.Name)
	}
	switch req.Role {
	case wire.RoleOrchestrator:
	case wire.RoleChild:
		parent, err := o.Store.Sandbox(ctx, req.Parent)
		if errors.Is(err, store.ErrNotFound) {
			return source{}, o.noSuchSandbox(ctx, req.Parent, wire.RoleOrchestrator)
		}
		if err != nil {
			return source{}, err
		}
		if parent.Role != wire.RoleOrchestrator {
			return source{}, refusef("`%s` is not an orchestrator", parent.Name)
		}
		if req.Repo == "" {
			req.Repo = parent.Repo
		}
	default:
		return source{}, refusef("role must be orchestrator or child")
	}
	repo, err := hostRepoRoot(ctx, req.Repo)
	if err != nil {
		return source{}, err
	}
	src := source{repo: repo, branch: req.Branch}
	if src.branch == "" {
		src.branch, err = gitx.CurrentBranch(ctx, repo)
		if errors.Is(err, gitx.ErrDetachedHead) {
			return source{}, refusef("the repository's HEAD is detached: name a branch with --branch")
		}
		if err != nil {
			return source{}, refusef("cannot read the repository's current branch: %v", err)
		}
	} else if gitx.CheckBranchName(ctx, src.branch) != nil {
		return source{}, refusef("invalid branch name: %q", truncate(src.branch, 200))
	}
	if src.commit, err = gitx.ResolveCommit(ctx, repo, "refs/heads/"+src.branch); err != nil {
		if src.commit, err = gitx.ResolveCommit(ctx, repo, "HEAD"); err != nil {
			return source{}, refusef("the repository has no commit to start from")
		}
	}
	if req.Role == wire.RoleChild {
		if err := o.oneChildPerBranch(ctx, req.Parent, src.branch); err != nil {
			return source{}, err
		}
	}
	return src, nil
}

// oneChildPerBranch refuses a second child of parent on branch.
func (o *Orchestrator) oneChildPerBranch(ctx context.Context, parent, branch string) error {
	kids, err := o.Store.Children(ctx, parent)
	if err != nil {
		return err
	}
	for _, c := range kids {
		if c.Role == wire.RoleChild && c.Branch == branch {
			return refusef("`%s` already has a child on branch %s: `%s`", parent, branch, c.Name)
		}
	}
	return nil
}

// limitsFor is the broker's limits with the repository's overrides.
func (o *Orchestrator) limitsFor(repo string) (backend.Limits, error) {
	if o.Sandboxes.NoLimits {
		return backend.Limits{}, nil
	}
	cfg, err := LoadRepoConfig(repo)
	if err != nil {
		return backend.Limits{}, err
	}
	l := o.Sandboxes.Limits.Override(cfg.Limits)
	return backend.Limits{Pids: l.Pids, MemoryBytes: l.MemoryBytes, CPUWeight: l.CPUWeight, DiskBytes: l.DiskBytes}, nil
}

// claimHostUID picks and records a host uid for a new sandbox: random in
// the configured range (two brokers on one host rarely meet), never given
// before by this broker, no account of the host's, no process running as
// it. 0 when sandboxes run as the broker's own uid.
func (o *Orchestrator) claimHostUID(ctx context.Context) (int, error) {
	r := o.Sandboxes.HostUIDs
	if r == nil {
		return 0, nil
	}
	for range hostUIDAttempts {
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		uid := int(r.First + binary.LittleEndian.Uint32(b[:])%r.Count)
		if _, err := user.LookupId(strconv.Itoa(uid)); err == nil {
			continue
		}
		if uidHasProcesses(uid) {
			continue
		}
		err := o.Store.ClaimHostUID(ctx, uid)
		if errors.Is(err, store.ErrExists) {
			continue
		}
		return uid, err
	}
	return 0, fmt.Errorf("no free host uid found in %d tries in %d..%d: widen sandbox_uids in broker.yaml", hostUIDAttempts, r.First, r.Last())
}

// uidHasProcesses reports whether a process of the host runs with uid as
// any of its ids (real, effective, saved, filesystem). The owner of
// /proc/<pid> would not do: it is root for a non-dumpable process.
func uidHasProcesses(uid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true // cannot tell: do not take it
	}
	want := strconv.Itoa(uid)
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue // ended meanwhile
		}
		for _, line := range strings.Split(string(data), "\n") {
			if ids, ok := strings.CutPrefix(line, "Uid:"); ok {
				if slices.Contains(strings.Fields(ids), want) {
					return true
				}
				break
			}
		}
	}
	return false
}

// fillCheckout fills a new sandbox's empty checkout with src, every git
// command inside the sandbox: objects through the broker's pipe from the
// host repository's upload-pack (which serves only the commit's
// history), then the branch checked out at the commit.
func (o *Orchestrator) fillCheckout(ctx context.Context, name string, src source) error {
	return o.fillFrom(ctx, name, gitx.HostRepo(src.repo), src.branch, src.commit)
}

// fillFrom fills a new sandbox's empty checkout with branch at commit,
// whose objects come from src (the host repository, or another sandbox:
// a fork from an orchestrator).
func (o *Orchestrator) fillFrom(ctx context.Context, name string, src gitx.Repo, branch, commit string) error {
	ctx, cancel := context.WithTimeout(ctx, checkoutTimeout)
	defer cancel()
	if err := gitx.Transfer(ctx, src, commit, o.checkout(name), startRef, gitx.TransferOptions{Init: true, Checkout: branch}); err != nil {
		return fmt.Errorf("checkout: %w", err)
	}
	return nil
}

// DestroySandbox destroys a sandbox (an orchestrator with its children,
// with force) and returns how many were destroyed. Without force it is
// refused for an orchestrator with children, and for a sandbox whose work
// could be lost: uncommitted changes, a HEAD that cannot be read, or
// commits never imported (HEAD is not the commit it started from or was
// last imported at).
func (o *Orchestrator) DestroySandbox(ctx context.Context, name string, force bool) (int, error) {
	return o.destroy(ctx, name, force, "on the host")
}

// destroy is DestroySandbox; by says who destroyed a queued child in its
// spawn's or restart's final status. A queued spawn has no work: it needs
// no force. A destroyed child's slot, if it had one, goes to the queue.
func (o *Orchestrator) destroy(ctx context.Context, name string, force bool, by string) (int, error) {
	sb, err := o.Store.Sandbox(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		if force && backend.ValidateName(name) == nil {
			// A backend instance without a broker record: nothing else
			// refers to it, so --force removes it.
			if err := o.Backend.Destroy(ctx, name); err == nil {
				return 1, nil
			}
		}
		return 0, o.NoSuchSandbox(ctx, name)
	}
	if err != nil {
		return 0, err
	}
	var victims []store.Sandbox
	if sb.Role == wire.RoleOrchestrator {
		if victims, err = o.Store.Children(ctx, sb.Name); err != nil {
			return 0, err
		}
		if len(victims) > 0 && !force {
			return 0, refusef("`%s` has %d children: destroy them first, or use --force to destroy them too", sb.Name, len(victims))
		}
	}
	if !force && sb.State != store.StateDestroying && sb.State != store.StateQueued { // decided before, or no work
		if err := o.checkWorkSaved(ctx, sb); err != nil {
			return 0, err
		}
	}
	if waitsForSlot(sb) {
		if err := o.dequeue(ctx, sb, by); err != nil {
			return 0, err
		}
	}
	victims = append(victims, sb)
	for _, v := range victims {
		// Recorded first, for every victim: a broker that dies from here
		// on finishes the destroy at its start, so no record outlives its
		// sandbox, and no queued child of a destroyed orchestrator can be
		// claimed for a worker meanwhile.
		if err := o.Store.SetState(ctx, v.Name, store.StateDestroying); err != nil {
			return 0, err
		}
	}
	for _, v := range victims {
		if o.Unserve != nil {
			o.Unserve(v.Name)
		}
		if err := o.Backend.Destroy(ctx, v.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			return 0, fmt.Errorf("destroy `%s`: %w", v.Name, err)
		}
		crashpoint.Hit(crashpoint.DestroyUnitGone)
		// The backend removed the sandbox's files outside the turn: a
		// second destroy of it may have run meanwhile and finished first.
		if err := o.Store.DeleteSandbox(ctx, v.Name); err != nil && !errors.Is(err, store.ErrNotFound) {
			return 0, err
		}
	}
	if sb.Role == wire.RoleChild {
		o.startQueued(ctx, sb.Parent)
	}
	return len(victims), nil
}

// dequeue takes a queued child out of its orchestrator's queue for its
// destroy, so no worker starts for it, and gives its spawn or restart
// its final status: it never started.
func (o *Orchestrator) dequeue(ctx context.Context, sb store.Sandbox, by string) error {
	ok, err := o.Store.ClaimQueued(ctx, sb.Name, sb.QueuedSeq, store.StateDestroying, "")
	if err != nil {
		return err
	}
	if !ok {
		return refusef("`%s` has just left the queue (its worker started): destroy it again", sb.Name)
	}
	var doc spawnDoc
	json.Unmarshal([]byte(sb.SpawnDoc), &doc)
	o.appendStatus(ctx, sb.Parent, doc.Ref, wire.StateFailed,
		fmt.Sprintf("%s of child `%s` failed: it was destroyed %s before it started", doc.what(), sb.Name, by))
	return nil
}

// checkWorkSaved refuses when destroying sb could lose work: uncommitted
// changes, a HEAD that cannot be read or is detached, or commits never
// imported (HEAD is not sb.Imported). A running sandbox is asked with git
// inside it, which the sandbox controls: it can only lie its own work
// away. For one the broker stopped, what it saw at the stop counts; one
// stopped any other way cannot be checked.
func (o *Orchestrator) checkWorkSaved(ctx context.Context, sb store.Sandbox) error {
	head, err := o.savedHead(ctx, sb)
	if err != nil {
		return err
	}
	if head != sb.Imported {
		return refusef("`%s` has commits that were never imported (HEAD %s, last imported %s): import them, or fetch them into the host repository with 'jailbee fetch %s', or use --force", sb.Name, short(head), short(sb.Imported), sb.Name)
	}
	return nil
}

// savedHead returns sb's HEAD when its work tree is clean and on a
// branch, or the refusal that says why its work cannot be counted saved.
func (o *Orchestrator) savedHead(ctx context.Context, sb store.Sandbox) (string, error) {
	work, err := o.readWork(ctx, sb.Name)
	if errors.Is(err, backend.ErrNotRunning) {
		if sb.State != store.StateStopped {
			return "", refusef("`%s` is not running and was not stopped by the broker, so its work cannot be checked: start it again, or use --force", sb.Name)
		}
		// Only a stop by the broker records the HEAD: a unit that ended
		// on its own (the round recorded it stopped) has none, like one
		// whose HEAD could not be read at the stop.
		work = workState{head: sb.StopHead, branch: "(recorded)", dirty: sb.StopDirty}
		if work.head == "" {
			return "", refusef("the HEAD of `%s` was not recorded when it stopped (it could not be read, or the sandbox ended without a stop by the broker), so its work cannot be checked: start it again, or use --force", sb.Name)
		}
	} else if err != nil {
		return "", refusef("cannot check the work of `%s` (%v): use --force to destroy it anyway", sb.Name, err)
	}
	if work.dirty {
		return "", refusef("`%s` has uncommitted changes: commit them, or use --force", sb.Name)
	}
	if work.branch == "" {
		return "", refusef("the HEAD of `%s` is detached, so its work cannot be checked: check out its branch, or use --force", sb.Name)
	}
	return work.head, nil
}

// workState is what git inside a sandbox says of its checkout.
type workState struct {
	head, branch string // branch "" when detached
	dirty        bool
}

// readWork asks git inside the running sandbox name for its HEAD, branch
// and dirtiness; backend.ErrNotRunning when it does not run.
func (o *Orchestrator) readWork(ctx context.Context, name string) (workState, error) {
	ctx, cancel := context.WithTimeout(ctx, workCheckTimeout)
	defer cancel()
	wt, err := gitx.ReadWorkTree(ctx, o.checkout(name))
	if err != nil {
		return workState{}, err
	}
	return workState{head: wt.Commit, branch: wt.Branch, dirty: !wt.Clean}, nil
}

// StartSandbox starts a stopped sandbox's unit and records it running.
// Only the unit starts: for a spawned child the note says that its agent
// did not, and who starts one.
func (o *Orchestrator) StartSandbox(ctx context.Context, name string) (note string, err error) {
	sb, err := o.Store.Sandbox(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return "", o.NoSuchSandbox(ctx, name)
	}
	if err != nil {
		return "", err
	}
	stops := o.unitStops.count(name)
	if err := o.StartUnit(ctx, name); err != nil {
		// A start that failed partway may have left the unit up.
		o.stopIfRecordedStopped(ctx, name)
		return "", fmt.Errorf("start `%s`: %w", name, err)
	}
	// The start's last step may have run out of line: what was read
	// before may have changed meanwhile (a stop manifest, a destroy).
	if o.unitStops.count(name) != stops {
		return "", refusef("`%s` was stopped while it started: start it again if it should run", name)
	}
	now, err := o.Store.Sandbox(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return "", refusef("`%s` was destroyed while it started", name)
	}
	if err != nil {
		return "", err
	}
	if now.State == store.StateRunning || now.State == store.StateReady {
		return "", nil // it ran: a ready child's agent stays watched
	}
	if now.State != sb.State {
		return "", refusef("`%s` was %s while it started: start it again if it should run", name, now.State)
	}
	// Running again: what the last stop saw no longer counts.
	if err := o.Store.SetRunning(ctx, name); err != nil {
		return "", err
	}
	if sb.Role == wire.RoleChild && LastManifest(sb) != "" {
		note = agentNotStarted(name, sb.Parent)
	}
	return note, nil
}

// agentNotStarted says that a started child runs no agent and how its
// orchestrator gives it one.
func agentNotStarted(child, parent string) string {
	return fmt.Sprintf("its agent was not started again: its orchestrator `%s` starts one with a restart (`jailbee inbox send restart --child %s --agent-only`; without --agent-only once it is stopped)", parent, child)
}

// StopSandbox records a running sandbox's HEAD and dirtiness (destroy
// checks them while it is stopped), ends every process of it, and records
// it stopped. A HEAD that cannot be read is recorded as unknown. A
// stopped child's slot goes to the queue.
func (o *Orchestrator) StopSandbox(ctx context.Context, name string) error {
	sb, err := o.Store.Sandbox(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return o.NoSuchSandbox(ctx, name)
	}
	if err := o.stop(ctx, name); err != nil {
		return err
	}
	if sb.Role == wire.RoleChild {
		o.startQueued(ctx, sb.Parent)
	}
	return nil
}

// stop is StopSandbox's stop.
func (o *Orchestrator) stop(ctx context.Context, name string) error {
	work, readErr := o.readWork(ctx, name)
	o.unitStops.add(name)
	if err := o.Backend.Stop(ctx, name); err != nil {
		return fmt.Errorf("stop `%s`: %w", name, err)
	}
	switch {
	case errors.Is(readErr, backend.ErrNotRunning):
		// Already down: what a previous stop recorded stays.
		return o.Store.SetState(ctx, name, store.StateStopped)
	case readErr != nil:
		work = workState{} // unreadable: destroy will say so
	}
	return o.Store.SetStopped(ctx, name, work.head, work.dirty)
}

// short is the 12-character form of a commit id.
func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
