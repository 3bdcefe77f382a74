package managedtest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"testing"
	"time"

	"agentbox/internal/managed/endpoint"
)

// ServeEndpoint runs a trusted tool endpoint (endpoint.Serve) on socket
// until the test ends, answering each frame with h. A stale socket a
// fixture laid out there is removed first, so the path exists again
// exactly when the endpoint listens; it returns once it does.
func ServeEndpoint(t testing.TB, socket string, h endpoint.Handler) {
	t.Helper()
	if err := os.Remove(socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		endpoint.Serve(ctx, socket, h, t.Logf)
	}()
	t.Cleanup(func() { cancel(); <-done })
	for i := 0; ; i++ {
		if _, err := os.Lstat(socket); err == nil {
			return
		}
		if i == 500 {
			t.Fatal("the endpoint did not listen")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
