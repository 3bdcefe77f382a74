package spool_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"agentbox/internal/managed/spool"
)

func fixture(t testing.TB) (frame []byte, r *spool.Response) {
	t.Helper()
	e, err := spool.DecodeEnvelope(obj(envelopeKVs()...))
	if err != nil {
		t.Fatal(err)
	}
	// "<&>" would be HTML-escaped by json.Marshal; the records must keep it.
	r, err = spool.DecodeResponse(obj(with(responseKVs(), "payload", `{"out":"<&>`+secret+`"}`)...), want)
	if err != nil {
		t.Fatal(err)
	}
	return e.Frame(), r
}

func TestClaimRoundTrip(t *testing.T) {
	frame, _ := fixture(t)
	c := spool.NewClaim(frame)
	data := c.Marshal()
	exp := `{"version":"1","request_sha256":"` + spool.Fingerprint(frame) + `","request":` + string(frame) + "}\n"
	if string(data) != exp {
		t.Fatalf("Marshal\n%s\nwant\n%s", data, exp)
	}
	got, err := spool.DecodeClaim(data, want)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != "1" || got.RequestSHA256 != c.RequestSHA256 || !bytes.Equal(got.Request, frame) {
		t.Errorf("decoded %+v", got)
	}
	// Indentation is insignificant: the hash covers the compacted request.
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, data, "", "  "); err != nil {
		t.Fatal(err)
	}
	if _, err := spool.DecodeClaim(pretty.Bytes(), want); err != nil {
		t.Errorf("indented claim: %v", err)
	}
}

func TestDoneRoundTrip(t *testing.T) {
	frame, r := fixture(t)
	d := spool.NewDone(frame, r)
	if !bytes.Equal(append(bytes.Clone(d.Response), '\n'), r.Bytes()) {
		t.Fatalf("Response %s", d.Response)
	}
	data := d.Marshal()
	if !bytes.Contains(data, []byte(`"<&>`+secret)) {
		t.Errorf("record re-escaped the payload: %s", data)
	}
	got, err := spool.DecodeDone(data, want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Request, frame) || !bytes.Equal(got.Response, d.Response) || got.RequestSHA256 != spool.Fingerprint(frame) {
		t.Errorf("decoded %+v", got)
	}
}

func TestDamagedRecords(t *testing.T) {
	frame, r := fixture(t)
	claim := string(spool.NewClaim(frame).Marshal())
	done := string(spool.NewDone(frame, r).Marshal())
	sha := spool.Fingerprint(frame)
	other := func(s string) string { return strings.Replace(s, sha, strings.Repeat("0", 64), 1) }
	otherWant := want
	otherWant.RunID = "run-other-" + secret

	frameB := string(frame)
	// A frame with different ids but its own correct hash: only the id
	// comparison can catch it.
	foreign := strings.Replace(frameB, want.RunID, "run-other-"+secret, 1)
	foreignClaim := string(spool.NewClaim([]byte(foreign)).Marshal())
	// Correctly hashed requests that are not canonical frames.
	dupRunID := strings.Replace(frameB, `{"version":"1",`, `{"version":"1","run_id":"x",`, 1)
	reordered := `{"run_id":"` + want.RunID + `",` + strings.Replace(frameB[1:], `"run_id":"`+want.RunID+`",`, "", 1)
	escaped := strings.Replace(frameB, secret+`","lease_id"`, `SECRET-MARKE\u0052","lease_id"`, 1)

	for _, tc := range []struct {
		name string
		done bool
		data string
		want spool.IDs
		err  string // expected error prefix
	}{
		{"claim bad hash", false, other(claim), want, "request_sha256: does not match"},
		{"claim uppercase hash", false, strings.Replace(claim, sha, strings.ToUpper(sha), 1), want, "request_sha256: must be 64"},
		{"claim short hash", false, strings.Replace(claim, sha, sha[:63], 1), want, "request_sha256: must be 64"},
		{"claim wrong ids", false, claim, otherWant, "request.run_id: mismatch"},
		{"claim foreign frame", false, foreignClaim, want, "request.run_id: mismatch"},
		{"claim extra field", false, strings.Replace(claim, `{"version"`, `{"x":"`+secret+`","version"`, 1), want, "unknown field"},
		{"claim duplicate field", false, strings.Replace(claim, `{"version":"1"`, `{"version":"1","version":"1"`, 1), want, "version: duplicate key"},
		{"claim missing request", false, `{"version":"1","request_sha256":"` + sha + `"}`, want, "request: missing"},
		{"claim truncated", false, claim[:len(claim)/2], want, "truncated JSON"},
		{"claim truncated at end", false, claim[:len(claim)-2], want, "truncated JSON"},
		{"claim wrong version", false, strings.Replace(claim, `{"version":"1"`, `{"version":"2"`, 1), want, "version: unsupported"},
		{"claim request not object", false, `{"version":"1","request_sha256":"` + spool.Fingerprint([]byte(`"`+secret+`"`)) + `","request":"` + secret + `"}`, want, "request: must be a JSON object"},
		{"claim request extra field", false, string(spool.NewClaim([]byte(strings.Replace(frameB, `"payload"`, `"capability":"`+capability+`","payload"`, 1))).Marshal()), want, "request: unknown field"},
		{"claim request duplicate field", false, string(spool.NewClaim([]byte(dupRunID)).Marshal()), want, "request.run_id: duplicate key"},
		{"claim request reordered", false, string(spool.NewClaim([]byte(reordered)).Marshal()), want, "request: not in canonical form"},
		{"claim request escaped", false, string(spool.NewClaim([]byte(escaped)).Marshal()), want, "request: not in canonical form"},
		{"claim as done", true, claim, want, "response: missing"},
		{"done as claim", false, done, want, "unknown field"},
		{"done bad hash", true, other(done), want, "request_sha256: does not match"},
		{"done wrong ids", true, done, otherWant, "request.run_id: mismatch"},
		{"done extra field", true, strings.Replace(done, `}`+"\n", `,"extra":"`+secret+`"}`+"\n", 1), want, "unknown field"},
		{"done truncated", true, done[:len(done)-10], want, "truncated JSON"},
		{"done response capability", true, strings.Replace(done, `,"response":{`, `,"response":{"capability":"`+capability+`",`, 1), want, "response: unknown field"},
		{"done response other request", true, strings.Replace(done, `"response":{"version":"1","run_id":"run-`, `"response":{"version":"1","run_id":"run-other-`, 1), want, "response.run_id: mismatch"},
		{"done response null", true, `{"version":"1","request_sha256":"` + sha + `","request":` + frameB + `,"response":null}`, want, "response: must be a JSON object"},
		{"done response not canonical", true, strings.Replace(done, `,"response":{"version":"1",`, `,"response":{"version":"\u0031",`, 1), want, "response: not in canonical form"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.done {
				_, err = spool.DecodeDone([]byte(tc.data), tc.want)
			} else {
				_, err = spool.DecodeClaim([]byte(tc.data), tc.want)
			}
			checkErr(t, err)
			if err == nil {
				t.Fatalf("damaged record accepted: %s", tc.data)
			}
			if !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("error %q, want prefix %q", err, tc.err)
			}
		})
	}
}

func TestRecordSize(t *testing.T) {
	big := strings.Repeat(" ", spool.MaxRecordBytes+1)
	if _, err := spool.DecodeClaim([]byte(big), want); err == nil || !strings.Contains(err.Error(), "larger") {
		t.Errorf("oversize claim: %v", err)
	}
	if _, err := spool.DecodeDone([]byte(big), want); err == nil || !strings.Contains(err.Error(), "larger") {
		t.Errorf("oversize done: %v", err)
	}
	// The largest request and the largest response fit in one record.
	e, err := spool.DecodeEnvelope(sized(t, spool.MaxRequestBytes, func(p string) []byte {
		return obj(with(envelopeKVs(), "payload", p)...)
	}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := spool.DecodeResponse(sized(t, spool.MaxResponseBytes, func(p string) []byte {
		return obj(with(responseKVs(), "payload", p)...)
	}), want)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spool.DecodeDone(spool.NewDone(e.Frame(), r).Marshal(), want); err != nil {
		t.Errorf("largest done record: %v", err)
	}
	// A depth-64 frame nests at 65 inside its record.
	e, err = spool.DecodeEnvelope(obj(with(envelopeKVs(), "payload", nested(63))...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spool.DecodeClaim(spool.NewClaim(e.Frame()).Marshal(), want); err != nil {
		t.Errorf("deepest claim: %v", err)
	}
}
