package gitx_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"agentbox/internal/gitx"
)

// TestTransferStalledSource: a source that sends nothing (it stopped its
// own upload-pack) fails the transfer at its idle bound, with
// ErrTransferStalled, long before the transfer's overall deadline; the
// destination gets no ref.
func TestTransferStalledSource(t *testing.T) {
	src, _, _ := newRepo(t)
	commit := commitFile(t, src, "only-in-src", "x")
	dst, _, _ := newRepo(t)
	stalling := gitx.RunnerFunc(func(ctx context.Context, c gitx.Cmd) (int, error) {
		if slices.ContainsFunc(c.Argv, func(a string) bool { return strings.Contains(a, "upload-pack") || strings.Contains(a, "_git-serve") }) {
			<-ctx.Done() // its streams stay open (never Started), and nothing is sent
			return 0, ctx.Err()
		}
		return hostRunner(ctx, c)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := gitx.Transfer(ctx, gitx.SandboxRepo("stalls", stalling, src), commit, gitx.HostRepo(dst),
		"refs/jailbee/sandboxes/stalls/main", gitx.TransferOptions{IdleTimeout: 200 * time.Millisecond})
	if !errors.Is(err, gitx.ErrTransferStalled) {
		t.Fatalf("transfer from a stalled source: %v, want ErrTransferStalled", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the transfer ran to its overall deadline")
	}
	if out := git(t, dst, "for-each-ref", "refs/jailbee/"); out != "" {
		t.Fatalf("the destination got refs: %q", out)
	}
}
