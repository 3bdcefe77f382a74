package spool_test

import (
	"bytes"
	"strings"
	"testing"

	"agentbox/internal/managed/spool"
)

func TestDecodeResponse(t *testing.T) {
	resp := responseKVs()
	build := func(p string) []byte { return obj(with(resp, "payload", p)...) }
	tests := []struct {
		name string
		data []byte
		ok   bool
	}{
		{"valid", obj(resp...), true},
		{"trailing newline", append(obj(resp...), '\n'), true},
		{"declined", build(`{"status":"declined","reason":"` + secret + `"}`), true},
		{"bare decline", build(`{"status":"declined"}`), true},
		{"payload null", build(`null`), true},
		{"run_id mismatch", obj(with(resp, "run_id", q("run-other-"+secret))...), false},
		{"lease_id mismatch", obj(with(resp, "lease_id", q("lease-other-"+secret))...), false},
		{"consumer mismatch", obj(with(resp, "consumer", q("consumer-other-"+secret))...), false},
		{"request_id mismatch", obj(with(resp, "request_id", q("req-other-"+secret))...), false},
		{"wrong version", obj(with(resp, "version", q("2"+secret))...), false},
		{"capability present", obj(append(resp, kv{"capability", q(capability)})...), false},
		{"unknown field", obj(append(resp, kv{"status-" + secret, q(secret)})...), false},
		{"duplicate escaped key", obj(append(resp, kv{`consume\u0072`, q(want.Consumer)})...), false},
		{"null id", obj(with(resp, "run_id", "null")...), false},
		{"invalid UTF-8", build("\"\xfe" + secret + "\""), false},
		{"at MaxResponseBytes", sized(t, spool.MaxResponseBytes, build), true},
		{"at MaxResponseBytes plus newline", append(sized(t, spool.MaxResponseBytes, build), '\n'), true},
		{"one past MaxResponseBytes", sized(t, spool.MaxResponseBytes+1, build), false},
		{"at MaxResponseBytes plus two newlines", append(sized(t, spool.MaxResponseBytes, build), '\n', '\n'), false},
		{"two responses", append(append(obj(resp...), '\n'), obj(resp...)...), false},
		{"top-level array", []byte("[" + string(obj(resp...)) + "]"), false},
		{"depth 64", build(nested(63)), true},
		{"depth 65", build(nested(64)), false},
		{"empty", nil, false},
	}
	for _, name := range []string{"version", "run_id", "lease_id", "consumer", "request_id", "payload"} {
		tests = append(tests, struct {
			name string
			data []byte
			ok   bool
		}{"missing " + name, obj(without(resp, name)...), false})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := spool.DecodeResponse(tc.data, want)
			checkErr(t, err)
			if (err == nil) != tc.ok {
				t.Fatalf("DecodeResponse = %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				return
			}
			b := r.Bytes()
			if !bytes.HasSuffix(b, []byte("}\n")) || bytes.Count(b, []byte("\n")) != 1 {
				t.Errorf("Bytes not one compact line: %q", b)
			}
			again, err := spool.DecodeResponse(b, want)
			if err != nil || !bytes.Equal(again.Bytes(), b) {
				t.Errorf("Bytes does not round-trip: %v", err)
			}
		})
	}
}

func TestResponseBytes(t *testing.T) {
	data := []byte("{ \"payload\" : { \"status\" : \"declined\" } ,\n \"request_id\":\"req-SECRET-MARKER\"," +
		"\"consumer\":\"consumer-SECRET-MARKER\",\"lease_id\":\"lease-SECRET-MARKER\"," +
		"\"run_id\":\"run-SECRET-MARKER\",\"version\":\"1\" }\n")
	r, err := spool.DecodeResponse(data, want)
	if err != nil {
		t.Fatal(err)
	}
	exp := `{"version":"1","run_id":"run-SECRET-MARKER","lease_id":"lease-SECRET-MARKER",` +
		`"consumer":"consumer-SECRET-MARKER","request_id":"req-SECRET-MARKER","payload":{"status":"declined"}}` + "\n"
	if got := string(r.Bytes()); got != exp {
		t.Errorf("Bytes\n%s\nwant\n%s", got, exp)
	}
	if strings.Contains(exp, "capability") {
		t.Error("response carries a capability")
	}
}
