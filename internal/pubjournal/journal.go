// Package pubjournal keeps publish's durable records under the broker's
// state dir (never in a sandbox): a journal per outbox proposal, recording
// each action as prepared (before the forge call), applied (with its URL)
// or uncertain, and each orchestrator's sliding-hour action budget. Every
// write is atomic and durable (secfs.WriteFileAtomic: fsync + rename)
// under an flock of the directory's lock file, so a crash leaves either
// the old record or the new one.
package pubjournal

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/manifest"
	"agentbox/internal/secfs"
	"agentbox/internal/wire"
)

// Action states.
const (
	Pending   = ""          // not tried yet
	Prepared  = "prepared"  // about to be sent: the forge call may be in flight
	Applied   = "applied"   // the forge answered success
	Uncertain = "uncertain" // may or may not have been applied: a person decides
	Failed    = "failed"    // the forge certainly refused it
)

// Proposal states.
const (
	Running = "running" // a worker is applying its actions
	Done    = "done"    // every action applied
	Halted  = "failed"  // stopped at a certainly refused action
	Blocked = "blocked" // an action is uncertain: waits for `jailbee outbox resolve`
)

// Action and Journal are the wire's shapes (the admin socket's outbox
// ops answer them as they are stored). Journal.Proposal is the canonical
// manifest (manifest.IssueProposal.Encode or PRManifest.Encode): what is
// applied, whatever the outbox file holds later.
type (
	Action  = wire.OutboxAction
	Journal = wire.OutboxJournal
)

// Dir holds the journals and budgets: <root>/<sandbox>/<outbox>/<name>
// and <root>/<sandbox>/budget.json.
type Dir struct {
	root string
	mu   sync.Mutex // with the flock: one writer at a time
}

// Open makes (or checks) root, a private directory.
func Open(root string) (*Dir, error) {
	if err := secfs.EnsurePrivateDir(root); err != nil {
		return nil, err
	}
	return &Dir{root: root}, nil
}

// lock holds the in-process mutex and an flock of <root>/lock until the
// returned func is called.
func (d *Dir) lock() (func(), error) {
	d.mu.Lock()
	f, err := os.OpenFile(filepath.Join(d.root, "lock"), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		d.mu.Unlock()
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		d.mu.Unlock()
		return nil, err
	}
	return func() { f.Close(); d.mu.Unlock() }, nil
}

// Update runs fn on the journal of sandbox/outbox/name (nil when there is
// none) under the lock, and saves what fn returns (nil: nothing saved).
func (d *Dir) Update(sandbox, outbox, name string, fn func(*Journal) (*Journal, error)) error {
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	j, err := d.load(sandbox, outbox, name)
	if err != nil {
		return err
	}
	next, err := fn(j)
	if err != nil || next == nil {
		return err
	}
	return d.save(next)
}

// Load returns the journal of sandbox/outbox/name; nil when there is none.
func (d *Dir) Load(sandbox, outbox, name string) (*Journal, error) {
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return d.load(sandbox, outbox, name)
}

// State returns the state of the journal of sandbox/outbox/name, "" when
// there is none. It reads the journal only up to its "state" (written
// before the proposal): the pending cap asks it of every staged name, up
// to 128, on each publish and on the broker's executor, and loading them
// whole (up to maxJournalBytes each) took seconds that every sandbox
// waited for.
func (d *Dir) State(sandbox, outbox, name string) (string, error) {
	unlock, err := d.lock()
	if err != nil {
		return "", err
	}
	defer unlock()
	var state string
	seen := false
	found, err := d.walk(sandbox, outbox, name, func(key string, dec *json.Decoder) (bool, error) {
		if key != "state" {
			return false, dec.Decode(new(json.RawMessage))
		}
		seen = true
		return true, dec.Decode(&state)
	})
	if err != nil || !found {
		return "", err
	}
	if !seen {
		return "", fmt.Errorf("journal %s/%s/%s: no state", sandbox, outbox, name)
	}
	return state, nil
}

func (d *Dir) path(sandbox, outbox, name string) string {
	return filepath.Join(d.root, sandbox, outbox, name)
}

// Bounds of a journal, written and read back alike: a journal too large
// to read would stop its worker without a final status and make All (so
// `jailbee outbox ls` and a restarted broker's recovery, for every
// sandbox) fail.
const (
	// maxActionRecords is room for what a journal holds besides its
	// canonical proposal (manifest.MaxCanonicalBytes): each action's
	// state, URL and the forge's message.
	maxActionRecords = 1 << 20
	maxJournalBytes  = manifest.MaxCanonicalBytes + maxActionRecords
)

// ErrTooLarge: a journal past maxJournalBytes is not written.
var ErrTooLarge = errors.New("publish journal larger than its bound")

func (d *Dir) load(sandbox, outbox, name string) (*Journal, error) {
	data, err := secfs.ReadFileNoFollow(d.path(sandbox, outbox, name), maxJournalBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var j Journal
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("journal %s/%s/%s: %w", sandbox, outbox, name, err)
	}
	return &j, nil
}

// MaxJournals bounds the journals kept per sandbox, both outboxes
// together. Journals are kept by sandbox name, outliving the sandbox, and
// an orchestrator stages a new name for each proposal: at the default
// budget (30 actions an hour) this is more than 8 hours of proposals of
// one action each. Past it, a new journal makes room by removing the
// oldest finished ones (done or failed); running and blocked ones stay.
const MaxJournals = 256

// ErrTooManyJournals: a sandbox has MaxJournals journals and none of them
// is finished, so no new one is written.
var ErrTooManyJournals = errors.New("publish journals at their bound, none finished")

func (d *Dir) save(j *Journal) error {
	dir := filepath.Join(d.root, j.Sandbox, j.Outbox)
	if err := secfs.EnsurePrivateDir(dir); err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(dir, j.Name)); errors.Is(err, os.ErrNotExist) {
		if err := d.makeRoom(j.Sandbox); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	j.Version = 1
	j.Updated = time.Now().UnixMilli()
	data, err := json.Marshal(j)
	if err != nil {
		return err
	}
	if len(data) > maxJournalBytes {
		return fmt.Errorf("journal %s: %w (%d bytes)", j.Key(), ErrTooLarge, maxJournalBytes)
	}
	return secfs.WriteFileAtomic(filepath.Join(dir, j.Name), data, 0o600)
}

// journalNames lists the journals of sandbox/outbox: regular files named
// as outbox manifests are (not the temporary file of a write a kill -9
// cut short).
func (d *Dir) journalNames(sandbox, outbox string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(d.root, sandbox, outbox))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Type().IsRegular() && manifest.ValidPublishName(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// makeRoom keeps sandbox's journals under MaxJournals before a new one is
// written: past it, the oldest finished journals (by their last update)
// are removed; with too few finished it returns ErrTooManyJournals and
// removes none. The lock is held.
func (d *Dir) makeRoom(sandbox string) error {
	type entry struct {
		outbox, name string
		updated      int64
	}
	var all []entry
	for _, ob := range dirNames(filepath.Join(d.root, sandbox)) {
		names, err := d.journalNames(sandbox, ob)
		if err != nil {
			return err
		}
		for _, n := range names {
			all = append(all, entry{outbox: ob, name: n})
		}
	}
	excess := len(all) + 1 - MaxJournals
	if excess <= 0 {
		return nil
	}
	var finished []entry
	for _, e := range all {
		j, err := d.loadHead(sandbox, e.outbox, e.name, func(*Journal) bool { return false })
		if err != nil {
			return err
		}
		if j.State == Done || j.State == Halted {
			e.updated = j.Updated
			finished = append(finished, e)
		}
	}
	if len(finished) < excess {
		return fmt.Errorf("%s: %w (%d)", sandbox, ErrTooManyJournals, MaxJournals)
	}
	slices.SortStableFunc(finished, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.updated, b.updated), cmp.Compare(a.outbox+"/"+a.name, b.outbox+"/"+b.name))
	})
	touched := map[string]bool{}
	for _, e := range finished[:excess] {
		if err := os.Remove(d.path(sandbox, e.outbox, e.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		touched[e.outbox] = true
	}
	for ob := range touched {
		if err := secfs.FsyncDir(filepath.Join(d.root, sandbox, ob)); err != nil {
			return err
		}
	}
	return nil
}

// All returns every journal, ordered by key, with its proposal only when
// it is running (what a restarted broker's recovery writes back): the
// journals of every sandbox accumulate, up to maxJournalBytes each, and
// all of them whole would be read into memory at each start and each
// `jailbee outbox ls`. The proposal is written last, so it is not read.
func (d *Dir) All() ([]*Journal, error) {
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	var out []*Journal
	for _, sb := range dirNames(d.root) {
		for _, ob := range dirNames(filepath.Join(d.root, sb)) {
			names, err := d.journalNames(sb, ob)
			if err != nil {
				return nil, err
			}
			for _, name := range names {
				j, err := d.loadHead(sb, ob, name, func(j *Journal) bool { return j.State == Running })
				if err != nil {
					return nil, err
				}
				if j != nil {
					out = append(out, j)
				}
			}
		}
	}
	return out, nil
}

// loadHead is load reading the proposal only when want says so, from the
// fields before it. A journal written before the proposal went last has
// it in the middle: it is then read through, and dropped.
func (d *Dir) loadHead(sandbox, outbox, name string, want func(*Journal) bool) (*Journal, error) {
	var j Journal
	seenActions := false
	found, err := d.walk(sandbox, outbox, name, func(key string, dec *json.Decoder) (bool, error) {
		var into any
		switch key {
		case "version":
			into = &j.Version
		case "sandbox":
			into = &j.Sandbox
		case "outbox":
			into = &j.Outbox
		case "name":
			into = &j.Name
		case "ref":
			into = &j.Ref
		case "state":
			into = &j.State
		case "actions":
			into, seenActions = &j.Actions, true
		case "updated_ms":
			into = &j.Updated
		case "proposal":
			if want(&j) {
				into = &j.Proposal
			} else if seenActions {
				return true, nil // last: nothing more to read
			}
		}
		if into == nil {
			into = new(json.RawMessage)
		}
		return false, dec.Decode(into)
	})
	if err != nil || !found {
		return nil, err
	}
	return &j, nil
}

// walk hands each top-level key of the journal of sandbox/outbox/name,
// opened without following a symlink and read within maxJournalBytes, to
// visit, which reads the key's value from dec unless it stops there.
// found is false when there is no journal.
func (d *Dir) walk(sandbox, outbox, name string, visit func(key string, dec *json.Decoder) (stop bool, err error)) (found bool, err error) {
	f, err := os.OpenFile(d.path(sandbox, outbox, name), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	bad := func(err error) (bool, error) {
		return true, fmt.Errorf("journal %s/%s/%s: %w", sandbox, outbox, name, err)
	}
	dec := json.NewDecoder(io.LimitReader(f, maxJournalBytes))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return bad(errors.New("not a JSON object"))
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		k, _ := key.(string)
		stop, err := visit(k, dec)
		if err != nil {
			return bad(err)
		}
		if stop {
			break
		}
	}
	return true, nil
}

// dirNames lists the directories in dir (os.ReadDir sorts them); none
// when it cannot be read.
func dirNames(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}
