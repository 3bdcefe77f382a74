package dispatch_test

import (
	"os"
	"path/filepath"
	"testing"

	"agentbox/internal/managed/dispatch"
)

// TestReplayIgnoresTamperedResponseFile: the consumer owns its response
// file (mode 0400, but its owner may chmod and rewrite it). A later
// dispatch of the answered id still returns the recorded response from
// the ledger, and the consumer's file holds it again.
func TestReplayIgnoresTamperedResponseFile(t *testing.T) {
	w := newWorld(t, false)
	w.serve()
	w.put("r1.json", envelope("r1", `{}`))
	first, err := w.dispatch("r1", 0)
	if err != nil {
		t.Fatal(err)
	}
	resp := filepath.Join(w.s.Dir, dispatch.ResponsesDir, "r1.json")
	// What the consumer can do to its own file.
	if err := os.Chmod(resp, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(resp, []byte(`{"forged":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := w.dispatch("r1", 0)
	if err != nil || !again.Cached || string(again.Response.Bytes()) != string(first.Response.Bytes()) {
		t.Fatalf("replay after the consumer rewrote its response file: %+v %v", again, err)
	}
	if data, _ := os.ReadFile(resp); string(data) != string(first.Response.Bytes()) {
		t.Fatalf("the consumer's file holds %q", data)
	}
	if w.count("r1") != 1 {
		t.Fatalf("the endpoint saw r1 %d times", w.count("r1"))
	}
}
