// Package incustest gives tests a real Incus to run on: a project of
// their own, removed with everything in it when the test ends.
package incustest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// FastPool is the btrfs storage pool scripts/incus-setup.sh makes where
// the kernel has btrfs.
const FastPool = "jailbee"

// Pool is FastPool when Incus has it, else "" (the profile's pool): tests
// create many sandboxes, each a snapshot on btrfs but a full unpack on dir.
var Pool = sync.OnceValue(func() string {
	if exec.Command("incus", "storage", "show", FastPool).Run() == nil {
		return FastPool
	}
	return ""
})

// HostUID is the host uid of uid inside the instance, through its idmap.
func HostUID(t testing.TB, project, name string, uid int) int {
	t.Helper()
	out, err := exec.Command("incus", "query", "/1.0/instances/"+name+"?project="+project).Output()
	if err != nil {
		t.Fatalf("incus query %s: %v", name, err)
	}
	var inst struct {
		Config map[string]string `json:"config"`
	}
	var idmap []struct {
		Isuid    bool
		Hostid   int
		Nsid     int
		Maprange int
	}
	if err := json.Unmarshal(out, &inst); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(inst.Config["volatile.idmap.current"]), &idmap); err != nil {
		t.Fatalf("%s: idmap: %v", name, err)
	}
	for _, m := range idmap {
		if m.Isuid && uid >= m.Nsid && uid < m.Nsid+m.Maprange {
			return m.Hostid + uid - m.Nsid
		}
	}
	t.Fatalf("%s: uid %d is not mapped", name, uid)
	return -1
}

// RootFS is the host path of an instance's root filesystem (readable by
// root on the host while the instance exists).
func RootFS(project, name string) string {
	return filepath.Join("/var/lib/incus/containers", hostName(project, name), "rootfs")
}

// hostName is what Incus names an instance on the host (its directory,
// its cgroup): PROJECT_NAME outside the default project.
func hostName(project, name string) string {
	if project != "" && project != "default" {
		return project + "_" + name
	}
	return name
}

// BackendEnv names the backend a suite that runs on both puts its
// sandboxes on: "local" (the default) or "incus".
const BackendEnv = "JAILBEE_TEST_BACKEND"

// ProjectFromEnv is "" when BackendEnv asks for the local backend, or a
// Project of t's own when it asks for Incus; any other value fails t.
func ProjectFromEnv(t testing.TB) string {
	t.Helper()
	switch be := os.Getenv(BackendEnv); be {
	case "", "local":
		return ""
	case incus.Type:
		return Project(t)
	default:
		t.Fatalf("%s=%q: want local or %s", BackendEnv, be, incus.Type)
		return ""
	}
}

// ContainerPIDs lists the host pids in an instance's cgroup: the way to
// tell one container's processes from another's on the host, since all
// share one idmap (and so their uids).
func ContainerPIDs(project, name string) []int {
	group := "/lxc.payload." + hostName(project, name)
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/cgroup")
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			line = strings.TrimSpace(line)
			if strings.HasSuffix(line, ":"+group) || strings.Contains(line, ":"+group+"/") {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}
