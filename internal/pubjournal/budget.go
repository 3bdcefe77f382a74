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

// Reserve takes n actions of sandbox's budget (limit per Window, at now)
// for ref, durably, or returns a *BudgetError.
func (d *Dir) Reserve(sandbox, ref string, n, limit int, now time.Time) error {
	return d.updateBudget(sandbox, func(rs []Reservation) ([]Reservation, error) {
		rs = slices.DeleteFunc(rs, func(r Reservation) bool { return now.Sub(time.UnixMilli(r.At)) >= Window })
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
	return d.updateBudget(sandbox, func(rs []Reservation) ([]Reservation, error) {
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
	rs, err := d.loadBudget(sandbox)
	used := 0
	for _, r := range rs {
		if now.Sub(time.UnixMilli(r.At)) < Window {
			used += r.N
		}
	}
	return used, err
}

func (d *Dir) updateBudget(sandbox string, fn func([]Reservation) ([]Reservation, error)) error {
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	rs, err := d.loadBudget(sandbox)
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
	return secfs.WriteFileAtomic(d.budgetPath(sandbox), data, 0o600)
}

func (d *Dir) loadBudget(sandbox string) ([]Reservation, error) {
	data, err := secfs.ReadFileNoFollow(d.budgetPath(sandbox), maxJournalBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rs []Reservation
	return rs, json.Unmarshal(data, &rs)
}
