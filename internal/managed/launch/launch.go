// Package launch is branchbox's managed Dev Containers launch: `feature
// start` (a fresh worktree, the checked Compose inputs behind a generated
// facade, the Dev Containers CLI on preloaded images, the container user
// and the final inspection, port proxies, workspace delegation), the
// commands that run in the launched container, status, and a teardown
// whose receipt lists any residue by kind.
//
// Order matters and is the contract: everything the assignment, the
// repository and its Compose inputs say is checked before any container
// exists; the launch record is fsync'd before each step that creates
// something; every container of the project is created and inspected
// before any of them starts, and inspected again once they run; and a
// failed launch is torn down before Start returns.
package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"agentbox/internal/crashpoint"
	"agentbox/internal/gitx"
	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/compose"
	"agentbox/internal/managed/delegate"
	"agentbox/internal/managed/devcontainer"
	"agentbox/internal/managed/engine"
	"agentbox/internal/managed/gitmeta"
	"agentbox/internal/managed/inspect"
	"agentbox/internal/managed/leasecheck"
	"agentbox/internal/managed/policy"
	"agentbox/internal/secfs"
)

// Container paths of the launch.
const (
	// GitMetadataTarget is where the repository's shared Git metadata is
	// bound, so Git works in the worktree inside the container.
	GitMetadataTarget = assignment.ReservedWorkspaceFolder + "/.git"
	// ManagedNamespace is the container namespace only signed leases may
	// occupy.
	ManagedNamespace = "/run/branchbox"
)

// Timeouts of the external steps.
const (
	devcontainerUpTimeout = 10 * time.Minute
	execTimeout           = 30 * time.Second
)

// Config is how branchbox is set up on this machine.
type Config struct {
	// StateRoot holds every feature's record, inputs, ledger and worktree.
	StateRoot string
	// Runtime is branchbox's effective uid and gid.
	Runtime assignment.Identity
	// Checks are the on-disk assignment checks' options.
	Checks leasecheck.Options
	// DevcontainerCLI and DockerCLI are the commands run ("devcontainer"
	// and "docker", looked up in the fixed PATH, when empty).
	DevcontainerCLI, DockerCLI string
	// Log receives one line per step.
	Log io.Writer
	// BeforeUp, when set, runs after the inputs are generated and before
	// the Dev Containers CLI reads them. Tests use it to play an attacker
	// who changes them.
	BeforeUp func(inputs string) error
}

// Request is one `feature start`.
type Request struct {
	Name     string
	Repo     string // the repository's main checkout
	Manifest string // the assignment (absolute)
}

// Start launches feature req.Name and returns its summary. On any failure
// after its record was written, the launch is torn down first and the
// error says which rule or step failed.
func Start(ctx context.Context, cfg Config, req Request) (*Summary, error) {
	if err := CheckNewName(req.Name); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(req.Manifest) || filepath.Clean(req.Manifest) != req.Manifest {
		// A refusal, as `managed validate` refuses such a path (exit 1):
		// exit 2 is for unknown commands and flags and argument counts.
		return nil, fail(CodeAssignment, "--runtime-manifest must be an absolute, clean path")
	}
	checked, err := leasecheck.Load(req.Manifest, cfg.Checks)
	if err != nil {
		return nil, &Error{Code: CodeAssignment, Message: err.Error()}
	}
	a := checked.Assignment
	if err := a.RequireManagedLaunch(cfg.Runtime); err != nil {
		return nil, &Error{Code: CodeAssignment, Message: err.Error()}
	}
	repo, err := mainCheckout(req.Repo)
	if err != nil {
		return nil, err
	}
	if repo != a.Repository.Path {
		return nil, fail(CodeRepository, "--repo is not the assignment's repository.path")
	}
	if err := gitmeta.Check(repo, int(cfg.Runtime.UID)); err != nil {
		return nil, &Error{Code: CodeRepository, Message: err.Error()}
	}
	exists, err := gitx.BranchExists(ctx, repo, a.TaskBranch)
	if err != nil {
		return nil, fail(CodeRepository, "look up the task branch: %v", err)
	}
	if exists {
		return nil, fail(CodeBranchExists, "branch_exists: the task branch %q exists; a managed launch never reuses a branch", a.TaskBranch)
	}
	eng, err := engine.Open()
	if err != nil {
		return nil, &Error{Code: CodeEngine, Message: err.Error()}
	}
	defer eng.Close()
	if err := eng.Ping(ctx); err != nil {
		return nil, &Error{Code: CodeEngine, Message: err.Error()}
	}

	if err := prepareFeatureDir(cfg.StateRoot, req.Name); err != nil {
		return nil, err
	}
	dir := featureDir(cfg.StateRoot, req.Name)
	rec := newRecord(req, repo, checked, dir)
	if err := rec.save(cfg.StateRoot); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	l := &launcher{cfg: cfg, eng: eng, rec: rec, checked: checked, dir: dir}
	sum, err := l.run(ctx)
	if err == nil {
		return sum, nil
	}
	// Tear down with a context of its own: ctx may be what failed.
	tctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	receipt := teardown(tctx, cfg, eng, rec)
	rec.Phase, rec.Error = PhaseFailed, err.Error()
	if saveErr := rec.save(cfg.StateRoot); saveErr != nil {
		fmt.Fprintf(logOut(cfg), "branchbox: %v\n", saveErr)
	}
	var le *Error
	if !errors.As(err, &le) {
		le = &Error{Code: CodeInternal, Message: err.Error()}
	}
	return nil, &StartError{Err: le, Teardown: receipt}
}

// StartError is a failed start: the failure and the receipt of the
// teardown that followed it.
type StartError struct {
	Err      *Error
	Teardown *Receipt
}

func (e *StartError) Error() string {
	msg := e.Err.Message
	if !e.Teardown.ResidueFree {
		msg += " (residue is left: branchbox feature teardown retries and lists it)"
	}
	return msg
}

// Unwrap gives the *Error.
func (e *StartError) Unwrap() error { return e.Err }

func newRecord(req Request, repo string, checked *leasecheck.Checked, dir string) *Record {
	a := checked.Assignment
	folder := a.WorkspaceFolder
	if folder == "" {
		folder = assignment.WorkspacesRoot + "/" + req.Name
	}
	worktree := filepath.Join(dir, req.Name)
	rec := &Record{
		Version: recordVersion, Name: req.Name, Phase: PhaseStarting,
		RunID: a.RunID, AssignmentLeaseID: a.LeaseID, OuterRuntimeID: a.OuterRuntimeID,
		ManifestPath: req.Manifest, AssignmentSHA256: checked.SHA256, Repo: repo, Revision: a.Repository.Revision, TaskBranch: a.TaskBranch,
		Worktree: worktree, WorkspaceFolder: folder, Consumer: *a.WorkspaceConsumer,
		ComposeProject: compose.ProjectName(a.RunID, req.Manifest, worktree),
		PublishedPorts: a.PublishedPorts,
	}
	for _, l := range a.Leases {
		if l.Scope == assignment.ScopeToolRequest {
			rec.SpoolVolumes = append(rec.SpoolVolumes, compose.SpoolVolumeName(a.RunID, l.LeaseID))
		}
		for _, m := range l.Materializations {
			rec.Materializations = append(rec.Materializations, RecordedSource{Field: m.Field, Path: m.SourcePath})
		}
	}
	return rec
}

// mainCheckout resolves --repo to a repository's main checkout: an
// absolute, clean path whose .git is a directory (its shared metadata is
// bound into the container as a whole).
func mainCheckout(repo string) (string, error) {
	if repo == "" {
		return "", fail(CodeUsage, "--repo is required")
	}
	abs, err := filepath.Abs(repo)
	if err != nil {
		return "", fail(CodeUsage, "--repo: %v", err)
	}
	st, err := os.Lstat(filepath.Join(abs, ".git"))
	if err != nil || !st.IsDir() {
		return "", fail(CodeRepository, "--repo must be a repository's main checkout (its .git a directory, not a link or a file)")
	}
	return abs, nil
}

// launcher carries one start's state between its steps.
type launcher struct {
	// composeFiles are the generated Compose inputs, in order: the
	// checked copies, then the facade; primaryService is the service the
	// devcontainer runs in.
	composeFiles   []string
	primaryService string
	cfg            Config
	eng            *engine.Engine
	rec            *Record
	checked        *leasecheck.Checked
	dir            string
}

func (l *launcher) logf(format string, args ...any) {
	fmt.Fprintf(logOut(l.cfg), "branchbox: "+format+"\n", args...)
}

func logOut(cfg Config) io.Writer {
	if cfg.Log == nil {
		return io.Discard
	}
	return cfg.Log
}

func (l *launcher) save() error { return l.rec.save(l.cfg.StateRoot) }

func (l *launcher) run(ctx context.Context) (*Summary, error) {
	a, rec := l.checked.Assignment, l.rec
	l.logf("creating worktree for branch %s at %s", rec.TaskBranch, shortRev(rec.Revision))
	// Git names the worktree's Git directory after the worktree's base
	// name: record it before git runs, so a crash after git's step still
	// leaves everything findable, and refuse a name git would change.
	rec.WorktreeGitDir = filepath.Join(rec.Repo, ".git", "worktrees", rec.Name)
	if exists(rec.WorktreeGitDir) {
		return nil, fail(CodeRepository, "the repository already has a worktree named %q", rec.Name)
	}
	rec.BranchCreated = true
	if err := l.save(); err != nil {
		return nil, err
	}
	if err := gitx.AddWorktree(ctx, rec.Repo, rec.Worktree, rec.TaskBranch, rec.Revision); err != nil {
		return nil, fail(CodeRepository, "create the worktree: %v", err)
	}
	crashpoint.Hit(crashpoint.LaunchWorktreeAdded)
	if err := pointWorktreeAtContainer(rec); err != nil {
		return nil, err
	}

	// Read and check every input before the consumer gets the worktree.
	project, dc, err := readInputs(ctx, rec.Worktree)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(project.Runnable, dc.Service()) {
		return nil, &Error{Code: CodeCompose, Message: dc.Refuse("service", "%q is not a runnable Compose service", dc.Service()).Error()}
	}
	if err := refuseRootUser(dc); err != nil {
		return nil, err
	}
	if keys := dc.NotApplied(); len(keys) > 0 {
		l.logf("devcontainer: %s not applied (a managed launch takes the container's environment and command from the Compose files)", strings.Join(keys, " and "))
	}
	if err := project.Omit(a.OmittedServices, dc.Service()); err != nil {
		return nil, &Error{Code: CodeCompose, Message: err.Error()}
	}
	if err := project.CheckRunnable(); err != nil {
		return nil, &Error{Code: CodeCompose, Message: err.Error()}
	}
	for _, r := range project.Replaced(dc.Service()) {
		l.logf("notice: compose: %s", r)
	}
	if err := assignment.CheckServiceImagesComplete(a.ServiceImages, project.Runnable); err != nil {
		return nil, &Error{Code: CodeCompose, Message: err.Error()}
	}
	want, err := l.writeInputs(project, dc)
	if err != nil {
		return nil, err
	}
	if err := l.checkImages(ctx); err != nil {
		return nil, err
	}
	// The primary's environment must be its image's exactly: the Dev
	// Containers CLI runs a root shell in it with that environment.
	env, err := l.eng.ImageEnv(ctx, a.ServiceImages[want.primaryService])
	if err != nil {
		return nil, fail(CodeEngine, "inspect the primary's image: %v", err)
	}
	want.primary.ExactEnv, want.primary.Env = true, env
	if err := l.recordGitBaseline(); err != nil {
		return nil, err
	}

	l.logf("delegating the worktree to uid %d gid %d", rec.Consumer.UID, rec.Consumer.GID)
	rec.Delegated = true
	if err := l.save(); err != nil {
		return nil, err
	}
	if err := l.delegate(); err != nil {
		return nil, err
	}
	if l.cfg.BeforeUp != nil {
		if err := l.cfg.BeforeUp(filepath.Join(l.dir, inputsDir)); err != nil {
			return nil, err
		}
	}

	// Create every container, inspect each, and only then start them: a
	// refused launch has run no process of the repository's.
	l.logf("creating the containers (project %s)", rec.ComposeProject)
	if err := l.createContainers(ctx); err != nil {
		return nil, err
	}
	crashpoint.Hit(crashpoint.LaunchContainersCreated)
	created, _, err := l.inspectProject(ctx, want, false)
	if err != nil {
		return nil, err
	}
	l.logf("%d container(s) inspected before start", len(created))
	if err := l.initSpools(ctx); err != nil {
		return nil, err
	}

	l.logf("devcontainer up (project %s)", rec.ComposeProject)
	cid, err := l.devcontainerUp(ctx)
	if cid != "" {
		rec.ContainerID = cid
		if saveErr := l.save(); saveErr != nil && err == nil {
			err = saveErr
		}
	}
	if err != nil {
		return nil, err
	}
	crashpoint.Hit(crashpoint.LaunchContainerUp)
	if cid != created[want.primaryService] {
		return nil, fail(CodeInspection, "final inspection: the Dev Containers CLI runs another container than the one inspected before start")
	}
	// Inspect again, last: the same containers, each still keeping its
	// rules; nothing may change between this and the start of the
	// proxies, which run nothing inside the container.
	running, c, err := l.inspectProject(ctx, want, true)
	if err != nil {
		return nil, err
	}
	if !maps.Equal(running, created) {
		return nil, fail(CodeInspection, "final inspection: the project's containers are not the ones inspected before start")
	}
	user, err := l.checkUser(ctx, dc)
	if err != nil {
		return nil, err
	}
	rec.ContainerUser = user
	l.logf("final inspection passed")
	if err := l.startProxies(ctx, c); err != nil {
		return nil, err
	}
	rec.Phase = PhaseRunning
	if err := l.save(); err != nil {
		return nil, err
	}
	return summarize(l.cfg.StateRoot, rec, a, l.cfg.Checks.Now), nil
}

// pointWorktreeAtContainer rewrites the new worktree's .git file so that
// it names its Git directory relative to the workspace folder, as the
// container sees it (the shared metadata at GitMetadataTarget). Host Git
// no longer runs in the worktree: after delegation its metadata is the
// consumer's to change.
func pointWorktreeAtContainer(rec *Record) error {
	gitFile := filepath.Join(rec.Worktree, ".git")
	data, err := secfs.ReadFileNoFollow(gitFile, 4096)
	if err != nil {
		return fail(CodeRepository, "read the new worktree's .git file: %v", err)
	}
	hostGitDir, ok := strings.CutPrefix(strings.TrimSpace(string(data)), "gitdir: ")
	if !ok || hostGitDir != rec.WorktreeGitDir {
		return fail(CodeRepository, "the new worktree's .git file does not name the Git directory git was asked for")
	}
	inside := GitMetadataTarget + "/worktrees/" + filepath.Base(hostGitDir)
	rel, err := filepath.Rel(rec.WorkspaceFolder, inside)
	if err != nil {
		return fail(CodeInternal, "relative Git directory: %v", err)
	}
	if err := secfs.WriteFileAtomic(gitFile, []byte("gitdir: "+rel+"\n"), 0o644); err != nil {
		return fail(CodeRepository, "write the worktree's .git file: %v", err)
	}
	return nil
}

// readInputs reads the worktree's devcontainer config and Compose files
// and applies every rule to them.
func readInputs(ctx context.Context, worktree string) (*compose.Project, *devcontainer.Config, error) {
	root, err := os.OpenRoot(worktree)
	if err != nil {
		return nil, nil, fail(CodeInternal, "open the worktree: %v", err)
	}
	defer root.Close()
	var cfgPath string
	for _, p := range devcontainer.Paths {
		if _, err := root.Lstat(p); err == nil {
			cfgPath = p
			break
		}
	}
	if cfgPath == "" {
		return nil, nil, fail(CodeCompose, "devcontainer: no config in the worktree (looked for %s)", strings.Join(devcontainer.Paths, ", "))
	}
	data, err := compose.ReadInside(root, cfgPath, devcontainer.MaxConfigBytes)
	if err != nil {
		return nil, nil, &Error{Code: CodeCompose, Message: strings.Replace(err.Error(), "compose:", "devcontainer:", 1)}
	}
	dc, err := devcontainer.Parse(cfgPath, data)
	if err != nil {
		return nil, nil, &Error{Code: CodeCompose, Message: err.Error()}
	}
	files, set, err := dc.ComposeFiles()
	if err != nil {
		return nil, nil, &Error{Code: CodeCompose, Message: err.Error()}
	}
	inputs, err := compose.Inputs(worktree, compose.DevcontainerFiles{Set: set, Dir: filepath.Dir(cfgPath), Files: files, Config: cfgPath})
	if err != nil {
		return nil, nil, &Error{Code: CodeCompose, Message: err.Error()}
	}
	project, err := compose.Check(ctx, worktree, inputs)
	if err != nil {
		return nil, nil, &Error{Code: CodeCompose, Message: err.Error()}
	}
	return project, dc, nil
}

// expectations are what the inspection requires of each container of the
// launch: the primary's, and every other runnable service's.
type expectations struct {
	primaryService string
	primary        inspect.Expect
	service        inspect.Expect
	runnable       []string
}

// writeInputs writes the checked Compose copies, the seccomp profile, the
// facade and the devcontainer config to the feature's inputs directory
// (owner-only: the CLI reads runtime-owned copies, never the worktree)
// and returns what the inspection expects.
func (l *launcher) writeInputs(p *compose.Project, dc *devcontainer.Config) (expectations, error) {
	a, rec := l.checked.Assignment, l.rec
	in := filepath.Join(l.dir, inputsDir)
	var files []string
	for i, f := range p.Files {
		name := filepath.Join(in, fmt.Sprintf("compose-%d.yaml", i))
		if err := secfs.WriteFileAtomic(name, f.Data, 0o600); err != nil {
			return expectations{}, fail(CodeInternal, "write a Compose copy: %v", err)
		}
		files = append(files, name)
	}
	profile, err := compose.SeccompProfile()
	if err != nil {
		return expectations{}, fail(CodeInternal, "the seccomp profile: %v", err)
	}
	seccompPath := filepath.Join(in, "seccomp.json")
	if err := secfs.WriteFileAtomic(seccompPath, profile, 0o600); err != nil {
		return expectations{}, fail(CodeInternal, "write the seccomp profile: %v", err)
	}
	plan := compose.FacadePlan{
		Images:      a.ServiceImages,
		Primary:     dc.Service(),
		Workspace:   compose.Bind{Source: rec.Worktree, Target: rec.WorkspaceFolder},
		GitMetadata: compose.Bind{Source: filepath.Join(rec.Repo, ".git"), Target: GitMetadataTarget},
		Seccomp:     seccompPath,
		User:        consumerUser(rec.Consumer),
	}
	expect := inspect.Expect{
		User:         plan.User,
		Capabilities: policy.Capabilities(true),
		Workspace:    inspect.Bind{Source: plan.Workspace.Source, Target: plan.Workspace.Target},
		Writable:     []inspect.Bind{{Source: plan.GitMetadata.Source, Target: plan.GitMetadata.Target}},
		ManagedRoot:  ManagedNamespace,
	}
	for _, lease := range a.Leases {
		for _, m := range lease.Materializations {
			if m.EnvironmentName != "" {
				expect.ForbiddenEnv = append(expect.ForbiddenEnv, m.EnvironmentName)
			}
			if m.TargetPath == "" || lease.Scope == assignment.ScopeToolRequest || lease.State == assignment.StateTrustedRelayEndpoint {
				continue
			}
			plan.Leases = append(plan.Leases, compose.Bind{Source: m.SourcePath, Target: m.TargetPath, ReadOnly: true})
			expect.Binds = append(expect.Binds, inspect.Bind{Source: m.SourcePath, Target: m.TargetPath})
		}
		expect.ForbiddenEnv = append(expect.ForbiddenEnv, lease.InheritedEnvironment...)
		if lease.Scope == assignment.ScopeToolRequest {
			v := compose.Volume{Name: compose.SpoolVolumeName(a.RunID, lease.LeaseID), Target: lease.RequestSpoolTarget}
			plan.Spools = append(plan.Spools, v)
			expect.Volumes = append(expect.Volumes, inspect.Volume{Name: v.Name, Target: v.Target})
		}
	}
	want := expectations{
		primaryService: plan.Primary,
		primary:        expect,
		service: inspect.Expect{
			Capabilities: policy.Capabilities(false),
			ManagedRoot:  ManagedNamespace,
			ForbiddenEnv: expect.ForbiddenEnv,
		},
		runnable: slices.Clone(p.Runnable),
	}
	facade, err := compose.Facade(p, plan)
	if err != nil {
		return expectations{}, &Error{Code: CodeCompose, Message: err.Error()}
	}
	facadePath := filepath.Join(in, "facade.yaml")
	if err := secfs.WriteFileAtomic(facadePath, facade, 0o600); err != nil {
		return expectations{}, fail(CodeInternal, "write the facade: %v", err)
	}
	l.composeFiles, l.primaryService = append(files, facadePath), plan.Primary
	config, err := dc.Generate(l.composeFiles, rec.WorkspaceFolder, plan.User)
	if err != nil {
		return expectations{}, &Error{Code: CodeCompose, Message: err.Error()}
	}
	if err := secfs.WriteFileAtomic(configPath(l.dir), config, 0o600); err != nil {
		return expectations{}, fail(CodeInternal, "write the devcontainer config: %v", err)
	}
	return want, nil
}

// consumerUser is the workspace consumer as a container user: "uid:gid",
// numeric, so that no name in the image can map it to anything else.
func consumerUser(id assignment.Identity) string {
	return fmt.Sprintf("%d:%d", id.UID, id.GID)
}

func configPath(dir string) string {
	return filepath.Join(dir, inputsDir, "devcontainer.json")
}

// checkImages checks every assigned image and the port proxy image are
// present locally. Nothing is ever pulled.
func (l *launcher) checkImages(ctx context.Context) error {
	a := l.checked.Assignment
	refs := make([]string, 0, len(a.ServiceImages)+1)
	names := make([]string, 0, len(a.ServiceImages))
	for name := range a.ServiceImages {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		refs = append(refs, a.ServiceImages[name])
	}
	if len(a.PublishedPorts) > 0 {
		refs = append(refs, a.PortProxyImage)
	}
	for i, ref := range refs {
		ok, err := l.eng.ImagePresent(ctx, ref)
		if err != nil {
			return fail(CodeEngine, "inspect an assigned image: %v", err)
		}
		if !ok {
			what := "port_proxy_image"
			if i < len(names) {
				what = fmt.Sprintf("service_images[%q]", names[i])
			}
			return fail(CodeImage, "%s is not present on this engine (a managed launch never pulls or builds)", what)
		}
	}
	return nil
}

// recordGitBaseline records, before the consumer can write anything
// there, what of the shared Git metadata could make host Git run code.
func (l *launcher) recordGitBaseline() error {
	b, err := gitmeta.Executable(filepath.Join(l.rec.Repo, ".git"))
	if err != nil {
		return fail(CodeRepository, "read the shared Git metadata: %v", err)
	}
	l.rec.GitBaseline = b
	return l.save()
}

// delegate hands the worktree, its Git directory and the shared Git
// metadata the consumer writes (objects, refs, logs) to the consumer; the
// repository's .git itself, its config and hooks stay the runtime's.
func (l *launcher) delegate() error {
	rec := l.rec
	uid, gid := int(rec.Consumer.UID), int(rec.Consumer.GID)
	if err := delegate.Tree(rec.Worktree, uid, gid); err != nil {
		return fail(CodeRepository, "delegate the worktree: %v", err)
	}
	if err := delegate.Tree(rec.WorktreeGitDir, uid, gid); err != nil {
		return fail(CodeRepository, "delegate the worktree's Git directory: %v", err)
	}
	if err := delegate.Subtrees(filepath.Join(rec.Repo, ".git"), []string{"objects", "refs", "logs"}, uid, gid); err != nil {
		return fail(CodeRepository, "delegate the shared Git metadata: %v", err)
	}
	return nil
}

func shortRev(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
