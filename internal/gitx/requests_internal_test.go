package gitx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
)

// pkt is lines as pkt-lines, "" a flush.
func pkt(lines ...string) string {
	var b strings.Builder
	for _, l := range lines {
		if l == "" {
			b.WriteString("0000")
			continue
		}
		fmt.Fprintf(&b, "%04x%s", len(l)+4, l)
	}
	return b.String()
}

// TestFilterRequests: a fetch's own requests pass unchanged; anything
// else is refused, and nothing of the refused line reaches the source.
func TestFilterRequests(t *testing.T) {
	oid := strings.Repeat("a", 40)
	honest := pkt("want "+oid+" multi_ack_detailed side-band-64k thin-pack no-progress ofs-delta deepen-since deepen-not agent=git/2.39.5 session-id=x object-format=sha1\n",
		"want "+oid+"\n", "shallow "+oid+"\n", "", "have "+oid+"\n", "", "done\n")
	var out bytes.Buffer
	if err := filterRequests(&out, strings.NewReader(honest)); err != nil || out.String() != honest {
		t.Fatalf("honest requests: %v, passed %q", err, out.String())
	}
	for name, req := range map[string]string{
		"include-tag":    pkt("want " + oid + " ofs-delta include-tag\n"),
		"filter":         pkt("want "+oid+" filter\n", "filter blob:none\n"),
		"deepen":         pkt("want "+oid+"\n", "deepen 1\n"),
		"deepen-since":   pkt("want "+oid+"\n", "deepen-since 0\n"),
		"deepen-not":     pkt("want "+oid+"\n", "deepen-not refs/heads/main\n"),
		"short id":       pkt("want " + oid[:12] + "\n"),
		"have with more": pkt("have " + oid + " include-tag\n"),
		"delimiter":      "0001",
		"empty line":     "0004",
		"not hex":        "00zz",
		"too long":       "fff1",
	} {
		out.Reset()
		err := filterRequests(&out, strings.NewReader(req))
		if !errors.Is(err, ErrTransferRequestRefused) {
			t.Errorf("%s: %v, want ErrTransferRequestRefused", name, err)
		}
		if !strings.HasPrefix(req, out.String()) || out.Len() >= len(req) {
			t.Errorf("%s: passed on %q", name, out.String())
		}
	}
}

// FuzzFilterRequests: whatever a destination sends, what reaches the
// source is a prefix of it made of whole pkt-lines, each a flush or a line
// checkRequest passes, and a refusal is ErrTransferRequestRefused or the
// input's end inside a line.
func FuzzFilterRequests(f *testing.F) {
	oid := strings.Repeat("a", 40)
	f.Add([]byte(pkt("want "+oid+" ofs-delta agent=git/2.39.5\n", "", "have "+oid+"\n", "done\n")))
	f.Add([]byte(pkt("want " + oid + " include-tag\n")))
	f.Add([]byte(pkt("want "+oid+"\n", "deepen-not refs/heads/main\n")))
	f.Add([]byte("0001fff1"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		err := filterRequests(&out, bytes.NewReader(in))
		passed := out.Bytes()
		if !bytes.HasPrefix(in, passed) {
			t.Fatalf("passed %q, not a prefix of the input", passed)
		}
		if err == nil && len(passed) != len(in) {
			t.Fatalf("no error, but passed %d of %d bytes", len(passed), len(in))
		}
		if err != nil && !errors.Is(err, ErrTransferRequestRefused) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("error %v", err)
		}
		for rest := passed; len(rest) > 0; {
			n, perr := strconv.ParseUint(string(rest[:4]), 16, 32)
			if perr != nil {
				t.Fatalf("passed a malformed length %q", rest[:4])
			}
			if n == 0 {
				rest = rest[4:]
				continue
			}
			line := string(rest[4:n])
			if cerr := checkRequest(strings.TrimSuffix(line, "\n")); cerr != nil {
				t.Fatalf("passed %q: %v", line, cerr)
			}
			rest = rest[n:]
		}
	})
}
