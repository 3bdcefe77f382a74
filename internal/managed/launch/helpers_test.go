package launch_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/dockertest"
	"agentbox/internal/managed/launch"
	"agentbox/internal/testutil/wait"
)

// execIn runs argv in feature name's container and returns its combined
// output and exit status.
func execIn(t *testing.T, s *setup, name string, argv ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code, err := launch.Exec(context.Background(), s.cfg, name, argv, nil, &out, &out)
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return strings.TrimSpace(out.String()), code
}

// freePort is a loopback TCP port nothing listens on now.
func freePort(t testing.TB) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// dialRead connects to 127.0.0.1:port and reads until EOF, retrying while
// the server inside the container starts.
func dialRead(t *testing.T, port uint16) string {
	t.Helper()
	var last error
	for deadline := time.Now().Add(wait.Guard); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))), 2*time.Second)
		if err != nil {
			last = err
			continue
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		data, err := io.ReadAll(c)
		c.Close()
		if err == nil && len(data) > 0 {
			return string(data)
		}
		last = err
	}
	t.Fatalf("nothing came through 127.0.0.1:%d: %v", port, last)
	return ""
}

// isCode reports whether err is a launch error with code.
func isCode(err error, code string) bool {
	var le *launch.Error
	return errors.As(err, &le) && le.Code == code
}

// testLog sends the launch's progress to the test log.
type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// engineEvents is what the engine itself recorded of Compose project
// project's containers since since (create, start, ...), one "action id"
// a line: the engine's word, not the launch's, that nothing of a refused
// launch was created or started.
func engineEvents(t *testing.T, project string, since time.Time) string {
	t.Helper()
	return dockertest.Docker(t, "events", "--since", strconv.FormatInt(since.Add(-time.Second).Unix(), 10),
		"--until", strconv.FormatInt(time.Now().Add(time.Second).Unix(), 10),
		"--filter", "type=container", "--filter", "label=com.docker.compose.project="+project,
		"--format", "{{.Action}} {{.ID}}")
}

// startEvents keeps the start events of engineEvents' output.
func startEvents(events string) []string {
	var out []string
	for _, line := range strings.Split(events, "\n") {
		if strings.HasPrefix(line, "start ") {
			out = append(out, line)
		}
	}
	return out
}
