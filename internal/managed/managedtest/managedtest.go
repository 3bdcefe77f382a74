// Package managedtest builds managed-runtime assignments for tests: the
// spec's example documents (completed with the version 1 fields), a rich
// base document covering every scope, and real on-disk fixtures (run
// directory, materialization files, shared directories, endpoint sockets)
// in a temporary managed root, with real modes and digests. The layout
// itself is package runlayout's, which `branchbox managed example` shares.
//
// Every secret a fixture writes contains the marker Secret, so a test can
// assert that no message holds secret bytes.
package managedtest

import (
	"embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/runlayout"
)

//go:embed testdata/*.json
var examples embed.FS

// Secret is part of every secret value, capability and credential a
// fixture writes.
const Secret = "SECRET"

// SpecExamples names the spec's three example assignments.
var SpecExamples = []string{"spec-model-identity", "spec-service-images", "spec-tool-request"}

// Revision is the repository revision the completed documents use.
const Revision = "0123456789abcdef0123456789abcdef01234567"

// Example returns a spec example, completed with the version 1 fields the
// spec leaves out ("The complete manifest also carries the run,
// outer-runtime, repository, branch, workspace, and published-port fields
// required by version 1").
func Example(name string) map[string]any {
	data, err := examples.ReadFile("testdata/" + name + ".json")
	if err != nil {
		panic(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		panic(err)
	}
	Complete(doc, "run-id")
	return doc
}

// Complete fills the version 1 fields a document leaves out.
func Complete(doc map[string]any, runID string) {
	def := map[string]any{
		"run_id":           runID,
		"lease_id":         "assignment-lease",
		"outer_runtime_id": "outer-runtime-1",
		"workspace":        "/workspaces",
		"repository":       map[string]any{"path": "/workspaces/repo", "revision": Revision},
		"task_branch":      "task/example",
		"tunnel_placement": "outer",
		"published_ports":  []any{},
	}
	for k, v := range def {
		if _, ok := doc[k]; !ok {
			doc[k] = v
		}
	}
}

// Digest is a placeholder digest for documents without files.
const Digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// FileDigest is the placeholder digest of Base's file materializations.
const FileDigest = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

// Image is a valid immutable image reference.
const Image = "registry.example/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Base returns a valid version 2 document with one lease of every scope
// (and a standalone endpoint directory), below the default managed root.
// Lease order: 0 model-identity, 1 provider-environment, 2
// project-environment, 3 shared-directory, 4 tool-endpoint (socket), 5
// tool-request, 6 source-control-identity, 7 platform-tunnel, 8
// provider-credential, 9 tool-endpoint (directory).
func Base() map[string]any {
	run := "/run/branchbox/managed/run-1"
	mat := run + "/materializations/"
	exp := "2099-01-01T00:00:00Z"
	doc := map[string]any{
		"version":          "2",
		"run_id":           "run-1",
		"lease_id":         "assignment-1",
		"outer_runtime_id": "outer-1",
		"workspace":        "/workspaces",
		"repository":       map[string]any{"path": "/workspaces/repo", "revision": Revision},
		"task_branch":      "task/demo",
		"tunnel_placement": "outer",
		"published_ports":  []any{map[string]any{"host": 3000, "runtime": 3000}},
		"service_images":   map[string]any{"app": Image},
		"port_proxy_image": "registry.example/runtime/tcp-proxy@sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
		"leases": []any{
			map[string]any{"lease_id": "model", "scope": "model-identity", "consumer": "coding-agent",
				"executable": "provider-cli", "inherited_environment": []any{"MODEL_ACCESS_TOKEN"},
				"expires_at": exp, "materializations": []any{}},
			map[string]any{"lease_id": "delivery", "scope": "provider-environment", "consumer": "coding-agent",
				"expires_at": exp, "materializations": []any{
					map[string]any{"source_path": mat + "delivery-token", "environment_name": "SOURCE_DELIVERY_TOKEN", "sha256": FileDigest},
				}},
			map[string]any{"lease_id": "project", "scope": "project-environment", "consumer": "primary",
				"materializations": []any{
					map[string]any{"source_path": mat + "project-env", "target_path": "/run/branchbox/leases/project-env", "sha256": FileDigest},
				}},
			map[string]any{"lease_id": "shared_exchange", "scope": "shared-directory", "consumer": "primary-tool",
				"expires_at": exp, "materializations": []any{
					map[string]any{"source_path": run + "/shared/exchange", "target_path": "/run/branchbox/leases/shared/exchange"},
				}},
			map[string]any{"lease_id": "delivery_endpoint", "scope": "tool-endpoint", "consumer": "coding-agent",
				"expires_at": exp, "materializations": []any{
					map[string]any{"source_path": run + "/tool-endpoints/delivery.sock", "target_path": "/run/branchbox/leases/tool-endpoints/delivery.sock"},
				}},
			map[string]any{"lease_id": "delivery_requests", "scope": "tool-request", "consumer": "coding-agent",
				"consumer_uid": 1000, "endpoint_lease_id": "delivery_endpoint",
				"request_spool_target": "/run/branchbox/leases/tool-requests/delivery",
				"replay_policy":        "exact-digest-replay-v1",
				"expires_at":           exp, "materializations": []any{
					map[string]any{"source_path": mat + "delivery-capability", "target_path": "/run/branchbox/leases/tool-requests/delivery/.capability", "sha256": FileDigest},
				}},
			map[string]any{"lease_id": "git", "scope": "source-control-identity", "consumer": "git-helper", "materializations": []any{}},
			map[string]any{"lease_id": "tunnel", "scope": "platform-tunnel", "consumer": "outer-connector", "materializations": []any{}},
			map[string]any{"lease_id": "cred_lease", "scope": "provider-credential", "consumer": "coding-agent",
				"expires_at": exp, "materializations": []any{
					map[string]any{"source_path": mat + "provider-credential", "target_path": "/home/agent/.config/provider/credentials.json", "sha256": FileDigest},
				}},
			map[string]any{"lease_id": "status_endpoint", "scope": "tool-endpoint", "consumer": "coding-agent",
				"expires_at": exp, "materializations": []any{
					map[string]any{"source_path": run + "/tool-endpoints/status", "target_path": "/run/branchbox/leases/tool-endpoints/status"},
				}},
		},
	}
	return doc
}

// Clone deep-copies a document.
func Clone(doc map[string]any) map[string]any {
	data, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		panic(err)
	}
	return out
}

// Marshal encodes a document.
func Marshal(doc map[string]any) []byte {
	data, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return data
}

// Lease returns lease i of a document.
func Lease(doc map[string]any, i int) map[string]any {
	return doc["leases"].([]any)[i].(map[string]any)
}

// Mat returns materialization j of lease i.
func Mat(doc map[string]any, i, j int) map[string]any {
	return Lease(doc, i)["materializations"].([]any)[j].(map[string]any)
}

// Fixture is a document laid out on disk in a temporary managed root.
type Fixture struct {
	T      testing.TB
	Root   string // the managed root (BRANCHBOX_MANAGED_ROOT)
	RunDir string
	Path   string // the assignment file
	Doc    map[string]any
}

// New lays doc out in a fresh managed root with runlayout.Lay: the run
// directory (0700), the materializations directory (0700), every file
// materialization (0600, content by scope, digest written into the
// document), every shared-directory source (0755, intermediates 0700),
// every tool-endpoint source (an owner-only socket when its name ends in
// ".sock", else a 0700 directory), and the assignment itself (0600,
// assignment.json). Source paths below /run/branchbox/managed are moved
// below the new root; sources outside the run directory are not created.
func New(t testing.TB, doc map[string]any) *Fixture {
	t.Helper()
	doc = Clone(doc)
	base := t.TempDir()
	f := &Fixture{T: t, Root: filepath.Join(base, "managed"), Doc: doc}
	runID, _ := doc["run_id"].(string)
	f.RunDir = filepath.Join(f.Root, runID)
	f.Path = filepath.Join(f.RunDir, runlayout.AssignmentFile)
	must(t, os.Mkdir(f.Root, 0o755))
	must(t, os.Chmod(f.Root, 0o755))
	leases, _ := doc["leases"].([]any)
	for i := range leases {
		mats, _ := leases[i].(map[string]any)["materializations"].([]any)
		for j := range mats {
			m := mats[j].(map[string]any)
			src, _ := m["source_path"].(string)
			if rest, ok := strings.CutPrefix(src, assignment.DefaultManagedRoot+"/"); ok {
				m["source_path"] = f.Root + "/" + rest
			}
		}
	}
	f.lay()
	return f
}

func (f *Fixture) lay() {
	t := f.T
	_, err := runlayout.Lay(f.RunDir, f.Doc, runlayout.Options{
		Content: Content,
		Socket: func(p string) error {
			MakeSocket(t, p, runlayout.SocketMode)
			return nil
		},
	})
	must(t, err)
}

// Relay removes the run directory and lays the same document out again,
// as an orchestrator re-issuing the assignment does (a teardown removes
// the run's materializations).
func (f *Fixture) Relay() {
	f.T.Helper()
	must(f.T, os.RemoveAll(f.RunDir))
	f.lay()
}

// Content is the file a fixture writes for a file materialization of the
// scope (lease i, materialization j).
func Content(scope string, i, j int) []byte {
	switch scope {
	case "provider-environment":
		return []byte(fmt.Sprintf("value-%s-%d-%d", Secret, i, j))
	case "tool-request":
		return []byte(fmt.Sprintf("capability-%s-%d-%d-0123456789abcdef", Secret, i, j))
	case "project-environment":
		return []byte("APP_MODE=" + Secret + "-project\nLOG_LEVEL=debug\n")
	}
	return []byte(fmt.Sprintf("{\"token\":\"credential-%s-%d-%d\"}\n", Secret, i, j))
}

// SetFile writes content (mode 0600) at materialization j of lease i and
// puts its digest into the document (call Write to store the document).
func (f *Fixture) SetFile(i, j int, content []byte) {
	m := Mat(f.Doc, i, j)
	src := m["source_path"].(string)
	WriteFile(f.T, src, content, runlayout.FileMode)
	m["sha256"] = runlayout.Digest(content)
}

// Source returns the source path of materialization j of lease i.
func (f *Fixture) Source(i, j int) string {
	return Mat(f.Doc, i, j)["source_path"].(string)
}

// Write stores the document as the assignment (mode 0600).
func (f *Fixture) Write() {
	WriteFile(f.T, f.Path, Marshal(f.Doc), runlayout.FileMode)
}

// Env returns the environment entry that points branchbox at the root.
func (f *Fixture) Env() string { return "BRANCHBOX_MANAGED_ROOT=" + f.Root }

// WriteFile writes data at p with exactly mode perm.
func WriteFile(t testing.TB, p string, data []byte, perm os.FileMode) {
	t.Helper()
	must(t, os.WriteFile(p, data, perm))
	must(t, os.Chmod(p, perm))
}

// MakeSocket creates a Unix socket file at p with mode perm. It binds in a
// short directory and renames into place, since socket paths are limited
// to 107 bytes; the socket file stays after its descriptor is closed.
func MakeSocket(t testing.TB, p string, perm os.FileMode) {
	t.Helper()
	short, err := os.MkdirTemp("", "bbs")
	must(t, err)
	defer os.RemoveAll(short)
	tmp := filepath.Join(short, "s")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	must(t, err)
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: tmp})
	unix.Close(fd)
	must(t, err)
	must(t, os.Rename(tmp, p))
	must(t, os.Chmod(p, perm))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// RequireRoot skips a test that changes owners unless it runs as root (CI
// does).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown to other uids")
	}
}
