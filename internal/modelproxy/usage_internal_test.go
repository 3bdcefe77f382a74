package modelproxy

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzStreamUsage: whatever bytes a stream holds, split anywhere, the
// meter reads them without panicking and never reports a negative figure;
// the same stream split differently gives the same usage.
func FuzzStreamUsage(f *testing.F) {
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n"+
		"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n"), 7)
	f.Add([]byte("data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":-4}}\r\n"), 1)
	f.Add([]byte("data:"+strings.Repeat("x", maxEventLine+10)+"\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2}}\n"), 4096)
	f.Fuzz(func(t *testing.T, data []byte, cut int) {
		whole := &usageMeter{}
		whole.feedStream(data)
		split := &usageMeter{}
		if cut < 0 {
			cut = -cut
		}
		if len(data) > 0 {
			cut %= len(data) + 1
		} else {
			cut = 0
		}
		split.feedStream(data[:cut])
		split.feedStream(data[cut:])
		u := whole.usage()
		if u.InputTokens < 0 || u.OutputTokens < 0 || u.CacheReadInputTokens < 0 || u.CacheCreationInputTokens < 0 {
			t.Fatalf("negative usage %+v", u)
		}
		if split.usage() != u {
			t.Fatalf("split at %d: %+v, whole: %+v", cut, split.usage(), u)
		}
	})
}

// TestOutputCharge: a cut response is charged the request's max_tokens,
// up to maxChargedTokens; a request without a usable one is charged
// UnknownMaxTokens.
func TestOutputCharge(t *testing.T) {
	for body, want := range map[string]int64{
		`{"max_tokens":1024,"stream":true}`:         1024,
		`{"max_tokens":128000}`:                     128000,
		`{"max_tokens":128001}`:                     UnknownMaxTokens,
		`{"max_tokens":1099511627776}`:              UnknownMaxTokens,
		`{"max_tokens":0}`:                          UnknownMaxTokens,
		`{"max_tokens":-5}`:                         UnknownMaxTokens,
		`{"max_tokens":"1024"}`:                     UnknownMaxTokens,
		`{"max_tokens":1e3}`:                        UnknownMaxTokens,
		`{"max_tokens":99999999999999999999999999}`: UnknownMaxTokens,
		`{"model":"x"}`:                             UnknownMaxTokens,
		`not json`:                                  UnknownMaxTokens,
		`{"max_tokens":1024} trailing`:              UnknownMaxTokens,
		// An upstream reads the exact key (LiteLLM passes the rest on or
		// drops it); Go's decoder matched any case, the last one winning:
		// a request of 64000 that also said Max_Tokens: 1 was charged 1
		// when cut short, and reserved 1.
		`{"max_tokens":64000,"Max_Tokens":1}`:      64000,
		`{"max_tokens":64000,"max_to\u212aens":1}`: 64000, // the Kelvin sign folds to k
		`{"MAX_TOKENS":64000,"max_tokens":1}`:      64000,
		`{"max_tokens":64000,"max_tokens":1}`:      64000, // duplicates: one upstream reads the first, another the last
		`{"max_tokens":64000,"MAX_TOKENS":"x"}`:    UnknownMaxTokens,
	} {
		if got := outputCharge([]byte(body)); got != want {
			t.Errorf("%s: %d, want %d", body, got, want)
		}
	}
}

// FuzzOutputCharge: whatever body a sandbox sends, the scanner charges
// what encoding/json's Decoder did (outputChargeDecoder), a cut response
// is charged at least one token and at most maxChargedTokens, never less
// than the max_tokens the body states (up to that bound).
func FuzzOutputCharge(f *testing.F) {
	f.Add([]byte(`{"max_tokens":1024,"stream":true}`))
	f.Add([]byte(`{"max_tokens":1099511627777}`))
	f.Add([]byte(`{"max_tokens":-1,"max_tokens":7}`))
	f.Add([]byte(`not json`))
	f.Add([]byte(`{"max_tokens":500000,"Max_Tokens":null}`))
	f.Add([]byte(`{"a":{"max_tokens":1},"max_to\u212aens":[2],"MAX_TOKENS":3e0,"max_tokens":true}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got := outputCharge(body)
		if ref := outputChargeDecoder(body); got != ref {
			t.Fatalf("%q: charge %d; encoding/json's Decoder read %d", body, got, ref)
		}
		if got < 1 || got > maxChargedTokens {
			t.Fatalf("charge %d", got)
		}
		var req struct {
			MaxTokens int64 `json:"max_tokens"`
		}
		if json.Unmarshal(body, &req) == nil && req.MaxTokens > 0 && got < min(req.MaxTokens, maxChargedTokens) {
			t.Fatalf("charge %d under the stated max_tokens %d", got, req.MaxTokens)
		}
	})
}
