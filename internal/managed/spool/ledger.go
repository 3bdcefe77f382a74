package spool

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"strconv"
)

// A request's ledger file is append-only: a claim record, then (once the
// endpoint answered) a done record. Each record is a header line
// "<kind> <length> <crc32c>\n" (length in decimal, the CRC-32C of the
// body in 8 lowercase hex digits) and its body: Claim.Marshal or
// Done.Marshal. One write appends a whole record, and one sync makes it
// durable.
const (
	KindClaim = "claim"
	KindDone  = "done"
)

// maxHeaderBytes bounds a record's header line ("claim 1048576 0123abcd\n").
const maxHeaderBytes = 32

// MaxLedgerBytes bounds a ledger file: a claim and a done record.
const MaxLedgerBytes = 2*maxHeaderBytes + 2*MaxRecordBytes

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendLedgerRecord appends one framed record of kind to b.
func AppendLedgerRecord(b []byte, kind string, body []byte) []byte {
	b = fmt.Appendf(b, "%s %d %08x\n", kind, len(body), crc32.Checksum(body, castagnoli))
	return append(b, body...)
}

// Ledger is what a request's ledger file holds.
type Ledger struct {
	Claim *Claim
	Done  *Done
	// Valid is the length of the whole records; the bytes past it are a
	// torn record (Torn), which was never synced and so never acted on.
	Valid int
	Torn  bool
}

// ParseLedger reads a ledger file. Its first record that is incomplete or
// fails its checksum starts a torn tail: an append cut short by a crash,
// never followed by another (every append first cuts a torn tail away).
// A record whose checksum holds but whose body or place is wrong (a done
// before its claim, a third record, another request's ids or digest) is
// damage, never a torn tail.
func ParseLedger(data []byte, want IDs) (Ledger, error) {
	var l Ledger
	if len(data) > MaxLedgerBytes {
		return l, fieldErr("", "ledger larger than %d bytes", MaxLedgerBytes)
	}
	for l.Valid < len(data) {
		kind, body, size := nextRecord(data[l.Valid:])
		if size == 0 {
			l.Torn = true
			return l, nil
		}
		if err := l.add(kind, body, want); err != nil {
			return Ledger{}, err
		}
		l.Valid += size
	}
	return l, nil
}

// add takes one whole record in its place.
func (l *Ledger) add(kind string, body []byte, want IDs) error {
	switch {
	case kind == KindClaim && l.Claim == nil:
		c, err := DecodeClaim(body, want)
		if err != nil {
			return within("ledger.claim", err)
		}
		l.Claim = &c
	case kind == KindDone && l.Claim != nil && l.Done == nil:
		d, err := DecodeDone(body, want)
		if err != nil {
			return within("ledger.done", err)
		}
		if d.RequestSHA256 != l.Claim.RequestSHA256 {
			return &Error{Field: "ledger.done." + fSHA, Rule: "does not match the claim"}
		}
		l.Done = &d
	default:
		return &Error{Field: "ledger", Rule: "a record out of place"}
	}
	return nil
}

// nextRecord splits the record at the start of b: its kind, body and
// framed size, or size 0 when the header or body is incomplete or the
// checksum fails.
func nextRecord(b []byte) (kind string, body []byte, size int) {
	end := bytes.IndexByte(b[:min(len(b), maxHeaderBytes)], '\n')
	if end < 0 {
		return "", nil, 0
	}
	f := bytes.Split(b[:end], []byte{' '})
	if len(f) != 3 || (string(f[0]) != KindClaim && string(f[0]) != KindDone) || len(f[2]) != 8 {
		return "", nil, 0
	}
	n, err := strconv.Atoi(string(f[1]))
	if err != nil || n < 1 || n > MaxRecordBytes || strconv.Itoa(n) != string(f[1]) {
		return "", nil, 0
	}
	sum, err := strconv.ParseUint(string(f[2]), 16, 32)
	if err != nil || fmt.Sprintf("%08x", sum) != string(f[2]) {
		return "", nil, 0
	}
	body = b[end+1:]
	if len(body) < n || crc32.Checksum(body[:n], castagnoli) != uint32(sum) {
		return "", nil, 0
	}
	return string(f[0]), body[:n], end + 1 + n
}
