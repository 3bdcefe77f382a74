package gitx

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrTransferRequestRefused: the destination asked the source for more
// than the commit's history (tags, a depth, a filter, ...).
var ErrTransferRequestRefused = errors.New("the destination asked for more than the commit")

// maxPktLen is the longest pkt-line git writes (LARGE_PACKET_MAX).
const maxPktLen = 65520

// wantCapabilities are the capabilities a destination may ask of the
// source: those `git fetch --no-tags` asks for. Not include-tag
// (pack-objects then adds every annotated tag of the source that points
// into what it sends, namespace and hidden refs notwithstanding), nor
// filter. git names deepen-since and deepen-not whenever the source offers
// them; they do nothing without a deepen line, which filterRequests
// refuses (a deepen-not line resolves any ref name of the source: an
// oracle of its branches and tags).
var wantCapabilities = map[string]bool{
	"multi_ack": true, "multi_ack_detailed": true, "no-done": true,
	"side-band": true, "side-band-64k": true, "thin-pack": true,
	"ofs-delta": true, "no-progress": true,
	"deepen-since": true, "deepen-not": true, "deepen-relative": true,
}

// wantValueCapabilities are the capabilities with a value a destination
// may send.
var wantValueCapabilities = []string{"agent=", "object-format=", "session-id="}

// filterRequests copies the destination's side of a protocol version 0
// fetch (git's pack-protocol) from r to w, pkt-line by pkt-line, and
// refuses with ErrTransferRequestRefused anything a plain fetch of the
// advertised commit does not send: only want, have and shallow lines of
// an object id, done, and flushes, and only wantCapabilities. Nothing is
// passed on from the line that is refused.
func filterRequests(w io.Writer, r io.Reader) error {
	br := bufio.NewReaderSize(r, maxPktLen)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n, err := strconv.ParseUint(string(hdr[:]), 16, 32)
		if err != nil || (n != 0 && n <= 4) || n > maxPktLen {
			return fmt.Errorf("%w: a malformed pkt-line", ErrTransferRequestRefused)
		}
		var line []byte
		if n > 0 {
			line = make([]byte, n-4)
			if _, err := io.ReadFull(br, line); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF // a line cut after its length
				}
				return err
			}
			if err := checkRequest(strings.TrimSuffix(string(line), "\n")); err != nil {
				return err
			}
		}
		if _, err := w.Write(append(hdr[:], line...)); err != nil {
			return err
		}
	}
}

// checkRequest checks one non-flush pkt-line of a destination.
func checkRequest(line string) error {
	if line == "done" {
		return nil
	}
	verb, rest, _ := strings.Cut(line, " ")
	oid, caps, hasCaps := strings.Cut(rest, " ")
	switch {
	case verb != "want" && verb != "have" && verb != "shallow":
		return fmt.Errorf("%w: a request other than want, have, shallow or done", ErrTransferRequestRefused)
	case !shaPattern.MatchString(oid):
		return fmt.Errorf("%w: %s of no object id", ErrTransferRequestRefused, verb)
	case hasCaps && verb != "want":
		return fmt.Errorf("%w: %s with more than an object id", ErrTransferRequestRefused, verb)
	}
	for c := range strings.FieldsSeq(caps) {
		if !wantCapabilities[c] && !hasAnyPrefix(c, wantValueCapabilities) {
			return fmt.Errorf("%w: capability %q", ErrTransferRequestRefused, c[:min(len(c), 64)])
		}
	}
	return nil
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
