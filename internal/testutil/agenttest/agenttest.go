// Package agenttest installs the pinned Claude Code for tests that run
// the real agent, once per machine: the verified tarball comes from the
// machine's agent cache (JAILBEE_AGENT_CACHE) and the binary is kept
// installed beside it, so a test run pays for neither the download nor
// the extraction after the first.
package agenttest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"agentbox/internal/agentbin"
)

// Env, set to 1, makes tests of the real agent fail rather than skip when
// it cannot be installed (CI sets it); CacheEnv names the machine's agent
// cache.
const (
	Env      = "JAILBEE_TEST_AGENT"
	CacheEnv = "JAILBEE_AGENT_CACHE"
)

// pathEnv carries the installed binary's path (or why there is none)
// into the re-executed, contained test process.
const (
	pathEnv   = "AGENTBOX_TEST_CLAUDE"
	reasonEnv = "AGENTBOX_TEST_CLAUDE_MISSING"
)

// Prepare installs the pinned Claude Code (agentbin.ClaudeDefaultVersion)
// and exports its path to this process and its children; run it before
// the tests (contain.Main's before), where the cache is writable. It
// fails only when Env is 1; otherwise the tests that need the agent skip.
func Prepare() error {
	if os.Getenv(pathEnv) != "" || os.Getenv(reasonEnv) != "" {
		return nil
	}
	path, err := install()
	if err != nil {
		if os.Getenv(Env) == "1" {
			return fmt.Errorf("install claude: %w", err)
		}
		return os.Setenv(reasonEnv, err.Error())
	}
	return os.Setenv(pathEnv, path)
}

func install() (string, error) {
	if _, err := exec.LookPath("npm"); err != nil {
		return "", fmt.Errorf("npm is not installed")
	}
	cache := os.Getenv(CacheEnv)
	if cache == "" {
		return "", fmt.Errorf("%s is not set: no machine cache to keep the agent in", CacheEnv)
	}
	// The cache holds tarballs by digest; the installed binary lives in a
	// state dir of its own beside them.
	o := agentbin.Options{StateDir: filepath.Join(cache, "test-state"), CacheDir: cache, Progress: io.Discard}
	inst, _, err := agentbin.Install(context.Background(), o, "claude", agentbin.ClaudeDefaultVersion)
	if err != nil {
		return "", err
	}
	return inst.Path, nil
}

// Claude returns the installed binary's path; without one the test is
// skipped (failed when Env is 1).
func Claude(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(pathEnv); p != "" {
		return p
	}
	why := os.Getenv(reasonEnv)
	if why == "" {
		why = "agenttest.Prepare did not run (TestMain)"
	}
	if os.Getenv(Env) == "1" {
		t.Fatalf("no Claude Code to test with: %s", why)
	}
	t.Skipf("no Claude Code to test with: %s", why)
	return ""
}
