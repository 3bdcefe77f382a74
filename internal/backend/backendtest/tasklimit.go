package backendtest

import (
	"fmt"
	"strings"
	"testing"

	"agentbox/internal/backend"
)

// ChurnConnections is how many connections EgressChurnAtTaskLimit makes.
const ChurnConnections = 2000

// EgressChurnAtTaskLimit fills the sandbox's task limit, then churns
// connections through its egress relay, a Go program inside that limit.
// One bash does it, with builtins alone once the limit is reached: sh
// forks sleeps until a fork fails (dash then exits), then
// ChurnConnections connections open and close through the relay, 50 at a
// time. It fails t unless the relay took every one; the caller checks the
// relay and the limit.
func EgressChurnAtTaskLimit(t testing.TB, b backend.Backend, name string) {
	t.Helper()
	script := fmt.Sprintf(`
		sh -c 'while :; do sleep 3600 & done' 2>/dev/null &
		wait $!
		ok=0
		for round in {1..%d}; do
			fds=()
			for i in {1..50}; do
				exec {fd}<>/dev/tcp/127.0.0.1/%d && { fds+=($fd); ok=$((ok+1)); }
			done
			for fd in "${fds[@]}"; do exec {fd}>&-; done
		done
		echo "$ok connections"`, ChurnConnections/50, backend.EgressPort)
	r := Exec(t, b, name, backend.ExecOptions{Argv: []string{"bash", "-c", script}})
	if got, want := strings.TrimSpace(r.Stdout), fmt.Sprintf("%d connections", ChurnConnections); got != want {
		t.Errorf("the egress relay at the task limit: %q (exit %d, stderr %q), want %s", got, r.Code, r.Stderr, want)
	}
}
