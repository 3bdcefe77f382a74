package spool_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"agentbox/internal/managed/spool"
)

// reencode writes e back as a request file with encoding/json (a different
// encoder from Frame's), HTML escaping off so the payload stays verbatim.
func reencode(t *testing.T, e *spool.Envelope) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	err := enc.Encode(struct {
		Version    string          `json:"version"`
		Capability string          `json:"capability"`
		RunID      string          `json:"run_id"`
		LeaseID    string          `json:"lease_id"`
		Consumer   string          `json:"consumer"`
		RequestID  string          `json:"request_id"`
		Payload    json.RawMessage `json:"payload"`
	}{e.Version, e.Capability, e.RunID, e.LeaseID, e.Consumer, e.RequestID, e.Payload})
	if err != nil {
		t.Fatalf("re-encoding: %v", err)
	}
	return b.Bytes()
}

func FuzzDecodeEnvelope(f *testing.F) {
	env := envelopeKVs()
	for _, seed := range [][]byte{
		obj(env...),
		obj(append(env, kv{`run\u005fid`, q(want.RunID)})...),
		obj(with(env, "payload", nested(63))...),
		obj(with(env, "payload", `"\u2028\ud800\u00e9\/<&>\b\f\n\u0001"`)...),
		obj(with(env, "run_id", `"\u2028\u2029\u0000\"\\"`)...),
		obj(with(env, "payload", `[1e999,-0,0.0e-0,{"":[{}]}]`)...),
		[]byte(`{}`), []byte(`[]`), []byte(`null`), []byte("{\"version\":\"1\"\xff}"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := spool.DecodeEnvelope(data)
		if err != nil {
			if strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("error echoes input: %v", err)
			}
			return
		}
		frame := e.Frame()
		if !json.Valid(frame) {
			t.Fatalf("invalid frame %q", frame)
		}
		if len(frame) > len(data) {
			t.Fatalf("frame %d bytes, request %d", len(frame), len(data))
		}
		if !bytes.Equal(frame, e.Frame()) {
			t.Fatal("Frame not deterministic")
		}
		ids := spool.IDs{RunID: e.RunID, LeaseID: e.LeaseID, Consumer: e.Consumer, RequestID: e.RequestID}
		if e.Version == spool.Version {
			if _, err := spool.DecodeClaim(spool.NewClaim(frame).Marshal(), ids); err != nil {
				t.Fatalf("claim of a valid frame refused: %v", err)
			}
		}
		again := reencode(t, e)
		if len(again) > spool.MaxRequestBytes {
			return // encoding/json escapes U+2028 and may outgrow the limit
		}
		e2, err := spool.DecodeEnvelope(again)
		if err != nil {
			t.Fatalf("re-encoded envelope refused: %v\n%q", err, again)
		}
		if !bytes.Equal(e2.Frame(), frame) || e2.Capability != e.Capability {
			t.Fatalf("round trip changed the frame:\n%q\n%q", frame, e2.Frame())
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	resp := responseKVs()
	for _, seed := range [][]byte{
		obj(resp...),
		append(obj(resp...), '\n'),
		obj(with(resp, "payload", `{"status":"declined"}`)...),
		obj(append(resp, kv{"capability", q(capability)})...),
		obj(with(resp, "payload", nested(63))...),
		obj(with(resp, "payload", `"\u2028\ud800<&>"`)...),
		[]byte(`{}`), []byte("\n"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := spool.DecodeResponse(data, want)
		if err != nil {
			if strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("error echoes input: %v", err)
			}
			return
		}
		b := r.Bytes()
		if !json.Valid(b) || b[len(b)-1] != '\n' {
			t.Fatalf("invalid Bytes %q", b)
		}
		r2, err := spool.DecodeResponse(b, want)
		if err != nil || !bytes.Equal(r2.Bytes(), b) {
			t.Fatalf("Bytes does not round-trip: %v", err)
		}
		e := spool.Envelope{Version: "1", RunID: want.RunID, LeaseID: want.LeaseID, Consumer: want.Consumer,
			RequestID: want.RequestID, Payload: json.RawMessage(`{}`)}
		if _, err := spool.DecodeDone(spool.NewDone(e.Frame(), r).Marshal(), want); err != nil {
			t.Fatalf("done record refused: %v", err)
		}
	})
}

// FuzzDecodeFrame: the endpoint's parser of a relayed frame (its payload
// is the consumer's bytes). An accepted frame has valid ids, is never
// echoed in an error, and its canonical form (what the dispatcher sends)
// decodes again to the same ids and payload, and as a claim record.
func FuzzDecodeFrame(f *testing.F) {
	frame := without(envelopeKVs(), "capability")
	for _, seed := range [][]byte{
		obj(frame...),
		append(obj(frame...), '\n'),
		obj(with(frame, "payload", nested(63))...),
		obj(with(frame, "payload", `"\u2028\ud800<&>\u0000"`)...),
		obj(with(frame, "run_id", `""`)...),
		obj(append(frame, kv{"capability", q(capability)})...),
		obj(append(frame, kv{`request\u005fid`, q("other")})...),
		[]byte(`{}`), []byte("\n"), []byte(`[]`), []byte("{\"version\":\"1\"\xff}"),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ids, p, err := spool.DecodeFrame(data)
		if err != nil {
			if strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("error echoes input: %v", err)
			}
			return
		}
		if ids.RunID == "" || ids.LeaseID == "" || ids.Consumer == "" || spool.ValidRequestID(ids.RequestID) != nil || !json.Valid(p) {
			t.Fatalf("accepted ids %+v payload %q", ids, p)
		}
		e := spool.Envelope{Version: spool.Version, RunID: ids.RunID, LeaseID: ids.LeaseID, Consumer: ids.Consumer, RequestID: ids.RequestID, Payload: p}
		canon := e.Frame()
		if len(canon) > len(data) {
			t.Fatalf("canonical frame %d bytes, input %d", len(canon), len(data))
		}
		ids2, p2, err := spool.DecodeFrame(canon)
		if err != nil || ids2 != ids || !bytes.Equal(p2, p) {
			t.Fatalf("the canonical frame does not decode the same: %v", err)
		}
		if _, err := spool.DecodeClaim(spool.NewClaim(canon).Marshal(), ids); err != nil {
			t.Fatalf("claim of a valid frame refused: %v", err)
		}
	})
}
