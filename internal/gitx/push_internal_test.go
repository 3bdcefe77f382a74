package gitx

import (
	"errors"
	"testing"
)

// TestRejection: git push --porcelain's line for the pushed ref decides
// which refusals are certain (nothing changed on the remote); any other
// "!" line, such as a remote that failed to report its status after it
// may have applied the update, is not one of them.
func TestRejection(t *testing.T) {
	const dst = "refs/heads/feature"
	for _, tc := range []struct {
		porcelain string
		want      error
	}{
		{"To x\n!\tc0ffee:refs/heads/feature\t[rejected] (non-fast-forward)\nDone\n", ErrNotFastForward},
		{"!\tc0ffee:refs/heads/feature\t[rejected] (fetch first)\n", ErrNotFastForward},
		{"!\tc0ffee:refs/heads/feature\t[rejected] (stale info)\n", ErrBranchMoved},
		{"!\tc0ffee:refs/heads/feature\t[remote rejected] (protected branch hook declined)\n", ErrPushRefused},
		{"!\tc0ffee:refs/heads/feature\t[remote failure] (remote failed to report status)\n", nil},
		{"!\tc0ffee:refs/heads/feature\t[no match]\n", nil},
		{"!\tc0ffee:refs/heads/other\t[rejected] (non-fast-forward)\n", nil},
		{"*\tc0ffee:refs/heads/feature\t[new branch]\n", nil},
		{"", nil},
	} {
		if got := rejection(tc.porcelain, dst); !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
			t.Errorf("rejection(%q) = %v, want %v", tc.porcelain, got, tc.want)
		}
	}
}
