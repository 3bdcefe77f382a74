package local_test

import (
	"crypto/rand"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/local"
	"agentbox/internal/testutil/contain"
	"agentbox/internal/testutil/testbin"
)

// TestMain builds jailbee (the launcher, supervisor and client), then runs
// the tests where a regression cannot damage the host (contain).
func TestMain(m *testing.M) { contain.Main(m, testbin.Prebuild, testbin.Cleanup) }

// testLimits are small enough to hit in tests, big enough for git.
var testLimits = backend.Limits{Pids: 256, MemoryBytes: 512 << 20, CPUWeight: 100}

func newBackend(t *testing.T) *local.Backend {
	t.Helper()
	b, err := local.New(local.Options{Root: filepath.Join(t.TempDir(), "sandboxes"), Binary: testbin.Jailbee(t)})
	if err != nil {
		t.Fatalf("local.New: %v", err)
	}
	return b
}

// hostUID picks a host uid for a sandbox as a root broker does: random in
// a range no account uses.
func hostUID(t testing.TB) int {
	if os.Geteuid() != 0 {
		return 0
	}
	var b [4]byte
	rand.Read(b[:])
	return 1<<30 + int(binary.LittleEndian.Uint32(b[:])%(1<<20))
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend { return newBackend(t) },
		backendtest.Options{HostUID: hostUID, Limits: testLimits, AgentOnly: true, AttachAtStart: true})
}
