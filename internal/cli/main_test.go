package cli_test

import (
	"os"
	"testing"

	"agentbox/internal/testutil/testbin"
)

// TestMain removes the jailbee binary the broker tests built (testbin).
func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}
