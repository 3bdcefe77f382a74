package launch_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"agentbox/internal/managed/launch"
	"agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/provider"
)

// TestProvidersOfTwoLeasesCannotReadEachOther: two model-identity
// leases (two consumers, two executables) run providers in the same
// container at the same time. One provider's tree (which runs the
// repository's code) reads every /proc/PID/environ in a loop: it must
// never see the other lease's value.
func TestProvidersOfTwoLeasesCannotReadEachOther(t *testing.T) {
	s := newSetupWith(t, defaultFiles(), func(doc map[string]any) {
		managedtest.Lease(doc, 0)["executable"] = "/bin/sh"
		doc["leases"] = append(doc["leases"].([]any), map[string]any{
			"lease_id": "other_model", "scope": "model-identity", "consumer": "other-agent",
			"executable": "/bin/dash", "inherited_environment": []any{"OTHER_MODEL_TOKEN"},
			"expires_at": "2099-01-01T00:00:00Z", "materializations": []any{},
		})
	})
	if _, err := s.start("pair"); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Setenv("MODEL_ACCESS_TOKEN", "model-"+managedtest.Secret)
	t.Setenv("OTHER_MODEL_TOKEN", "other-"+managedtest.Secret)
	run := func(exe, name string, args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		code, err := launch.ExecProvider(context.Background(), s.cfg, "pair",
			provider.Request{Executable: exe, Inherit: []string{name}, Args: args},
			os.Environ(), strings.NewReader(""), &stdout, &stderr)
		if err == nil && code != 0 {
			t.Errorf("provider %s: exit %d %s", exe, code, stderr.String())
		}
		return stdout.String(), err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The other lease's provider, running while the first looks.
		if _, err := run("/bin/dash", "OTHER_MODEL_TOKEN", "-c", "sleep 4; echo other-marker-done"); err != nil {
			t.Error(err)
		}
	}()
	out, err := run("/bin/sh", "MODEL_ACCESS_TOKEN", "-c", `end=$(( $(date +%s) + 3 ))
while [ "$(date +%s)" -lt "$end" ]; do
	for p in /proc/[0-9]*; do
		grep -q other-marker "$p/cmdline" 2>/dev/null && echo seen
		tr '\0' '\n' < "$p/environ" 2>/dev/null | grep '^OTHER_MODEL_TOKEN='
	done
done | sort -u`)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "seen") {
		t.Fatalf("the first provider never saw the other: %q", out)
	}
	if strings.Contains(out, managedtest.Secret) {
		t.Fatalf("a provider read another lease's value: %q", out)
	}
}
