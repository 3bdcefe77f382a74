package spool_test

import (
	"errors"
	"strings"
	"testing"

	"agentbox/internal/managed/spool"
)

// secret is planted in every value; no error message may contain it.
const secret = "SECRET-MARKER"

var (
	want = spool.IDs{
		RunID:     "run-" + secret,
		LeaseID:   "lease-" + secret,
		Consumer:  "consumer-" + secret,
		RequestID: "req-" + secret,
	}
	capability = "cap-" + secret
	payload    = `{"note":"` + secret + `","n":[1,2.5e3,true,null]}`
)

// kv is one top-level member: key as written (may hold escapes) and its raw
// JSON value.
type kv struct{ k, v string }

func obj(kvs ...kv) []byte {
	var b strings.Builder
	b.WriteByte('{')
	for i, m := range kvs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + m.k + `":` + m.v)
	}
	b.WriteByte('}')
	return []byte(b.String())
}

func q(s string) string { return `"` + s + `"` }

func envelopeKVs() []kv {
	return []kv{
		{"version", `"1"`},
		{"run_id", q(want.RunID)},
		{"lease_id", q(want.LeaseID)},
		{"consumer", q(want.Consumer)},
		{"request_id", q(want.RequestID)},
		{"capability", q(capability)},
		{"payload", payload},
	}
}

func responseKVs() []kv {
	kvs := envelopeKVs()
	return append(kvs[:5:5], kv{"payload", `{"status":"ok","out":"` + secret + `"}`})
}

// without drops key; with replaces (or appends) key's value.
func without(kvs []kv, key string) []kv {
	var out []kv
	for _, m := range kvs {
		if m.k != key {
			out = append(out, m)
		}
	}
	return out
}

func with(kvs []kv, key, value string) []kv {
	out := append([]kv(nil), kvs...)
	for i := range out {
		if out[i].k == key {
			out[i].v = value
			return out
		}
	}
	return append(out, kv{key, value})
}

// checkErr asserts err is a *spool.Error that does not echo the secret.
func checkErr(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var se *spool.Error
	if !errors.As(err, &se) {
		t.Errorf("error %T is not *spool.Error: %v", err, err)
	}
	if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("error echoes input: %v", err)
	}
}

// sized pads a string payload so the document built by build is exactly n
// bytes; the padding carries the secret too.
func sized(t *testing.T, n int, build func(payload string) []byte) []byte {
	t.Helper()
	base := len(build(q(secret)))
	if base > n {
		t.Fatalf("base %d over %d", base, n)
	}
	data := build(q(secret + strings.Repeat("x", n-base)))
	if len(data) != n {
		t.Fatalf("built %d bytes, want %d", len(data), n)
	}
	return data
}

func nested(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
