// Package incustest gives tests a real Incus to run on: a project of
// their own, removed with everything in it when the test ends.
package incustest

import (
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"strings"
	"testing"

	"agentbox/internal/backend/incus"
)

// RequireEnv set to 1 (as .ci/run sets it once Incus is set up) makes a
// missing Incus or image a failure instead of a skip.
const RequireEnv = "JAILBEE_TEST_INCUS"

// Project skips t (or fails it, under RequireEnv) unless Incus answers and
// holds the jailbee image, then creates a project sharing the default
// project's images and profiles, removed with its instances at the end.
func Project(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	b, err := incus.New(ctx, incus.Options{})
	if err == nil && !b.HasImage(ctx) {
		err = incus.ErrNoImage
	}
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("Incus was asked for (%s=1): %v", RequireEnv, err)
		}
		t.Skipf("no Incus here (%v); set %s=1 to make this a failure", err, RequireEnv)
	}
	project := "jbtest-" + strings.ToLower(rand.Text()[:10])
	if out, err := exec.Command("incus", "project", "create", project, "-c", "features.images=false", "-c", "features.profiles=false").CombinedOutput(); err != nil {
		t.Fatalf("incus project create: %v: %s", err, out)
	}
	t.Cleanup(func() {
		out, err := exec.Command("incus", "list", "--project", project, "-f", "csv", "-c", "n").Output()
		if err != nil {
			t.Errorf("list project %s: %v", project, err)
		}
		for _, name := range strings.Fields(string(out)) {
			exec.Command("incus", "delete", "--project", project, "--force", name).Run()
		}
		if out, err := exec.Command("incus", "project", "delete", project).CombinedOutput(); err != nil {
			t.Errorf("delete project %s: %v: %s", project, err, out)
		}
	})
	return project
}
