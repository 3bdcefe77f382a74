package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/gitmeta"
	"agentbox/internal/secfs"
)

// Phases of a launch, as its record holds them.
const (
	PhaseStarting = "starting" // written before anything is created
	PhaseRunning  = "running"  // the container passed its final inspection
	PhaseFailed   = "failed"   // the launch failed and was torn down
)

// Names below a feature's directory.
const (
	recordFile = "launch.json"
	inputsDir  = "inputs" // the generated Compose and devcontainer inputs
	ledgerDir  = "ledger" // the tool-request replay ledger
	homeDir    = "home"   // the Dev Containers CLI's HOME
)

// maxRecordBytes bounds a launch record read back from disk.
const maxRecordBytes = 1 << 20

// namePattern is a feature name: it becomes a directory, a Git worktree
// id and (by default) the last segment of the workspace folder.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// CheckName refuses a feature name that is not 1-64 characters of
// [A-Za-z0-9_.-] starting with a letter or digit, or is "main" (the
// workspace folder /workspaces/main holds the shared Git metadata).
func CheckName(name string) error {
	if !namePattern.MatchString(name) {
		return &Error{Code: CodeUsage, Message: "a feature name is 1-64 characters of [A-Za-z0-9_.-], starting with a letter or digit"}
	}
	if name == "main" {
		return &Error{Code: CodeUsage, Message: `the feature name "main" is reserved (/workspaces/main holds the shared Git metadata)`}
	}
	return nil
}

// CheckNewName is CheckName for a new feature, which also may not be
// named as one of the entries beside its worktree: the worktree is
// features/NAME/NAME, so that entry (the ledger, the inputs) would become
// the worktree, the consumer's. (An existing feature of such a name can
// still be listed and torn down.)
func CheckNewName(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if slices.Contains([]string{recordFile, inputsDir, ledgerDir, homeDir}, name) {
		return &Error{Code: CodeUsage, Message: fmt.Sprintf("the feature name %q is reserved (it names an entry of the feature's state directory)", name)}
	}
	return nil
}

// Record is what a launch wrote down, fsync'd before each step that
// creates something, so that teardown finds everything even after a crash.
type Record struct {
	Version           int    `json:"version"`
	Name              string `json:"name"`
	Phase             string `json:"phase"`
	Error             string `json:"error,omitempty"`
	RunID             string `json:"run_id"`
	AssignmentLeaseID string `json:"assignment_lease_id"`
	OuterRuntimeID    string `json:"outer_runtime_id"`
	ManifestPath      string `json:"manifest_path"`
	// AssignmentSHA256 is the SHA-256 (lowercase hex) of the assignment
	// bytes the start validated: exec-provider and dispatch-tool refuse
	// other bytes at ManifestPath (pinned). A record without it (written
	// before it was recorded) is refused by both.
	AssignmentSHA256 string `json:"assignment_sha256,omitempty"`
	Repo             string `json:"repo"`
	Revision         string `json:"revision"`
	TaskBranch       string `json:"task_branch"`
	BranchCreated    bool   `json:"branch_created"`
	Worktree         string `json:"worktree"`
	WorktreeGitDir   string `json:"worktree_gitdir,omitempty"`
	Delegated        bool   `json:"delegated"`
	// GitBaseline is what of the shared Git metadata could make host Git
	// run code, taken before delegation: teardown reports any change.
	GitBaseline     gitmeta.Baseline    `json:"git_baseline,omitempty"`
	ComposeProject  string              `json:"compose_project"`
	WorkspaceFolder string              `json:"workspace_folder"`
	Consumer        assignment.Identity `json:"consumer"`
	ContainerID     string              `json:"container_id,omitempty"`
	ContainerUser   string              `json:"container_user,omitempty"`
	Proxies         []string            `json:"proxies,omitempty"`
	SpoolVolumes    []string            `json:"spool_volumes,omitempty"`
	// Materializations are the lease sources teardown removes, by the
	// field that names each (never a path in a receipt).
	Materializations []RecordedSource  `json:"materializations,omitempty"`
	PublishedPorts   []assignment.Port `json:"published_ports,omitempty"`
}

// RecordedSource is one lease materialization's source.
type RecordedSource struct {
	Field string `json:"field"`
	Path  string `json:"path"`
}

const recordVersion = 1

// featureDir is where feature name's record, inputs, ledger and worktree
// live.
func featureDir(stateRoot, name string) string {
	return filepath.Join(stateRoot, "features", name)
}

// RecordPath is the record file of feature name.
func RecordPath(stateRoot, name string) string {
	return filepath.Join(featureDir(stateRoot, name), recordFile)
}

// save writes r durably (temporary file, fsync, rename, directory fsync).
func (r *Record) save(stateRoot string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := secfs.WriteFileAtomic(RecordPath(stateRoot, r.Name), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write the launch record: %w", err)
	}
	return nil
}

// Load reads feature name's record without following a symlink.
func Load(stateRoot, name string) (*Record, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	data, err := secfs.ReadFileNoFollow(RecordPath(stateRoot, name), maxRecordBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("no feature %q: nothing was launched under that name", name)}
	}
	if err != nil {
		return nil, fmt.Errorf("read the launch record of %q: %w", name, err)
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil || r.Version != recordVersion || r.Name != name {
		return nil, fmt.Errorf("the launch record of %q is damaged", name)
	}
	return &r, nil
}

// prepareFeatureDir creates the state root (owner-only) and a fresh
// directory for the feature; an existing one means the name is taken.
func prepareFeatureDir(stateRoot, name string) error {
	if err := secfs.EnsurePrivateDir(stateRoot); err != nil {
		return fmt.Errorf("the state directory: %w", err)
	}
	if err := secfs.EnsurePrivateDir(filepath.Join(stateRoot, "features")); err != nil {
		return fmt.Errorf("the state directory: %w", err)
	}
	dir := featureDir(stateRoot, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return &Error{Code: CodeExists, Message: fmt.Sprintf("feature %q exists: tear it down first (branchbox feature teardown %s --force)", name, name)}
		}
		return fmt.Errorf("create the feature's directory: %w", err)
	}
	for _, sub := range []string{inputsDir, ledgerDir, homeDir} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			return fmt.Errorf("create the feature's %s directory: %w", sub, err)
		}
	}
	return secfs.FsyncDir(filepath.Dir(dir))
}
