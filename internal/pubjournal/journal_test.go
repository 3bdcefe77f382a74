package pubjournal

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// TestByteBudget: a byte reservation takes what is left of the window's
// budget, at most what was asked; settled, it counts what was used
// (never more than it reserved); with the budget used to the byte, the
// next is refused until the oldest leaves the window; an unsettled one
// (a broker that died during its transfer) counts whole.
func TestByteBudget(t *testing.T) {
	d := openDir(t)
	now := time.Unix(1_800_000_000, 0)
	const limit = 1 << 20
	got, err := d.ReserveBytes("lead", "p1", 4<<30, limit, now)
	if err != nil || got != limit {
		t.Fatalf("the first reservation: %d %v, want the whole budget", got, err)
	}
	if err := d.SettleBytes("lead", "p1", 1000); err != nil {
		t.Fatal(err)
	}
	if got, err = d.ReserveBytes("lead", "p2", 100, limit, now.Add(time.Minute)); err != nil || got != 100 {
		t.Fatalf("a reservation within what is left: %d %v", got, err)
	}
	if err := d.SettleBytes("lead", "p2", 1<<30); err != nil { // more than it reserved
		t.Fatal(err)
	}
	if got, err = d.ReserveBytes("lead", "p3", 4<<30, limit, now.Add(2*time.Minute)); err != nil || got != limit-1100 {
		t.Fatalf("the rest of the budget: %d %v, want %d", got, err, limit-1100)
	}
	// p3 unsettled: it counts whole, and the budget is used to the byte.
	var be *ByteBudgetError
	if _, err := d.ReserveBytes("lead", "p4", 1, limit, now.Add(3*time.Minute)); !errors.As(err, &be) || be.Used != limit || !be.Frees.Equal(now.Add(time.Hour)) {
		t.Fatalf("at the budget: %v", err)
	}
	if !strings.Contains(be.Error(), "1048576 of 1048576 bytes brought to the host in the last hour (publish.bytes_per_hour)") {
		t.Fatalf("the refusal: %v", be)
	}
	if _, err := d.ReserveBytes("other", "p4", 1, limit, now); err != nil {
		t.Fatalf("budgets are per orchestrator: %v", err)
	}
	if got, err = d.ReserveBytes("lead", "p4", 4<<30, limit, now.Add(time.Hour)); err != nil || got != 1000 {
		t.Fatalf("an hour later the first reservation left the window: %d %v, want 1000", got, err)
	}
	// Byte and action budgets are apart.
	if err := d.Reserve("lead", "a1", 30, 30, now); err != nil {
		t.Fatal(err)
	}
}

// TestRefundGivesBackOnlyTheNewest: a manifest id the store forgot may
// come again; its refusal gives back what it reserved, not what the first
// manifest of that id used.
func TestRefundGivesBackOnlyTheNewest(t *testing.T) {
	d := openDir(t)
	now := time.Unix(1_800_000_000, 0)
	if err := d.Reserve("lead", "p1", 29, 30, now); err != nil {
		t.Fatal(err)
	}
	if err := d.Reserve("lead", "p1", 1, 30, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := d.Refund("lead", "p1"); err != nil {
		t.Fatal(err)
	}
	if used, err := d.Used("lead", now.Add(time.Minute)); err != nil || used != 29 {
		t.Fatalf("after refunding the resend: used %d (%v), want 29", used, err)
	}
	if err := d.Refund("lead", "p9"); err != nil {
		t.Fatalf("a refund of nothing: %v", err)
	}
}

// TestJournalAtItsBound: a journal of maxJournalBytes is written and read
// back; one byte more is not written (the journal before it stays).
func TestJournalAtItsBound(t *testing.T) {
	d := openDir(t)
	sized := func(n int) *Journal {
		j := &Journal{Version: 1, Sandbox: "lead", Outbox: "issue", Name: "big.json", State: Running, Updated: time.Now().UnixMilli(),
			Proposal: []byte(`""`), Actions: []Action{{Kind: "create"}}}
		data, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		j.Proposal = []byte(`"` + strings.Repeat("x", n-len(data)) + `"`)
		return j
	}
	if err := d.Update("lead", "issue", "big.json", func(*Journal) (*Journal, error) { return sized(maxJournalBytes), nil }); err != nil {
		t.Fatalf("a journal at the bound: %v", err)
	}
	j, err := d.Load("lead", "issue", "big.json")
	if err != nil || j == nil || len(j.Proposal) != len(sized(maxJournalBytes).Proposal) {
		t.Fatalf("read back: %v", err)
	}
	err = d.Update("lead", "issue", "big.json", func(*Journal) (*Journal, error) { return sized(maxJournalBytes + 1), nil })
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a journal past the bound: %v, want ErrTooLarge", err)
	}
	if all, err := d.All(); err != nil || len(all) != 1 || len(all[0].Proposal) != len(sized(maxJournalBytes).Proposal) {
		t.Fatalf("after the refused write: %v", err)
	}
}

// TestJournalStateReadsTheHeadOnly: State answers what Load does, from
// the fields before the proposal: a journal whose proposal is cut off
// (Load fails) still has its state read.
func TestJournalStateReadsTheHeadOnly(t *testing.T) {
	d := openDir(t)
	if st, err := d.State("lead", "issue", "none.json"); st != "" || err != nil {
		t.Fatalf("no journal: %q %v", st, err)
	}
	big := []byte(`"` + strings.Repeat("x", maxJournalBytes-4096) + `"`)
	if err := d.Update("lead", "issue", "a.json", func(*Journal) (*Journal, error) {
		return &Journal{Sandbox: "lead", Outbox: "issue", Name: "a.json", Ref: "p-1", State: Done, Proposal: big}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if st, err := d.State("lead", "issue", "a.json"); st != Done || err != nil {
		t.Fatalf("State = %q %v", st, err)
	}
	// Cut the file inside its proposal.
	path := d.path("lead", "issue", "a.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Load("lead", "issue", "a.json"); err == nil {
		t.Fatal("Load of a cut journal succeeded")
	}
	if st, err := d.State("lead", "issue", "a.json"); st != Done || err != nil {
		t.Fatalf("State of a cut journal = %q %v", st, err)
	}
}

// TestJournalAllLeavesProposalsUnread: All gives the proposal of a running
// journal only (what recovery writes back), and reads no other: a done
// journal cut inside its proposal (written last) is still listed. A
// journal written with its proposal before its actions is read through.
func TestJournalAllLeavesProposalsUnread(t *testing.T) {
	d := openDir(t)
	big := []byte(`"` + strings.Repeat("x", 1<<20) + `"`)
	for _, name := range []string{"done.json", "running.json"} {
		state := Done
		if name == "running.json" {
			state = Running
		}
		if err := d.Update("lead", "issue", name, func(*Journal) (*Journal, error) {
			return &Journal{Sandbox: "lead", Outbox: "issue", Name: name, State: state, Proposal: big,
				Actions: []Action{{Kind: "create", State: Applied, URL: "u"}}}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	path := d.path("lead", "issue", "done.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	old := `{"version":1,"sandbox":"lead","outbox":"pr","name":"old.json","ref":"p-9","state":"failed","proposal":{"version":1},"actions":[{"kind":"source","state":"failed"}],"updated_ms":7}`
	if err := os.MkdirAll(filepath.Dir(d.path("lead", "pr", "old.json")), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.path("lead", "pr", "old.json"), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	all, err := d.All()
	if err != nil || len(all) != 3 {
		t.Fatalf("All: %v, %d journals", err, len(all))
	}
	for _, j := range all {
		switch j.Name {
		case "done.json":
			if j.Proposal != nil || j.State != Done || len(j.Actions) != 1 || j.Actions[0].URL != "u" {
				t.Fatalf("done: %+v", j.Actions)
			}
		case "running.json":
			if len(j.Proposal) != len(big) || j.State != Running {
				t.Fatalf("running: %d bytes of proposal", len(j.Proposal))
			}
		case "old.json":
			if j.Proposal != nil || j.State != Halted || len(j.Actions) != 1 || j.Updated != 7 || j.Ref != "p-9" {
				t.Fatalf("old: %+v", j)
			}
		}
	}
}

// TestJournalAllSkipsAnInterruptedWrite: a broker killed (kill -9) in the
// middle of a journal's write leaves secfs.WriteFileAtomic's temporary
// file (".NAME.tmp-N", empty or cut) beside the journal. All, which a
// starting broker's recovery and `jailbee outbox ls` read, must still
// list every journal (the running one included, which recovery then
// marks blocked or failed), not fail on the leftover.
func TestJournalAllSkipsAnInterruptedWrite(t *testing.T) {
	d := openDir(t)
	err := d.Update("lead", "issue", "a.json", func(*Journal) (*Journal, error) {
		return &Journal{Sandbox: "lead", Outbox: "issue", Name: "a.json", State: Running, Proposal: []byte(`{}`),
			Actions: []Action{{Kind: "create", State: Prepared}}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(d.root, "lead", "issue")
	for name, content := range map[string]string{".a.json.tmp-1234567": `{"version":1,"sandbox":"le`, ".a.json.tmp-7654321": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	all, err := d.All()
	if err != nil || len(all) != 1 || all[0].Key() != "lead/issue/a.json" || all[0].State != Running {
		t.Fatalf("All after an interrupted write = %v, %+v", err, all)
	}
}

// TestJournalsPerSandboxAreBounded: a sandbox keeps at most MaxJournals
// journals. At the bound a new journal is written as it is; past it the
// oldest finished one (done or failed) is removed to make room, never a
// running or blocked one (a worker, a person still needs it); with none
// finished the new journal is refused with ErrTooManyJournals and nothing
// is removed. Another sandbox's journals neither count nor go.
func TestJournalsPerSandboxAreBounded(t *testing.T) {
	d := openDir(t)
	put := func(sandbox, outbox, name, state string) error {
		return d.Update(sandbox, outbox, name, func(*Journal) (*Journal, error) {
			return &Journal{Sandbox: sandbox, Outbox: outbox, Name: name, State: state, Proposal: []byte(`{}`),
				Actions: []Action{{Kind: "create"}}}, nil
		})
	}
	names := func(sandbox string) []string {
		var out []string
		for _, ob := range []string{"issue", "pr"} {
			entries, _ := os.ReadDir(filepath.Join(d.root, sandbox, ob))
			for _, e := range entries {
				out = append(out, ob+"/"+e.Name())
			}
		}
		return out
	}
	name := func(i int) string { return fmt.Sprintf("p%04d.json", i) }
	if err := put("other", "issue", "old.json", Done); err != nil {
		t.Fatal(err)
	}
	// The two oldest are blocked and running: never removed.
	for i := range MaxJournals - 1 {
		state := Done
		switch i {
		case 0:
			state = Blocked
		case 1:
			state = Running
		case 2:
			state = Halted
		}
		outbox := "issue"
		if i%2 == 1 {
			outbox = "pr"
		}
		if err := put("lead", outbox, name(i), state); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(names("lead")); n != MaxJournals-1 {
		t.Fatalf("%d journals, want %d", n, MaxJournals-1)
	}
	// At the bound: nothing removed.
	if err := put("lead", "issue", "at.json", Done); err != nil {
		t.Fatal(err)
	}
	if n := len(names("lead")); n != MaxJournals {
		t.Fatalf("at the bound: %d journals, want %d", n, MaxJournals)
	}
	// Past it: the oldest finished one (the failed p0002) goes.
	if err := put("lead", "issue", "past.json", Done); err != nil {
		t.Fatal(err)
	}
	got := names("lead")
	if len(got) != MaxJournals || slices.Contains(got, "issue/"+name(2)) ||
		!slices.Contains(got, "issue/"+name(0)) || !slices.Contains(got, "pr/"+name(1)) || !slices.Contains(got, "issue/past.json") {
		t.Fatalf("past the bound: %d journals %v", len(got), got)
	}
	// Rewriting a journal that exists adds none: nothing goes.
	if err := put("lead", "pr", name(3), Done); err != nil {
		t.Fatal(err)
	}
	if got := names("lead"); len(got) != MaxJournals || !slices.Contains(got, "issue/"+name(4)) {
		t.Fatalf("a rewrite removed a journal: %v", got)
	}
	if _, err := d.Load("other", "issue", "old.json"); err != nil || len(names("other")) != 1 {
		t.Fatalf("another sandbox's journal: %v %v", err, names("other"))
	}

	// None finished: refused, nothing removed.
	full := openDir(t)
	d = full
	for i := range MaxJournals {
		if err := put("lead", "issue", name(i), Blocked); err != nil {
			t.Fatal(err)
		}
	}
	if err := put("lead", "issue", "more.json", Done); !errors.Is(err, ErrTooManyJournals) {
		t.Fatalf("past the bound, none finished: %v", err)
	}
	if n := len(names("lead")); n != MaxJournals {
		t.Fatalf("%d journals, want %d", n, MaxJournals)
	}
}
