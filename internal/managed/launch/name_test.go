package launch_test

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/launch"
)

// TestFeatureNamesOfTheStateDirectory: a feature's worktree is
// features/NAME/NAME, beside its record, inputs, ledger and CLI home; a
// name that is one of those would make that directory the worktree,
// delegated to the consumer and bound into the container.
func TestFeatureNamesOfTheStateDirectory(t *testing.T) {
	for _, name := range []string{"ledger", "inputs", "home", "launch.json"} {
		if err := launch.CheckNewName(name); !isCode(err, launch.CodeUsage) {
			t.Errorf("feature name %q: %v", name, err)
		}
	}
	for _, name := range []string{"Ledger", "ledger2", "homes"} {
		if err := launch.CheckNewName(name); err != nil {
			t.Errorf("feature name %q: %v", name, err)
		}
	}
}

// TestLedgerIsNeverTheWorktree: started as "ledger", a launch would
// hand the tool-request ledger to the consumer, who could then forge a
// done record (a response the endpoint never gave) or remove a claim (a
// request relayed twice).
func TestLedgerIsNeverTheWorktree(t *testing.T) {
	s := newSetup(t, defaultFiles())
	_, err := s.start("ledger")
	if err == nil {
		var st unix.Stat_t
		dir := filepath.Join(s.cfg.StateRoot, "features", "ledger", "ledger")
		_ = unix.Lstat(dir, &st)
		t.Fatalf("feature \"ledger\" started: the ledger directory is the worktree, owned by uid %d", st.Uid)
	}
	if !isCode(err, launch.CodeUsage) {
		t.Fatalf("start: %v", err)
	}
}
