package spool_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"agentbox/internal/managed/spool"
)

func TestValidRequestID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"req-" + secret, true},
		{"a", true},
		{"A.b_c:d-9", true},
		{strings.Repeat("a", 128), true},
		{"", false},
		{strings.Repeat("a", 129), false},
		{".", false},
		{"..", false},
		{".hidden-" + secret, false},
		{"a/" + secret, false},
		{"a " + secret, false},
		{secret + "\x00", false},
		{secret + "é", false},
	} {
		err := spool.ValidRequestID(tc.id)
		if (err == nil) != tc.ok {
			t.Errorf("ValidRequestID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
		checkErr(t, err)
	}
}

func TestDecodeEnvelope(t *testing.T) {
	env := envelopeKVs()
	build := func(p string) []byte { return obj(with(env, "payload", p)...) }
	tests := []struct {
		name string
		data []byte
		ok   bool
	}{
		{"valid", obj(env...), true},
		{"valid reordered", obj(append(env[3:], env[:3]...)...), true},
		{"valid surrounding whitespace", append(append([]byte(" \n\t"), obj(env...)...), " \r\n\n"...), true},
		{"escaped key", obj(append(without(env, "run_id"), kv{`run\u005fid`, q(want.RunID)})...), true},
		{"duplicate key", obj(append(env, kv{"run_id", q(want.RunID)})...), false},
		{"duplicate escaped key", obj(append(env, kv{`run\u005fid`, q(want.RunID)})...), false},
		{"duplicate capability", obj(append(env, kv{"capability", q("other-" + secret)})...), false},
		{"unknown field", obj(append(env, kv{"extra-" + secret, q(secret)})...), false},
		{"unknown field differing in case", obj(append(without(env, "run_id"), kv{"Run_ID", q(want.RunID)})...), false},
		{"number id", obj(with(env, "run_id", "12345")...), false},
		{"null id", obj(with(env, "lease_id", "null")...), false},
		{"bool id", obj(with(env, "consumer", "true")...), false},
		{"array id", obj(with(env, "request_id", `["`+secret+`"]`)...), false},
		{"capability object", obj(with(env, "capability", `{"k":"`+secret+`"}`)...), false},
		{"number version", obj(with(env, "version", "1")...), false},
		{"invalid request_id", obj(with(env, "request_id", q("../"+secret))...), false},
		{"empty request_id", obj(with(env, "request_id", `""`)...), false},
		{"invalid UTF-8 in value", obj(with(env, "consumer", "\"\xff"+secret+"\"")...), false},
		{"invalid UTF-8 in payload", obj(with(env, "payload", "\"\xc3\x28"+secret+"\"")...), false},
		{"at MaxRequestBytes", sized(t, spool.MaxRequestBytes, build), true},
		{"one past MaxRequestBytes", sized(t, spool.MaxRequestBytes+1, build), false},
		{"trailing data", append(obj(env...), `x"`+secret+`"`...), false},
		{"trailing comma", append(obj(env...), ','), false},
		{"two objects", append(obj(env...), obj(env...)...), false},
		{"two objects newline", append(append(obj(env...), '\n'), obj(env...)...), false},
		{"top-level array", []byte("[" + string(obj(env...)) + "]"), false},
		{"top-level string", []byte(q(secret)), false},
		{"empty", nil, false},
		{"whitespace only", []byte(" \n"), false},
		{"truncated", obj(env...)[:40], false},
		{"unquoted value", []byte(strings.Replace(string(obj(env...)), q(want.RunID), want.RunID, 1)), false},
		{"single quotes", []byte(strings.Replace(string(obj(env...)), q(want.RunID), "'"+want.RunID+"'", 1)), false},
		{"depth 64", obj(with(env, "payload", nested(63))...), true},
		{"depth 65", obj(with(env, "payload", nested(64))...), false},
		{"depth 65 objects", obj(with(env, "payload", strings.Repeat(`{"a":`, 64)+q(secret)+strings.Repeat("}", 64))...), false},
		{"brackets inside strings do not nest", obj(with(env, "payload", q(strings.Repeat("[{", 100)+secret))...), true},
		{"payload object", build(`{"a":{"b":"` + secret + `"}}`), true},
		{"payload array", build(`["` + secret + `",1]`), true},
		{"payload string", build(q(secret)), true},
		{"payload number", build(`-1.5e10`), true},
		{"payload bool", build(`false`), true},
		{"payload null", build(`null`), true},
		{"payload malformed", build(`{"a":` + q(secret) + `,}`), false},
		{"payload bare word", build(secret), false},
	}
	for _, name := range []string{"version", "run_id", "lease_id", "consumer", "request_id", "capability", "payload"} {
		tests = append(tests, struct {
			name string
			data []byte
			ok   bool
		}{"missing " + name, obj(without(env, name)...), false})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := spool.DecodeEnvelope(tc.data)
			checkErr(t, err)
			if (err == nil) != tc.ok {
				t.Fatalf("DecodeEnvelope = %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				return
			}
			if e.Capability != capability || e.RunID != want.RunID {
				t.Errorf("decoded %+v", e)
			}
			var c bytes.Buffer
			if err := json.Compact(&c, e.Payload); err != nil || !bytes.Equal(c.Bytes(), e.Payload) {
				t.Errorf("payload not compact JSON: %s", e.Payload)
			}
		})
	}
}

func TestDecodeEnvelopePayloadKept(t *testing.T) {
	// Opaque: number spelling and string escapes pass through; only
	// whitespace goes.
	p := "{ \"n\" : 1.50E+3 , \"s\" : \"\\u0041<&>\\/" + secret + "\" }"
	e, err := spool.DecodeEnvelope(obj(with(envelopeKVs(), "payload", p)...))
	if err != nil {
		t.Fatal(err)
	}
	if got, exp := string(e.Payload), `{"n":1.50E+3,"s":"\u0041<&>\/`+secret+`"}`; got != exp {
		t.Errorf("payload %s, want %s", got, exp)
	}
}

func TestCheck(t *testing.T) {
	e, err := spool.DecodeEnvelope(obj(envelopeKVs()...))
	if err != nil {
		t.Fatal(err)
	}
	mut := func(f func(w *spool.IDs)) spool.IDs { w := want; f(&w); return w }
	for _, tc := range []struct {
		name  string
		env   spool.Envelope
		want  spool.IDs
		cap   string
		field string // "" means accepted
	}{
		{"correct", *e, want, capability, ""},
		{"run_id mismatch", *e, mut(func(w *spool.IDs) { w.RunID += "x" }), capability, "run_id"},
		{"lease_id mismatch", *e, mut(func(w *spool.IDs) { w.LeaseID = "other-" + secret }), capability, "lease_id"},
		{"consumer mismatch", *e, mut(func(w *spool.IDs) { w.Consumer = "" }), capability, "consumer"},
		{"request_id mismatch", *e, mut(func(w *spool.IDs) { w.RequestID = "req-2" }), capability, "request_id"},
		{"wrong version", func() spool.Envelope { c := *e; c.Version = "2-" + secret; return c }(), want, capability, "version"},
		{"capability same length", *e, want, "cap-" + strings.ToLower(secret), "capability"},
		{"capability shorter", *e, want, capability[:len(capability)-1], "capability"},
		{"capability longer", *e, want, capability + "X", "capability"},
		{"capability empty in envelope", func() spool.Envelope { c := *e; c.Capability = ""; return c }(), want, capability, "capability"},
		{"no capability configured", func() spool.Envelope { c := *e; c.Capability = ""; return c }(), want, "", "capability"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.env.Check(tc.want, []byte(tc.cap))
			checkErr(t, err)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Check = %v", err)
				}
				return
			}
			se, ok := err.(*spool.Error)
			if !ok || se.Field != tc.field {
				t.Fatalf("Check = %v, want field %s", err, tc.field)
			}
		})
	}
}

func TestFrame(t *testing.T) {
	canonical := `{"version":"1","run_id":"run-SECRET-MARKER","lease_id":"lease-SECRET-MARKER",` +
		`"consumer":"consumer-SECRET-MARKER","request_id":"req-SECRET-MARKER",` +
		`"payload":{"note":"SECRET-MARKER","n":[1,2.5e3,true,null]}}`
	env := envelopeKVs()
	variants := map[string][]byte{
		"compact":  obj(env...),
		"reversed": obj(env[6], env[5], env[4], env[3], env[2], env[1], env[0]),
		"pretty": []byte("{\n  \"payload\" : {\n    \"note\" : \"SECRET-MARKER\",\n    \"n\" : [ 1, 2.5e3, true, null ]\n  },\n" +
			"  \"version\":\"1\", \"run_id\":\"run-SECRET-MARKER\",\r\n\t\"lease_id\":\"lease-SECRET-MARKER\",\n" +
			"  \"consumer\" : \"consumer-SECRET-MARKER\", \"request_id\" : \"req-SECRET-MARKER\",\n" +
			"  \"capability\" : \"cap-SECRET-MARKER\"\n}\n"),
		"escaped": obj(
			kv{`\u0076ersion`, `"\u0031"`},
			kv{"run_id", `"\u0072un-SECRET-MARKER"`},
			kv{"lease_id", `"lease\u002dSECRET-MARKER"`},
			kv{"consumer", `"consumer-SECRET-MARKE\u0052"`},
			kv{"request_id", q(want.RequestID)},
			kv{"capability", `"cap-\u0053ECRET-MARKER"`},
			kv{"payload", payload}),
	}
	for name, data := range variants {
		e, err := spool.DecodeEnvelope(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		frame := e.Frame()
		if string(frame) != canonical {
			t.Errorf("%s: frame\n%s\nwant\n%s", name, frame, canonical)
		}
		if !bytes.Equal(frame, e.Frame()) {
			t.Errorf("%s: Frame not deterministic", name)
		}
		if bytes.Contains(frame, []byte("cap-")) || bytes.Contains(frame, []byte("capability")) {
			t.Errorf("%s: frame carries the capability", name)
		}
		if len(frame) > len(data) {
			t.Errorf("%s: frame %d bytes longer than request %d", name, len(frame), len(data))
		}
	}
}

func TestFrameStringEscapes(t *testing.T) {
	// Only what JSON requires is escaped, so the frame never outgrows the
	// request; the output still decodes to the same strings.
	e := spool.Envelope{
		Version: "1", RunID: "a\"b\\c\n\t\x01<&>\u2028é" + secret, LeaseID: "\xff",
		Consumer: "c", RequestID: "r", Payload: json.RawMessage(`null`),
	}
	frame := e.Frame()
	exp := `{"version":"1","run_id":"a\"b\\c\n\t\u0001<&>` + "\u2028é" + secret +
		`","lease_id":"` + "\uFFFD" + `","consumer":"c","request_id":"r","payload":null}`
	if string(frame) != exp {
		t.Errorf("frame\n%s\nwant\n%s", frame, exp)
	}
	var m map[string]any
	if err := json.Unmarshal(frame, &m); err != nil || m["run_id"] != e.RunID {
		t.Errorf("frame does not decode back: %v %q", err, m["run_id"])
	}
	if got := (&spool.Envelope{}).Frame(); string(got) !=
		`{"version":"","run_id":"","lease_id":"","consumer":"","request_id":"","payload":null}` {
		t.Errorf("zero frame %s", got)
	}
}

func TestFingerprint(t *testing.T) {
	e := spool.Envelope{Version: "1", RunID: "r", LeaseID: "l", Consumer: "c", RequestID: "q", Payload: json.RawMessage("null")}
	frame := e.Frame()
	if string(frame) != `{"version":"1","run_id":"r","lease_id":"l","consumer":"c","request_id":"q","payload":null}` {
		t.Fatalf("frame %s", frame)
	}
	if got := spool.Fingerprint(frame); got != "51b7fad5e34ba036d6a63cc001547ee22dd4bc7bf86e074414c5591ffb18156c" {
		t.Errorf("Fingerprint = %s", got)
	}
	if got := spool.Fingerprint(nil); got != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Errorf("Fingerprint(nil) = %s", got)
	}
}

func TestErrorString(t *testing.T) {
	if got := (&spool.Error{Field: "run_id", Rule: "mismatch"}).Error(); got != "run_id: mismatch" {
		t.Errorf("got %q", got)
	}
	if got := (&spool.Error{Rule: "not valid UTF-8"}).Error(); got != "not valid UTF-8" {
		t.Errorf("got %q", got)
	}
}
