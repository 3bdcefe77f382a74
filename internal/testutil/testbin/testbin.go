// Package testbin builds the jailbee binary for tests, once per test
// process: the local backend runs it as its launcher and supervisor, and
// sandboxes run it as their inbox client and git relay.
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	once sync.Once
	path string
	err  error
	dir  string
)

// binaryEnv carries a binary built before the tests were re-executed (in
// a contained namespace, where the build cache is read-only).
const binaryEnv = "AGENTBOX_TEST_JAILBEE"

// Jailbee returns the path of a static jailbee binary built from this
// module's cmd/jailbee, building it on first use. Cleanup removes it.
func Jailbee(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(binaryEnv); p != "" {
		return p
	}
	once.Do(build)
	if err != nil {
		t.Fatalf("build jailbee: %v", err)
	}
	return path
}

// Prebuild builds the binary now and exports its path to processes this
// one starts (call it in TestMain before contain.Main). It returns the
// build error, if any.
func Prebuild() error {
	if os.Getenv(binaryEnv) != "" {
		return nil
	}
	once.Do(build)
	if err != nil {
		return err
	}
	return os.Setenv(binaryEnv, path)
}

func build() {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		err = os.ErrNotExist
		return
	}
	module := filepath.Join(filepath.Dir(file), "..", "..", "..")
	if dir, err = os.MkdirTemp("", "jailbee-bin-"); err != nil {
		return
	}
	// Readable by a sandbox's unprivileged uid when a non-root broker test
	// binds it (a root broker stages it).
	if err = os.Chmod(dir, 0o755); err != nil {
		return
	}
	path = filepath.Join(dir, "jailbee")
	cmd := exec.Command("go", "build", "-o", path, "./cmd/jailbee")
	cmd.Dir = module
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, berr := cmd.CombinedOutput(); berr != nil {
		err = &buildError{berr, string(out)}
	}
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// Cleanup removes the binary this process built; call it from TestMain
// after the tests.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}
