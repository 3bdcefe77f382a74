package gitx

import (
	"bytes"
	"errors"
	"fmt"
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
