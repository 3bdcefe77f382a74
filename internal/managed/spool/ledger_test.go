package spool_test

import (
	"bytes"
	"strings"
	"testing"

	"agentbox/internal/managed/spool"
)

// ledgerFixture is a whole ledger file (a claim then a done record) and
// the length of its claim record.
func ledgerFixture(t testing.TB) ([]byte, int) {
	frame, r := fixture(t)
	b := spool.AppendLedgerRecord(nil, spool.KindClaim, spool.NewClaim(frame).Marshal())
	n := len(b)
	return spool.AppendLedgerRecord(b, spool.KindDone, spool.NewDone(frame, r).Marshal()), n
}

// TestLedgerTornTail cuts a ledger file at every length, as a crash
// during an append leaves it: never an error, the whole records read,
// the rest reported torn.
func TestLedgerTornTail(t *testing.T) {
	data, claimLen := ledgerFixture(t)
	for n := 0; n <= len(data); n++ {
		l, err := spool.ParseLedger(data[:n], want)
		if err != nil {
			t.Fatalf("cut at %d: %v", n, err)
		}
		wantValid := 0
		switch {
		case n == len(data):
			wantValid = n
		case n >= claimLen:
			wantValid = claimLen
		}
		if l.Valid != wantValid || l.Torn != (n > wantValid) || (l.Claim != nil) != (wantValid > 0) || (l.Done != nil) != (n == len(data)) {
			t.Fatalf("cut at %d: valid %d torn %v claim %v done %v", n, l.Valid, l.Torn, l.Claim != nil, l.Done != nil)
		}
	}
	// A last record of full length whose bytes did not all reach the disk.
	zeroed := bytes.Clone(data)
	for i := len(data) - 10; i < len(data); i++ {
		zeroed[i] = 0
	}
	if l, err := spool.ParseLedger(zeroed, want); err != nil || !l.Torn || l.Valid != claimLen || l.Done != nil {
		t.Fatalf("zeroed tail: %+v %v", l, err)
	}
}

// TestLedgerDamage: a record whose checksum holds but whose content or
// place is wrong is damage, never a torn tail.
func TestLedgerDamage(t *testing.T) {
	data, claimLen := ledgerFixture(t)
	frame, r := fixture(t)
	otherFrame := bytes.Replace(frame, []byte(want.RequestID), []byte("other"), 1)
	otherDone := spool.AppendLedgerRecord(nil, spool.KindDone, spool.NewDone(otherFrame, r).Marshal())
	for name, d := range map[string][]byte{
		"done first":     data[claimLen:],
		"two claims":     append(bytes.Clone(data[:claimLen]), data[:claimLen]...),
		"a third record": append(bytes.Clone(data), data[claimLen:]...),
		"another id":     spool.AppendLedgerRecord(nil, spool.KindClaim, spool.NewClaim(otherFrame).Marshal()),
		"another digest": append(bytes.Clone(data[:claimLen]), otherDone...),
		"not a record":   spool.AppendLedgerRecord(nil, spool.KindClaim, []byte(`{"version":"1"}`+"\n")),
		"too large":      make([]byte, spool.MaxLedgerBytes+1),
	} {
		_, err := spool.ParseLedger(d, want)
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error echoes a value: %v", name, err)
		}
	}
}

func FuzzParseLedger(f *testing.F) {
	data, claimLen := ledgerFixture(f)
	for _, seed := range [][]byte{data, data[:claimLen], data[:claimLen+7], data[:3], []byte("claim 1 00000000\n{"), nil} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := spool.ParseLedger(data, want)
		if err != nil {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error echoes a value: %v", err)
			}
			return
		}
		if l.Valid > len(data) || l.Torn != (l.Valid < len(data)) || (l.Done != nil && l.Claim == nil) {
			t.Fatalf("valid %d of %d, torn %v, done without claim %v", l.Valid, len(data), l.Torn, l.Done != nil && l.Claim == nil)
		}
		if l.Done != nil && l.Done.RequestSHA256 != l.Claim.RequestSHA256 {
			t.Fatal("a done record for another request")
		}
		// The whole records read again the same, with nothing torn.
		again, err := spool.ParseLedger(data[:l.Valid], want)
		if err != nil || again.Torn || again.Valid != l.Valid || (again.Claim != nil) != (l.Claim != nil) || (again.Done != nil) != (l.Done != nil) {
			t.Fatalf("the whole records again: %+v %v", again, err)
		}
	})
}
