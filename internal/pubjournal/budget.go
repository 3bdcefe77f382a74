package pubjournal

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"agentbox/internal/secfs"
)

// Window is the budget's sliding window.
const Window = time.Hour

// Reservation is n actions reserved at At (Unix ms) by publish manifest Ref.
type Reservation struct {
	At  int64  `json:"at_ms"`
	N   int    `json:"n"`
	Ref string `json:"ref"`
}

// BudgetError is a reservation the budget cannot take; its text is for
// the requester.
type BudgetError struct {
	Used, Want, Limit int
	Frees             time.Time // when the oldest reservation leaves the window
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("publish budget exhausted: %d of %d actions used in the last hour, %d more wanted; the oldest leaves the window at %s",
		e.Used, e.Limit, e.Want, e.Frees.UTC().Format(time.RFC3339))
}

func (d *Dir) budgetPath(sandbox string) string {
	return filepath.Join(d.root, sandbox, "budget.json")
}

// bytesPath holds sandbox's byte reservations: Reservations whose N is
// bytes a publish brought to the host.
func (d *Dir) bytesPath(sandbox string) string {
	return filepath.Join(d.root, sandbox, "bytes.json")
}

// ByteBudgetError is a byte reservation the budget cannot take: nothing is
// left of it in the window; its text is for the requester.
type ByteBudgetError struct {
	Used, Limit int64
	Frees       time.Time // when the oldest reservation leaves the window
}

func (e *ByteBudgetError) Error() string {
	return fmt.Sprintf("publish transfer budget exhausted: %d of %d bytes brought to the host in the last hour (publish.bytes_per_hour); the oldest leaves the window at %s",
		e.Used, e.Limit, e.Frees.UTC().Format(time.RFC3339))
}

// ReserveBytes reserves for ref, durably, what is left of sandbox's byte
// budget (limit per Window, at now), at most most, and returns how many
// bytes that is; with nothing left, a *ByteBudgetError. SettleBytes then
// sets it to what was used: until it does (a broker that died meanwhile),
// the whole reservation counts.
func (d *Dir) ReserveBytes(sandbox, ref string, most, limit int64, now time.Time) (int64, error) {
	var granted int64
	err := d.update(d.bytesPath(sandbox), sandbox, func(rs []Reservation) ([]Reservation, error) {
		rs = inWindow(rs, now)
		var used int64
		for _, r := range rs {
			used += int64(r.N)
		}
		if used >= limit {
			frees := now
			if len(rs) > 0 {
				frees = time.UnixMilli(rs[0].At).Add(Window)
			}
			return nil, &ByteBudgetError{Used: used, Limit: limit, Frees: frees}
		}
		granted = min(most, limit-used)
		return append(rs, Reservation{At: now.UnixMilli(), N: int(granted), Ref: ref}), nil
	})
	return granted, err
}

// SettleBytes sets the newest byte reservation of ref in sandbox's budget
// to n bytes, or to what it reserved if n is more.
func (d *Dir) SettleBytes(sandbox, ref string, n int64) error {
	return d.update(d.bytesPath(sandbox), sandbox, func(rs []Reservation) ([]Reservation, error) {
		for i := len(rs) - 1; i >= 0; i-- {
			if rs[i].Ref == ref {
				rs[i].N = int(min(int64(rs[i].N), max(n, 0)))
				break
			}
		}
		return rs, nil
	})
}

// inWindow drops the reservations of rs that left the window at now.
func inWindow(rs []Reservation, now time.Time) []Reservation {
	return slices.DeleteFunc(rs, func(r Reservation) bool { return now.Sub(time.UnixMilli(r.At)) >= Window })
}

// Reserve takes n actions of sandbox's budget (limit per Window, at now)
// for ref, durably, or returns a *BudgetError.
func (d *Dir) Reserve(sandbox, ref string, n, limit int, now time.Time) error {
	return d.update(d.budgetPath(sandbox), sandbox, func(rs []Reservation) ([]Reservation, error) {
		rs = inWindow(rs, now)
		used := 0
		for _, r := range rs {
			used += r.N
		}
		if used+n > limit {
			frees := now
			if len(rs) > 0 {
				frees = time.UnixMilli(rs[0].At).Add(Window)
			}
			return nil, &BudgetError{Used: used, Want: n, Limit: limit, Frees: frees}
		}
		return append(rs, Reservation{At: now.UnixMilli(), N: n, Ref: ref}), nil
	})
}

// Refund gives back the newest reservation ref made of sandbox's budget:
// the one a refused manifest has just made. An older one under the same
// id stays spent: the store forgets old manifest ids, so a resend of a
// forgotten id that is refused must not give back what the first one
// used.
func (d *Dir) Refund(sandbox, ref string) error {
	return d.update(d.budgetPath(sandbox), sandbox, func(rs []Reservation) ([]Reservation, error) {
		for i := len(rs) - 1; i >= 0; i-- {
			if rs[i].Ref == ref {
				return slices.Delete(rs, i, i+1), nil
			}
		}
		return rs, nil
	})
}

// Used returns sandbox's reservations still in the window at now.
func (d *Dir) Used(sandbox string, now time.Time) (int, error) {
	unlock, err := d.lock()
	if err != nil {
		return 0, err
	}
	defer unlock()
	rs, err := d.loadReservations(d.budgetPath(sandbox))
	used := 0
	for _, r := range inWindow(rs, now) {
		used += r.N
	}
	return used, err
}

// update applies fn to the reservations in the file at path (sandbox's),
// under the directory's lock, and writes them back durably.
func (d *Dir) update(path, sandbox string, fn func([]Reservation) ([]Reservation, error)) error {
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	rs, err := d.loadReservations(path)
	if err != nil {
		return err
	}
	if rs, err = fn(rs); err != nil {
		return err
	}
	if err := secfs.EnsurePrivateDir(filepath.Join(d.root, sandbox)); err != nil {
		return err
	}
	data, err := json.Marshal(rs)
	if err != nil {
		return err
	}
	return secfs.WriteFileAtomic(path, data, 0o600)
}

func (d *Dir) loadReservations(path string) ([]Reservation, error) {
	data, err := secfs.ReadFileNoFollow(path, maxJournalBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rs []Reservation
	return rs, json.Unmarshal(data, &rs)
}
