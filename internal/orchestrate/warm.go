package orchestrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/config"
	"agentbox/internal/gitx"
	"agentbox/internal/untrusted"
	"agentbox/internal/warmtar"
)

// Bounds of warm path seeding.
const (
	// MaxWarmBytes bounds the tar stream of one fork's warm paths: past it
	// the seeding stops (the fork goes on without the rest).
	MaxWarmBytes = 4 << 30
	// warmTimeout bounds one fork's seeding.
	warmTimeout = 10 * time.Minute
)

// errWarmTooLarge: the warm paths outgrew MaxWarmBytes.
var errWarmTooLarge = fmt.Errorf("warm paths larger than %d bytes", int64(MaxWarmBytes))

// seedWarmPaths copies the orchestrator's git-ignored build outputs that
// match globs into the fresh fork's checkout, as a tar stream from tar in
// the orchestrator's sandbox to tar in the child's, through the broker's
// pipe: no host process reads or writes either tree. It only skips, with
// a note in the worker log, and never fails the fork: a source that is
// dirty or not at the fork's commit, a glob that matches nothing, a
// stream that fails or is too large.
func (o *Orchestrator) seedWarmPaths(ctx context.Context, orch, child, commit string, globs []string, log io.Writer) {
	if len(globs) == 0 {
		return
	}
	note := func(format string, args ...any) {
		fmt.Fprintf(log, "%s warm paths: %s\n", stamp(), fmt.Sprintf(format, args...))
	}
	ctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	work, err := o.readWork(ctx, orch)
	switch {
	case err != nil:
		note("skipped: the source's repository does not answer")
		return
	case work.dirty:
		note("skipped: the source has uncommitted changes")
		return
	case work.head != commit:
		note("skipped: the source is at %s, not at the fork's commit %s", short(work.head), short(commit))
		return
	}
	entries, err := gitx.IgnoredEntries(ctx, o.checkout(orch))
	if err != nil {
		note("skipped: the source's ignored files could not be listed")
		o.logger().Warn("warm paths: list", "sandbox", orch, "err", err)
		return
	}
	paths := matchWarm(globs, entries, note)
	if len(paths) == 0 {
		return
	}
	n, err := o.copyTree(ctx, orch, child, paths)
	if err != nil {
		note("stopped after %d bytes: %v", n, err)
		return
	}
	note("seeded %d paths (%d bytes of tar)", len(paths), n)
}

// matchWarm returns the entries (trailing "/" dropped) that a glob
// matches, noting each glob that matches none.
func matchWarm(globs, entries []string, note func(string, ...any)) []string {
	seen := map[string]bool{}
	var paths []string
	for _, g := range globs {
		matched := false
		for _, e := range entries {
			p := strings.TrimSuffix(e, "/")
			if p == "" || !config.MatchWarmPath(g, p) {
				continue
			}
			matched = true
			if !seen[p] {
				seen[p] = true
				paths = append(paths, p)
			}
		}
		if !matched {
			note("`%s` matches no ignored path of the source", g)
		}
	}
	return paths
}

// copyTree streams paths (relative to the checkout) from sandbox src to
// sandbox dst, tar in src and `jailbee _warm-extract` in dst, at most
// MaxWarmBytes, and returns the bytes that went through. Each runs in its
// own sandbox as its agent user. src's stream is src's to make, so dst
// does not run tar on it: the helper (warmtar) writes below dst's
// checkout only, through no symlink, and only files, directories and
// symlinks, none named .git.
func (o *Orchestrator) copyTree(ctx context.Context, src, dst string, paths []string) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	counted := &boundedPipe{w: pw, left: MaxWarmBytes}
	srcDone := make(chan error, 1)
	go func() {
		code, err := o.Runner(src).Run(ctx, gitx.Cmd{
			// --hard-dereference: the helper takes no hard links.
			Argv:   []string{"tar", "-c", "-f", "-", "--hard-dereference", "--null", "-T", "-"},
			Dir:    backend.WorkspacePath,
			Stdin:  strings.NewReader(strings.Join(paths, "\x00") + "\x00"),
			Stdout: counted,
		})
		switch {
		case counted.err != nil:
			err = counted.err
		case err == nil && code != 0:
			err = fmt.Errorf("tar in the source exited %d", code)
		}
		pw.CloseWithError(err) // nil: the reader sees the end
		srcDone <- err
	}()
	why := &untrusted.Buffer{Max: warmtar.MaxErrorBytes}
	code, err := o.Runner(dst).Run(ctx, gitx.Cmd{
		Argv:   warmtar.Argv(),
		Dir:    backend.WorkspacePath,
		Stdin:  pr,
		Stderr: why,
	})
	if err == nil && code != 0 {
		err = fmt.Errorf("the fork refused the stream: %s", untrusted.Printable(strings.TrimSpace(why.String())))
	}
	pr.CloseWithError(errors.New("the fork's tar ended")) // unblocks the source
	if err != nil {
		cancel()
	}
	if srcErr := <-srcDone; srcErr != nil {
		return counted.n, srcErr
	}
	return counted.n, err
}

// boundedPipe counts what it passes on and fails past its bound.
type boundedPipe struct {
	w    io.Writer
	n    int64
	left int64
	err  error
}

func (b *boundedPipe) Write(p []byte) (int, error) {
	if int64(len(p)) > b.left {
		b.err = errWarmTooLarge
		return 0, b.err
	}
	n, err := b.w.Write(p)
	b.n += int64(n)
	b.left -= int64(n)
	return n, err
}
