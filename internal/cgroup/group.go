package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Group is one sandbox's group: a directory per v1 controller (pids,
// memory, cpu, and freezer when mounted), or one directory on v2.
type Group struct {
	h    *Hierarchy
	name string
	// controller -> the group's directory for it; on v2 all the same.
	dirs map[string]string
}

// Open returns the group called name without touching the file system.
func (h *Hierarchy) Open(name string) (*Group, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	g := &Group{h: h, name: name, dirs: map[string]string{}}
	if h.version == 2 {
		dir := filepath.Join(h.v2Mount, Parent, name)
		for _, c := range needed {
			g.dirs[c] = dir
		}
		return g, nil
	}
	for _, c := range h.v1Controllers() {
		g.dirs[c] = filepath.Join(h.v1[c], Parent, name)
	}
	return g, nil
}

// Name is the group's name.
func (g *Group) Name() string { return g.name }

// uniqueDirs are the group's directories, once each (co-mounted v1
// controllers share one), in join order.
func (g *Group) uniqueDirs() []string {
	var out []string
	for _, c := range append(slices.Clone(needed), freezer) {
		if d, ok := g.dirs[c]; ok && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// Create makes the group <mount>/jailbee/<name> (in every v1 controller,
// or once on v2, creating jailbee and enabling +pids +memory +cpu in the
// cgroup.subtree_control files above it on v2 where they are not yet) and
// writes l. An existing group is reused and its limits rewritten. If
// writing the limits fails, directories this call created are removed.
func (h *Hierarchy) Create(name string, l Limits) (*Group, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	g, err := h.Open(name)
	if err != nil {
		return nil, err
	}
	var created []string
	if h.version == 2 {
		created, err = g.createV2()
	} else {
		created, err = g.createV1()
	}
	if err == nil {
		err = g.setLimits(l)
	}
	if err != nil {
		for _, d := range created {
			unix.Rmdir(d) // best effort: the error below is what matters
		}
		return nil, fmt.Errorf("cgroup: create %s: %w", name, err)
	}
	return g, nil
}

func (g *Group) createV1() (created []string, err error) {
	for _, dir := range g.uniqueDirs() {
		if _, err := g.h.mkdir(filepath.Dir(dir)); err != nil {
			return created, err
		}
		isNew, err := g.h.mkdir(dir)
		if isNew {
			created = append(created, dir)
		}
		if err != nil {
			return created, err
		}
	}
	return created, nil
}

func (g *Group) createV2() (created []string, err error) {
	root := g.h.v2Mount
	parent := filepath.Join(root, Parent)
	// Root first: a child's controllers are those enabled in its parent's
	// subtree_control, and a fake tree only learns them at mkdir.
	if err := g.h.enableV2(root); err != nil {
		return nil, err
	}
	if _, err := g.h.mkdir(parent); err != nil {
		return nil, err
	}
	if err := g.h.enableV2(parent); err != nil {
		return nil, err
	}
	dir := g.dirs["pids"]
	isNew, err := g.h.mkdir(dir)
	if isNew {
		created = append(created, dir)
	}
	return created, err
}

// enableV2 enables the needed controllers for dir's children unless all
// already are (a write needs dir to hold no processes, except at the root,
// so a parent already set up by an administrator is left alone). When one
// is missing all are written: enabling an enabled one is a no-op.
func (h *Hierarchy) enableV2(dir string) error {
	ctl := filepath.Join(dir, "cgroup.subtree_control")
	if b, err := readControl(ctl); err != nil {
		return err
	} else if containsAll(strings.Fields(string(b)), needed) {
		return nil
	}
	var add []string
	for _, c := range needed {
		add = append(add, "+"+c)
	}
	avail, err := readControl(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	for _, c := range needed {
		if !slices.Contains(strings.Fields(string(avail)), c) {
			return fmt.Errorf("controller %s is not available in %s (not in its cgroup.controllers): enable it in the parent's cgroup.subtree_control", c, dir)
		}
	}
	return writeControl(ctl, strings.Join(add, " "))
}

// mkdir creates dir (its parent must exist) and reports whether it did. An
// existing directory is fine; anything else at that path (a symlink) is not.
func (h *Hierarchy) mkdir(dir string) (bool, error) {
	err := unix.Mkdir(dir, dirMode)
	if errors.Is(err, unix.EEXIST) {
		fi, err := os.Lstat(dir)
		if err != nil {
			return false, err
		}
		if !fi.IsDir() {
			return false, fmt.Errorf("%s exists and is not a directory", dir)
		}
		return false, nil
	}
	if err != nil {
		return false, &fs.PathError{Op: "mkdir", Path: dir, Err: err}
	}
	if h.onMkdir != nil {
		if err := h.onMkdir(dir); err != nil {
			return true, err
		}
	}
	return true, nil
}

// v1MemoryUnlimited is what a v1 memory limit reads when unset:
// PAGE_COUNTER_MAX pages, i.e. LONG_MAX rounded down to a page.
func v1MemoryUnlimited() int64 {
	ps := int64(os.Getpagesize())
	return math.MaxInt64 / ps * ps
}

// v1Shares converts a v2 weight (0: the default) to cpu.shares.
func v1Shares(weight int) int64 {
	if weight == 0 {
		weight = DefaultCPUWeight
	}
	return max(v1MinShares, int64(weight)*v1SharesPerDefaultWeight/DefaultCPUWeight)
}

// v1Weight is v1Shares' inverse: rounding up recovers the exact weight that
// was set, since shares was rounded down from weight*10.24.
func v1Weight(shares int64) int {
	return int((shares*DefaultCPUWeight + v1SharesPerDefaultWeight - 1) / v1SharesPerDefaultWeight)
}

func (g *Group) setLimits(l Limits) error {
	if err := g.writePidsMax(l.Pids); err != nil {
		return err
	}
	if g.h.version == 2 {
		mem, swap := "max", "max"
		if l.MemoryBytes != 0 {
			mem, swap = strconv.FormatInt(l.MemoryBytes, 10), "0"
		}
		dir := g.dirs["memory"]
		if err := writeControl(filepath.Join(dir, "memory.max"), mem); err != nil {
			return err
		}
		// Absent without swap accounting; then there is no swap to limit.
		if err := writeControl(filepath.Join(dir, "memory.swap.max"), swap); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		weight := l.CPUWeight
		if weight == 0 {
			weight = DefaultCPUWeight
		}
		return writeControl(filepath.Join(dir, "cpu.weight"), strconv.Itoa(weight))
	}
	if err := g.setMemoryV1(l.MemoryBytes); err != nil {
		return err
	}
	return writeControl(filepath.Join(g.dirs["cpu"], "cpu.shares"), strconv.FormatInt(v1Shares(l.CPUWeight), 10))
}

// SetPids sets the group's task limit alone (0: none). A limit under the
// tasks it holds only stops new ones.
func (g *Group) SetPids(n int64) error {
	if err := (Limits{Pids: n}).Validate(); err != nil {
		return err
	}
	if err := g.writePidsMax(n); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	return nil
}

func (g *Group) writePidsMax(n int64) error {
	v := "max"
	if n != 0 {
		v = strconv.FormatInt(n, 10)
	}
	return writeControl(filepath.Join(g.dirs["pids"], "pids.max"), v)
}

// Tasks is how many tasks (processes and threads) the group holds now:
// pids.current.
func (g *Group) Tasks() (int64, error) {
	n, err := readInt(filepath.Join(g.dirs["pids"], "pids.current"))
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	return n, nil
}

// setMemoryV1 sets memory.limit_in_bytes and, when swap accounting is on,
// memory.memsw.limit_in_bytes (memory plus swap) to the same value so swap
// cannot extend the limit. The kernel refuses (EINVAL) any write that would
// leave memsw below limit_in_bytes, so a rise writes memsw first and a cut
// writes limit_in_bytes first.
func (g *Group) setMemoryV1(bytes int64) error {
	dir := g.dirs["memory"]
	limitFile := filepath.Join(dir, "memory.limit_in_bytes")
	memswFile := filepath.Join(dir, "memory.memsw.limit_in_bytes")
	value, want := "-1", v1MemoryUnlimited()
	if bytes != 0 {
		value, want = strconv.FormatInt(bytes, 10), bytes
	}
	cur, err := readInt(memswFile)
	if errors.Is(err, fs.ErrNotExist) {
		return writeControl(limitFile, value)
	}
	if err != nil {
		return err
	}
	order := []string{limitFile, memswFile}
	if want > cur {
		order = []string{memswFile, limitFile}
	}
	for _, f := range order {
		if err := writeControl(f, value); err != nil {
			return err
		}
	}
	return nil
}

// Limits reads back what the group's files hold. Pids and MemoryBytes are
// 0 when unlimited; CPUWeight is always reported (100 is the default).
func (g *Group) Limits() (Limits, error) {
	var l Limits
	pids, err := readInt(filepath.Join(g.dirs["pids"], "pids.max"))
	if err != nil {
		return l, err
	}
	l.Pids = max(pids, 0)
	if g.h.version == 2 {
		dir := g.dirs["memory"]
		mem, err := readInt(filepath.Join(dir, "memory.max"))
		if err != nil {
			return l, err
		}
		l.MemoryBytes = max(mem, 0)
		w, err := readInt(filepath.Join(dir, "cpu.weight"))
		if err != nil {
			return l, err
		}
		l.CPUWeight = int(w)
		return l, nil
	}
	mem, err := readInt(filepath.Join(g.dirs["memory"], "memory.limit_in_bytes"))
	if err != nil {
		return l, err
	}
	if mem < v1MemoryUnlimited() {
		l.MemoryBytes = mem
	}
	shares, err := readInt(filepath.Join(g.dirs["cpu"], "cpu.shares"))
	if err != nil {
		return l, err
	}
	l.CPUWeight = v1Weight(shares)
	return l, nil
}

// ProcsFiles are the cgroup.procs files a process writes "0" (itself) or
// its pid into, each of them in order, to join the group: one per v1
// mount (pids, memory, cpu, freezer), one on v2.
func (g *Group) ProcsFiles() []string {
	var out []string
	for _, d := range g.uniqueDirs() {
		out = append(out, filepath.Join(d, "cgroup.procs"))
	}
	return out
}

// Join moves process pid (0: the calling process), all its threads, into
// the group. Its children forked afterwards are born in it.
func (g *Group) Join(pid int) error {
	if pid < 0 {
		return fmt.Errorf("cgroup: join %s: bad pid %d", g.name, pid)
	}
	for _, f := range g.ProcsFiles() {
		if err := writeControl(f, strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("cgroup: join %s: %w", g.name, err)
		}
	}
	return nil
}

// Pids lists every process in the group (on v1, in any of its controllers),
// sorted. A group missing everywhere is an error wrapping fs.ErrNotExist.
func (g *Group) Pids() ([]int, error) {
	var out []int
	found := false
	for _, f := range g.ProcsFiles() {
		b, err := readControl(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone from this controller; the others still count
		}
		if err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		found = true
		for _, s := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(s)
			if err != nil {
				return nil, fmt.Errorf("cgroup: %s: %w", f, err)
			}
			out = append(out, pid)
		}
	}
	if !found {
		return nil, fmt.Errorf("cgroup: group %s: %w", g.name, fs.ErrNotExist)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Kill SIGKILLs every process in the group until it is empty, or until ctx
// ends (then the error says how many are left). On v2 it writes
// cgroup.kill when the kernel has it (5.14+), which kills atomically; else
// it freezes the group first (v2 cgroup.freeze, or the v1 freezer when
// mounted) so a fork loop cannot outrun it, kills everything, thaws so the
// signals are delivered, and repeats. A missing group is empty.
func (g *Group) Kill(ctx context.Context) error {
	var freeze, thaw func(context.Context) error
	if g.h.version == 2 {
		dir := g.dirs["pids"]
		if exists(filepath.Join(dir, "cgroup.kill")) {
			return g.killLoop(ctx, func() error {
				return writeControl(filepath.Join(dir, "cgroup.kill"), "1")
			})
		}
		if exists(filepath.Join(dir, "cgroup.freeze")) {
			freeze = func(ctx context.Context) error { return g.freezeV2(ctx, "1") }
			thaw = func(ctx context.Context) error { return g.freezeV2(ctx, "0") }
		}
	} else if dir, ok := g.dirs[freezer]; ok {
		state := filepath.Join(dir, "freezer.state")
		freeze = func(ctx context.Context) error {
			if err := writeControl(state, "FROZEN"); err != nil {
				return err
			}
			return waitFor(ctx, func() bool {
				b, err := readControl(state)
				return err != nil || strings.TrimSpace(string(b)) == "FROZEN"
			})
		}
		thaw = func(context.Context) error { return writeControl(state, "THAWED") }
	}
	return g.killLoop(ctx, func() (err error) {
		if freeze != nil {
			switch err := freeze(ctx); {
			case err == nil:
				// A fresh context: a group must never be left frozen.
				defer func() {
					if terr := thaw(context.Background()); err == nil {
						err = terr
					}
				}()
			case errors.Is(err, fs.ErrNotExist):
				// This group has no freezer directory: kill unfrozen.
			default:
				thaw(context.Background())
				return err
			}
		}
		pids, err := g.Pids()
		if err != nil {
			return err
		}
		return g.signal(pids)
	})
}

// killLoop runs one kill round until the group is empty.
func (g *Group) killLoop(ctx context.Context, round func() error) error {
	for {
		pids, err := g.Pids()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("cgroup: kill %s: %d processes left: %w", g.name, len(pids), ctx.Err())
		}
		if err := round(); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cgroup: kill %s: %w", g.name, err)
		}
		select { // then look again, even if ctx ended: the round may have emptied it
		case <-ctx.Done():
		case <-time.After(killPoll):
		}
	}
}

// freezeV2 writes cgroup.freeze and waits (up to freezeWait) until
// cgroup.events reports the new state.
func (g *Group) freezeV2(ctx context.Context, v string) error {
	dir := g.dirs["pids"]
	if err := writeControl(filepath.Join(dir, "cgroup.freeze"), v); err != nil {
		return err
	}
	return waitFor(ctx, func() bool {
		b, err := readControl(filepath.Join(dir, "cgroup.events"))
		return err != nil || slices.Contains(strings.Split(string(b), "\n"), "frozen "+v)
	})
}

// waitFor polls done until it holds, freezeWait passes (then the caller
// goes on regardless) or ctx ends.
func waitFor(ctx context.Context, done func() bool) error {
	deadline := time.Now().Add(freezeWait)
	for !done() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(freezePoll):
		}
	}
	return nil
}

// signal SIGKILLs pids. Through pidfds where the kernel has them (5.3+): a
// pidfd is opened for each pid, the group is listed again, and only the
// pidfds whose pid is still listed are signalled, so a pid that exited and
// was reused by a process outside the group is never hit.
func (g *Group) signal(pids []int) error {
	fds := map[int]int{}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if errors.Is(err, unix.ENOSYS) {
			// No pidfds: plain kill (under a freezer no pid can be reused).
			for _, pid := range pids {
				unix.Kill(pid, unix.SIGKILL)
			}
			return nil
		}
		if err == nil {
			fds[pid] = fd
		}
	}
	again, err := g.Pids()
	if err != nil {
		return err
	}
	for pid, fd := range fds {
		if _, found := slices.BinarySearch(again, pid); found {
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) // ESRCH: already gone
		}
	}
	return nil
}

// Remove deletes the group's directories. EBUSY (processes still leaving)
// is retried for up to removeBusyTimeout; a missing group is not an error.
// The shared jailbee parent stays.
func (g *Group) Remove() error {
	for _, dir := range g.uniqueDirs() {
		deadline := time.Now().Add(removeBusyTimeout)
		for {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if errors.Is(err, unix.EBUSY) && time.Now().Before(deadline) {
				time.Sleep(removeBusyPoll)
				continue
			}
			return fmt.Errorf("cgroup: remove %s: %w", g.name, &fs.PathError{Op: "rmdir", Path: dir, Err: err})
		}
	}
	return nil
}
