package broker

import (
	"encoding/json"
	"testing"

	"agentbox/internal/manifest"
	"agentbox/internal/wire"
)

func TestDecodeRequest(t *testing.T) {
	for _, tc := range []struct {
		line string
		code wire.Code // "" = accepted
	}{
		{`{"v":1,"op":"list"}`, ""},
		{`{"v":1,"op":"read","args":{"id":"h-1"}}`, ""},
		{`{"v":2,"op":"list"}`, wire.CodeVersion},
		{`{"v":"1","op":"list"}`, wire.CodeVersion},
		{`{"op":"list"}`, wire.CodeVersion},
		{`{"v":2,"op":"list","junk":1}`, wire.CodeVersion},
		{`{"v":1,"op":"list","junk":1}`, wire.CodeBadRequest},
		{`{"v":1}`, wire.CodeBadRequest},
		{`{"v":1,"op":"list"} {}`, wire.CodeBadRequest},
		{`[1]`, wire.CodeBadRequest},
		{`nonsense`, wire.CodeBadRequest},
	} {
		req, werr := decodeRequest([]byte(tc.line))
		switch {
		case tc.code == "" && werr != nil:
			t.Errorf("%s: refused %v", tc.line, werr)
		case tc.code != "" && (werr == nil || werr.Code != tc.code):
			t.Errorf("%s: got %v %+v, want %s", tc.line, werr, req, tc.code)
		}
	}
}

// FuzzDecodeRequest: request lines are untrusted bytes from a sandbox.
// Decoding never panics, refuses with a protocol code, and anything
// accepted is a v1 request with an op that re-encodes to an accepted line.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{`{"v":1,"op":"list"}`, `{"v":2}`, `{"v":1,"op":"send","args":{"manifest":{}}}`, `{`, `null`, `{"v":1e0,"op":"x"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, werr := decodeRequest(line)
		if werr != nil {
			if werr.Code != wire.CodeBadRequest && werr.Code != wire.CodeVersion || werr.Detail == "" {
				t.Fatalf("refusal %+v", werr)
			}
			return
		}
		if req.V != wire.Version || req.Op == "" {
			t.Fatalf("accepted %+v", req)
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, werr := decodeRequest(again); werr != nil {
			t.Fatalf("re-encoded %s refused: %v", again, werr)
		}
	})
}

// FuzzDecodeArgs: an op's arguments are untrusted bytes from a sandbox.
// The send's journal id (manifestID, read before the manifest is
// decoded) is a valid id or none, and the id of every manifest the
// decoder accepts: a refusal or status is never filed under another id.
func FuzzDecodeArgs(f *testing.F) {
	for _, s := range []string{
		`{"manifest":{"version":1,"id":"m-1","type":"message","body":"hi"}}`,
		`{"manifest":{"version":1,"id":"a","ID":"b","type":"message","body":"hi"}}`,
		`{"manifest":{"version":1,"id":"a","id":"b","type":"message","body":"hi"}}`,
		`{"manifest":{"version":1,"\u0069d":"a","type":"message","body":"hi"}}`,
		`{"id":"h-0000000a","keep":true}`, `{"ref":"x","msg_kinds":["done"],"quiet_after_ms":9223372036854775807}`, `{"all":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, v := range []any{&wire.ListArgs{}, &wire.ReadArgs{}, &wire.AckArgs{}, &wire.NextArgs{}, &wire.StatusArgs{}, &struct{}{}} {
			if werr := decodeArgs(raw, v); werr != nil && (werr.Code != wire.CodeBadRequest || werr.Detail == "") {
				t.Fatalf("refusal %+v", werr)
			}
		}
		var args wire.SendArgs
		if decodeArgs(raw, &args) != nil {
			return
		}
		id := manifestID(args.Manifest)
		if id != "" && !manifest.IDPattern.MatchString(id) {
			t.Fatalf("journal id %q", id)
		}
		if m, err := manifest.Decode(args.Manifest, args.Body); err == nil && m.ID != id {
			t.Fatalf("manifest %s decoded with id %q, journaled under %q", args.Manifest, m.ID, id)
		}
	})
}
