// Package example writes a complete, valid managed run a new user can try
// without an orchestrator: `branchbox managed example DIR` lays out
//
//	DIR/                                  0700 (created, or an existing empty directory)
//	DIR/bin/example-provider              0700 a shell script (versions 2 and 3)
//	DIR/managed/                          0700 the managed root (BRANCHBOX_MANAGED_ROOT)
//	DIR/managed/example/                  0700 the run directory (run_id "example")
//	DIR/managed/example/materializations/ 0700
//	DIR/managed/example/materializations/example-delivery-token  0600 a provider-environment value
//	DIR/managed/example/assignment.json   0600
//
// every entry owned by the user who runs it, and checks the result with the
// very checks `managed validate` applies (leasecheck.Load).
//
// Where the rules fix locations: the assignment must be stored directly in
// <managed root>/<run_id>/ and every file materialization directly in its
// materializations directory. The managed root is /run/branchbox/managed
// unless BRANCHBOX_MANAGED_ROOT replaces it, so the example makes DIR/managed
// its managed root and the printed commands set that variable (or leave it
// out when DIR is /run/branchbox, whose managed directory is the default
// root). Lease targets below /run/branchbox/leases name paths inside a
// container and are never created on this host. No root privilege is
// needed: the assignment owner may be root or the runtime's own uid.
//
// The example is the minimal assignment exec-provider can start a provider
// under: one model-identity lease (the example provider as its executable,
// one inherited name) and one provider-environment lease (one value file).
// Version 3 adds the mandatory workspace consumer. It carries no
// service_images unless Options.Launch binds a local image (and adds a
// repository, launchable.go); without, validate reports
// managed_launch.ready false. Version 1 keeps
// its fixed provider allowlist (claude, codex, gemini looked up in the
// fixed PATH), so its example names codex and writes no provider.
package example

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/leasecheck"
	"agentbox/internal/managed/provider"
	"agentbox/internal/managed/runlayout"
	"agentbox/internal/secfs"
)

// DefaultVersion is the version written without --version: the newest,
// which validate checks completely (a launch is not needed to try it).
const DefaultVersion = assignment.Version3

// Versions lists the versions the example can be written in.
var Versions = []string{assignment.Version1, assignment.Version2, assignment.Version3}

// Layout below DIR.
const (
	// ManagedDir is DIR's managed root, the value of BRANCHBOX_MANAGED_ROOT.
	ManagedDir = "managed"
	// BinDir holds the example provider, outside the managed root (every
	// entry of a managed root is a run directory).
	BinDir = "bin"
	// ProviderFile is the example provider's name.
	ProviderFile = "example-provider"
	// DirMode is the mode of DIR (when created), DIR/bin and DIR/managed.
	DirMode fs.FileMode = 0o700
	// ProviderMode is the provider's mode: owner-only, executable.
	ProviderMode fs.FileMode = 0o700
)

// MaxDirBytes is the longest DIR (absolute, clean) whose provider path is
// still a valid executable label (versions 2 and 3): the provider path is
// signed as the model-identity lease's executable.
const MaxDirBytes = assignment.MaxLabelBytes - len("/"+BinDir+"/"+ProviderFile)

// The example document.
const (
	RunID             = "example"
	AssignmentLeaseID = "example-assignment"
	OuterRuntimeID    = "example-outer-runtime"
	Workspace         = "/workspaces"
	RepositoryPath    = "/workspaces/example"
	// Revision is a placeholder: validate checks its syntax only (a full
	// Git object id); the launch, not validate, checks out the repository.
	Revision      = "0123456789abcdef0123456789abcdef01234567"
	TaskBranch    = "branchbox/example"
	ModelLeaseID  = "example-model"
	ValueLeaseID  = "example-delivery"
	Consumer      = "example-agent"
	InheritedName = "EXAMPLE_MODEL_TOKEN"
	ValueName     = "EXAMPLE_DELIVERY_TOKEN"
	ValueFile     = "example-delivery-token"
	// Value is the provider-environment value. It is not a secret, but
	// branchbox treats it as one: no command prints it.
	Value = "example-delivery-value"
	// InheritedValue is the value the printed exec-provider command gives
	// InheritedName in the caller's environment.
	InheritedValue = "example-model-token"
	// V1Provider is the version 1 example's provider: one of the fixed
	// allowlist, named by its model-identity lease's consumer.
	V1Provider = "codex"
	// LeaseLifetime is how long after writing the example's leases expire.
	// Leases that must be live refuse a past expiry, so the example is good
	// for this long; write a new one afterwards.
	LeaseLifetime = 30 * 24 * time.Hour
	// FirstConsumerID is the version 3 workspace consumer's uid and gid
	// unless the runtime uses it (the consumer must differ from the
	// runtime's uid and gid and may not be root); then the next free one.
	FirstConsumerID = 1000
	// ProgramName is the command the printed steps run.
	ProgramName = "branchbox"
)

// ProviderScript is the example provider. exec-provider starts it with
// exactly the environment its lease allows; it prints its arguments and the
// names of the variables it received, never their values. awk reads the
// names from its own environment (a value holding a newline cannot
// masquerade as a name). It leaves out the names its shell and awk add
// themselves: PWD and OLDPWD (sh), SHLVL and _ (bash), AWKPATH and
// AWKLIBPATH (gawk); no lease can bind the shell's.
const ProviderScript = `#!/bin/sh
# The branchbox example provider, written by 'branchbox managed example'.
# 'branchbox managed exec-provider' starts it with exactly the environment its
# lease allows. It prints its arguments and the NAMES of the environment
# variables it received, never their values. The names its shell and awk add
# themselves (PWD, OLDPWD, SHLVL, _, AWKPATH, AWKLIBPATH) are left out.
echo "example provider: started with $# argument(s): $*"
echo "environment names received (values are never printed):"
awk 'BEGIN {
	split("PWD OLDPWD SHLVL _ AWKPATH AWKLIBPATH", added, " ")
	for (i in added) skip[added[i]] = 1
	for (name in ENVIRON) if (!(name in skip)) print "  " name
}' | sort
`

// Paths are the example's locations below DIR.
type Paths struct {
	Dir         string `json:"dir"`
	ManagedRoot string `json:"managed_root"`
	RunDir      string `json:"run_dir"`
	Assignment  string `json:"assignment_path"`
	// Provider is empty in version 1 (no provider is written).
	Provider string `json:"provider,omitempty"`
	Value    string `json:"-"`
	// Workspace and Repository are set in a launchable example only.
	Workspace  string `json:"workspace,omitempty"`
	Repository string `json:"repository_path,omitempty"`
}

// PathsFor returns the locations below dir (absolute and clean).
func PathsFor(dir, version string) Paths {
	p := Paths{Dir: dir, ManagedRoot: path.Join(dir, ManagedDir)}
	p.RunDir = path.Join(p.ManagedRoot, RunID)
	p.Assignment = path.Join(p.RunDir, runlayout.AssignmentFile)
	p.Value = path.Join(p.RunDir, assignment.MaterializationsDir, ValueFile)
	if version != assignment.Version1 {
		p.Provider = path.Join(dir, BinDir, ProviderFile)
	}
	return p
}

// ConsumerID is the version 3 workspace consumer's uid and gid: the first
// from FirstConsumerID on that is neither the runtime's uid nor its gid.
func ConsumerID(runtime assignment.Identity) uint32 {
	id := uint32(FirstConsumerID)
	for id == runtime.UID || id == runtime.GID {
		id++
	}
	return id
}

// ExpiresAt is the expiry of leases written at now (RFC 3339, UTC).
func ExpiresAt(now time.Time) string {
	return now.UTC().Add(LeaseLifetime).Truncate(time.Second).Format(time.RFC3339)
}

// Document returns the example assignment for version at paths p, written
// at now for runtime. The value's digest is in it.
func Document(p Paths, version string, now time.Time, runtime assignment.Identity) (map[string]any, error) {
	if !slices.Contains(Versions, version) {
		return nil, fmt.Errorf("unsupported version %q (want 1, 2 or 3)", version)
	}
	expires := ExpiresAt(now)
	doc := map[string]any{
		"version":          version,
		"run_id":           RunID,
		"lease_id":         AssignmentLeaseID,
		"outer_runtime_id": OuterRuntimeID,
		"workspace":        Workspace,
		"repository":       map[string]any{"path": RepositoryPath, "revision": Revision},
		"task_branch":      TaskBranch,
		"tunnel_placement": assignment.TunnelPlacementOuter,
		"published_ports":  []any{},
	}
	if version == assignment.Version1 {
		doc["leases"] = []any{
			map[string]any{"lease_id": ModelLeaseID, "scope": string(assignment.ScopeModelIdentity),
				"consumer": V1Provider, "expires_at": expires, "materializations": []any{}},
		}
		return doc, nil
	}
	if version == assignment.Version3 {
		id := ConsumerID(runtime)
		doc["workspace_consumer"] = map[string]any{"uid": id, "gid": id}
	}
	doc["leases"] = []any{
		map[string]any{"lease_id": ModelLeaseID, "scope": string(assignment.ScopeModelIdentity),
			"consumer": Consumer, "executable": p.Provider, "inherited_environment": []any{InheritedName},
			"expires_at": expires, "materializations": []any{}},
		map[string]any{"lease_id": ValueLeaseID, "scope": string(assignment.ScopeProviderEnvironment),
			"consumer": Consumer, "expires_at": expires, "materializations": []any{
				map[string]any{"source_path": p.Value, "environment_name": ValueName,
					"sha256": runlayout.Digest([]byte(Value))},
			}},
	}
	return doc, nil
}

// check is the self-check Write applies to what it wrote: validate's own
// checks. A variable so a test can make it fail.
var check = leasecheck.Load

// Options are the inputs of Write.
type Options struct {
	// Dir is where the example goes: an absolute path, cleaned by Write.
	Dir string
	// Version is "1", "2" or "3".
	Version string
	// Now is when the example is written; leases expire LeaseLifetime later.
	Now time.Time
	// Runtime is the uid and gid of the runtime that will validate the
	// example: this process's effective ids (the files are its own).
	Runtime assignment.Identity
	// Launch, when set, makes a version 3 example launchable: a
	// repository below DIR and service_images.
	Launch *Launchable
}

// File is one entry Write created (or DIR, when it existed).
type File struct {
	Path string `json:"path"`
	Type string `json:"type"` // "directory" or "file"
	Mode string `json:"mode"` // octal permission bits, e.g. "0700"
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	Role string `json:"role"`
}

// Result is a written example.
type Result struct {
	Paths
	Version string `json:"version"`
	RunID   string `json:"run_id"`
	// DirCreated is false when DIR existed (empty).
	DirCreated bool                 `json:"dir_created"`
	ExpiresAt  string               `json:"expires_at"`
	Consumer   *assignment.Identity `json:"workspace_consumer,omitempty"`
	Files      []File               `json:"files"`
	// Launchable: the example is ready for `feature start`.
	Launchable bool `json:"launchable"`
}

// Write lays the example out below opts.Dir and checks it as validate
// does. It refuses, before writing anything:
//
//   - a DIR that is "/" or whose parent does not exist;
//   - a symbolic link at DIR or anywhere on its path (nothing here follows
//     one, and validate refuses a run below one);
//   - a DIR that exists and is not a directory, or is not empty;
//   - a DIR or ancestor another uid could replace (owned by neither root
//     nor this user, or group- or other-writable without the sticky bit):
//     validate refuses a run below one;
//   - a DIR whose paths would break a document rule (the provider path is
//     signed as the lease's executable: a label of at most 128 bytes
//     without whitespace).
//
// When it fails after creating entries it removes them again.
func Write(opts Options) (*Result, error) {
	dir := opts.Dir
	if !path.IsAbs(dir) {
		return nil, fmt.Errorf("DIR must be an absolute path")
	}
	dir = path.Clean(dir)
	if dir == "/" {
		return nil, fmt.Errorf("DIR must not be /")
	}
	if opts.Launch != nil && opts.Version != assignment.Version3 {
		return nil, fmt.Errorf("a launchable example needs version 3")
	}
	p := PathsFor(dir, opts.Version)
	doc, err := Document(p, opts.Version, opts.Now, opts.Runtime)
	if err != nil {
		return nil, err
	}
	if opts.Launch != nil {
		launchPaths(&p)
		addLaunch(doc, p, Revision, opts.Launch)
	}
	if err := checkDocument(doc, p, opts); err != nil {
		return nil, err
	}
	existed, err := checkDir(dir, opts.Runtime.UID)
	if err != nil {
		return nil, err
	}

	var created []string
	// Everything here was created fresh in a directory no other uid can
	// write (checkDir), so removing it whole removes only what Write made.
	fail := func(err error) (*Result, error) {
		for i := len(created) - 1; i >= 0; i-- {
			_ = os.RemoveAll(created[i])
		}
		return nil, err
	}
	if !existed {
		if err := secfs.MkdirFresh(dir); err != nil {
			return nil, fmt.Errorf("DIR %s cannot be created: %w", dir, secfs.WithoutPath(err))
		}
		created = append(created, dir)
	}
	if p.Provider != "" {
		bin := path.Dir(p.Provider)
		if err := secfs.MkdirFresh(bin); err != nil {
			return fail(fmt.Errorf("%s cannot be created: %w", bin, secfs.WithoutPath(err)))
		}
		created = append(created, bin)
		if err := secfs.WriteFileAtomic(p.Provider, []byte(ProviderScript), ProviderMode); err != nil {
			return fail(fmt.Errorf("%s cannot be written: %w", p.Provider, secfs.WithoutPath(err)))
		}
		created = append(created, p.Provider)
	}
	if opts.Launch != nil {
		rev, err := writeRepository(p, &created)
		if err != nil {
			return fail(err)
		}
		addLaunch(doc, p, rev, opts.Launch)
	}
	if err := secfs.MkdirFresh(p.ManagedRoot); err != nil {
		return fail(fmt.Errorf("%s cannot be created: %w", p.ManagedRoot, secfs.WithoutPath(err)))
	}
	created = append(created, p.ManagedRoot)
	laid, err := runlayout.Lay(p.RunDir, doc, runlayout.Options{
		Content: func(string, int, int) []byte { return []byte(Value) },
	})
	created = append(created, laid...)
	if err != nil {
		return fail(fmt.Errorf("the run directory cannot be written: %w", secfs.WithoutPath(err)))
	}
	checked, err := check(p.Assignment, leasecheck.Options{ManagedRoot: p.ManagedRoot, Now: opts.Now, Runtime: opts.Runtime})
	if err != nil {
		return fail(fmt.Errorf("the example failed validation, so it was removed again: %w", err))
	}
	if opts.Launch != nil {
		if err := checkLaunchable(checked.Assignment, opts.Runtime); err != nil {
			return fail(err)
		}
	}

	res := &Result{Paths: p, Version: opts.Version, RunID: RunID, DirCreated: !existed,
		ExpiresAt: ExpiresAt(opts.Now), Launchable: opts.Launch != nil}
	if opts.Version == assignment.Version3 {
		id := ConsumerID(opts.Runtime)
		res.Consumer = &assignment.Identity{UID: id, GID: id}
	}
	listed := created
	if existed {
		listed = append([]string{dir}, created...)
	}
	slices.Sort(listed) // parents first, the assignment before materializations/
	for _, name := range listed {
		f, err := describe(name, p, existed)
		if err != nil {
			return fail(err)
		}
		res.Files = append(res.Files, f)
	}
	return res, nil
}

// checkDocument applies every document rule to the example before
// anything is written, so a DIR that cannot hold a valid run is refused
// with the rule it breaks.
func checkDocument(doc map[string]any, p Paths, opts Options) error {
	data, err := runlayout.Marshal(doc)
	if err != nil {
		return err
	}
	rt := opts.Runtime
	if _, err := assignment.Parse(data, assignment.Options{Now: opts.Now, ManagedRoot: p.ManagedRoot, Runtime: &rt}); err != nil {
		return fmt.Errorf("DIR %s cannot hold a valid example assignment: %w", p.Dir, err)
	}
	return nil
}

// checkDir walks from "/" to DIR without following a symbolic link and
// reports whether DIR exists (then it is an empty directory). DIR's
// ancestors, and DIR itself when it exists, must pass the rule validate
// applies to the ancestors of a run directory (leasecheck.AncestorReason).
// That rule is also why the path-based writes that follow are safe: no
// other uid can replace DIR or anything below it.
func checkDir(dir string, owner uint32) (existed bool, err error) {
	parent := path.Dir(dir)
	comps, _ := secfs.Components(parent)
	var refusal error
	pfd, _, err := secfs.OpenDirNoFollow(parent, func(depth int, st *unix.Stat_t) error {
		if r := leasecheck.AncestorReason(st, owner); r != "" {
			refusal = fmt.Errorf("directory %s (an ancestor of DIR) %s: validate refuses a run below it", "/"+strings.Join(comps[:depth], "/"), r)
			return refusal
		}
		return nil
	})
	switch {
	case refusal != nil:
		return false, refusal
	case errors.Is(err, secfs.ErrSymlink):
		return false, fmt.Errorf("a symbolic link is on the path to DIR %s: example follows none, and validate refuses a run below one", dir)
	case errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("the parent of DIR %s does not exist (example creates DIR, not its parents)", dir)
	case errors.Is(err, secfs.ErrType):
		return false, fmt.Errorf("the parent of DIR %s is not a directory", dir)
	case err != nil:
		return false, fmt.Errorf("the path to DIR %s cannot be opened: %w", dir, secfs.WithoutPath(err))
	}
	defer pfd.Close()
	h, st, err := secfs.OpenChild(pfd, path.Base(dir), unix.O_PATH)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case errors.Is(err, secfs.ErrSymlink):
		return false, fmt.Errorf("DIR %s is a symbolic link: example never follows one", dir)
	case err != nil:
		return false, fmt.Errorf("DIR %s cannot be opened: %w", dir, secfs.WithoutPath(err))
	}
	defer h.Close()
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false, fmt.Errorf("DIR %s exists and is not a directory", dir)
	}
	if r := leasecheck.AncestorReason(&st, owner); r != "" {
		return false, fmt.Errorf("DIR %s %s: validate refuses a run below it", dir, r)
	}
	// Read the very directory checked: reopen the O_PATH handle itself.
	fd, err := unix.Openat(int(h.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("DIR %s cannot be read: %w", dir, err)
	}
	d := os.NewFile(uintptr(fd), dir)
	defer d.Close()
	names, err := d.Readdirnames(1)
	if len(names) > 0 {
		return false, fmt.Errorf("DIR %s exists and is not empty: example writes only into a new or empty directory", dir)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("DIR %s cannot be read: %w", dir, secfs.WithoutPath(err))
	}
	return true, nil
}

// describe reports one listed entry with its mode and owner as they are on
// disk (read without following a link).
func describe(name string, p Paths, existed bool) (File, error) {
	fi, err := os.Lstat(name)
	if err != nil {
		return File{}, fmt.Errorf("%s cannot be inspected: %w", name, secfs.WithoutPath(err))
	}
	f := File{Path: name, Type: "file", Mode: fmt.Sprintf("%04o", fi.Mode().Perm()), Role: role(name, p, existed)}
	if fi.IsDir() {
		f.Type = "directory"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		f.UID, f.GID = st.Uid, st.Gid
	}
	return f, nil
}

func role(name string, p Paths, existed bool) string {
	switch name {
	case p.Dir:
		if existed {
			return "DIR (it existed, empty)"
		}
		return "DIR"
	case path.Dir(p.Provider):
		return "holds the example provider"
	case p.Provider:
		return "the example provider: a shell script that prints the names of the environment variables it receives"
	case p.ManagedRoot:
		return "the managed root: BRANCHBOX_MANAGED_ROOT"
	case p.RunDir:
		return "the run directory, named by run_id"
	case path.Dir(p.Value):
		return "the run's file materializations"
	case p.Value:
		return "the " + ValueName + " value of the provider-environment lease (its sha256 is in the assignment)"
	case p.Assignment:
		return "the assignment"
	case p.Workspace:
		return "the assignment's workspace"
	case p.Repository:
		return "the example repository: a devcontainer config and a Compose file, in one commit on main"
	}
	return ""
}

// Step is one command to run next.
type Step struct {
	Purpose string `json:"purpose"`
	Command string `json:"command"`
}

// NextSteps are the exact commands that try the example, as one shell
// line each.
func (r *Result) NextSteps() []Step {
	env := ""
	if r.ManagedRoot != assignment.DefaultManagedRoot {
		env = leasecheck.ManagedRootEnv + "=" + ShellQuote(r.ManagedRoot) + " "
	}
	validate := " --json"
	if r.Launchable {
		validate = " --require-launch"
	}
	steps := []Step{{
		Purpose: "validate the assignment and every file it names",
		Command: env + ProgramName + " managed validate " + ShellQuote(r.Assignment) + validate,
	}}
	if r.Provider != "" {
		steps = append(steps, Step{
			Purpose: "start the example provider with exactly the environment its lease allows",
			Command: InheritedName + "=" + InheritedValue + " " + env + ProgramName +
				" managed exec-provider --assignment " + ShellQuote(r.Assignment) +
				" --provider " + ShellQuote(r.Provider) + " --inherit-env " + InheritedName + " -- hello",
		})
	}
	if r.Launchable {
		steps = append(steps, r.launchSteps(env)...)
	}
	return steps
}

// Notes explain what the example cannot show.
func (r *Result) Notes() []string {
	var notes []string
	switch {
	case r.Version == assignment.Version1:
		notes = append(notes, fmt.Sprintf("version 1 starts only the fixed providers claude, codex and gemini, looked up in PATH=%s; "+
			"this example's model-identity lease names %s, so exec-provider can start it only where %s is installed there "+
			"(--provider %s --inherit-env %s), and no example provider is written", provider.SafePATH, V1Provider, V1Provider, V1Provider,
			assignment.V1Providers[V1Provider]))
	case r.Version == assignment.Version2:
		notes = append(notes, "validate reports managed_launch.ready false: a managed Dev Containers launch needs version 3")
	case r.Launchable:
		notes = append(notes, "the assignment is launchable: feature start needs root, the Docker engine with the Compose v2 plugin "+
			"and the Dev Containers CLI, and runs the service as the workspace consumer",
			"the model-identity lease's executable is the example provider on this host: managed exec-provider starts it, "+
				"feature exec-provider would look for it in the container, where it is not")
	default:
		notes = append(notes, "validate reports managed_launch.ready false: a managed Dev Containers launch also needs preloaded "+
			"service_images (--launchable binds local ones); exec-provider needs no launch")
	}
	notes = append(notes,
		fmt.Sprintf("the files are owner-only: run the steps as uid %d", r.ownerUID()),
		fmt.Sprintf("the leases expire at %s; write a new example afterwards", r.ExpiresAt))
	return notes
}

func (r *Result) ownerUID() uint32 {
	for _, f := range r.Files {
		if f.Path == r.Assignment {
			return f.UID
		}
	}
	return 0
}

// ShellQuote quotes s for a POSIX shell when it holds anything but
// letters, digits and /._-+:,@%=.
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:,@%=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
