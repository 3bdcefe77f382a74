package pubjournal

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func openDir(t *testing.T) *Dir {
	t.Helper()
	d, err := Open(filepath.Join(t.TempDir(), "publish"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestJournalRoundTrip(t *testing.T) {
	d := openDir(t)
	err := d.Update("lead", "issue", "a.json", func(j *Journal) (*Journal, error) {
		if j != nil {
			t.Fatal("a new proposal has a journal")
		}
		return &Journal{Sandbox: "lead", Outbox: "issue", Name: "a.json", State: Running, Proposal: []byte(`{}`),
			Actions: []Action{{Kind: "create", State: Applied, URL: "u", Number: 3}, {Kind: "close", State: Prepared}}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	j, err := d.Load("lead", "issue", "a.json")
	if err != nil || j == nil || j.Next() != 1 || j.Actions[0].Number != 3 || j.Key() != "lead/issue/a.json" {
		t.Fatalf("%v %+v", err, j)
	}
	all, err := d.All()
	if err != nil || len(all) != 1 || all[0].Key() != "lead/issue/a.json" {
		t.Fatalf("%v %+v", err, all)
	}
}

func TestBudget(t *testing.T) {
	d := openDir(t)
	now := time.Unix(1_800_000_000, 0)
	if err := d.Reserve("lead", "p1", 20, 30, now); err != nil {
		t.Fatal(err)
	}
	if err := d.Reserve("lead", "p2", 10, 30, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	var be *BudgetError
	if err := d.Reserve("lead", "p3", 1, 30, now.Add(2*time.Minute)); !errors.As(err, &be) || be.Used != 30 || !be.Frees.Equal(now.Add(time.Hour)) {
		t.Fatalf("past the budget: %v", err)
	}
	if err := d.Reserve("other", "p3", 1, 30, now); err != nil {
		t.Fatalf("budgets are per orchestrator: %v", err)
	}
	if err := d.Refund("lead", "p2"); err != nil {
		t.Fatal(err)
	}
	if err := d.Reserve("lead", "p3", 10, 30, now.Add(2*time.Minute)); err != nil {
		t.Fatalf("after a refund: %v", err)
	}
	if err := d.Reserve("lead", "p4", 20, 30, now.Add(time.Hour)); err != nil {
		t.Fatalf("an hour later the first reservation left the window: %v", err)
	}
	if used, _ := d.Used("lead", now.Add(time.Hour)); used != 30 {
		t.Fatalf("used %d", used)
	}
}
