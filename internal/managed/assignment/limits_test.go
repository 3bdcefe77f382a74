package assignment_test

import (
	"fmt"
	"strings"
	"testing"

	"agentbox/internal/managed/assignment"
	mt "agentbox/internal/managed/managedtest"
)

// Each limit: a document at the limit is accepted, one past it refused.
func TestLimits(t *testing.T) {
	type limit struct {
		name   string
		build  func(n int) map[string]any
		at     int
		field  string
		reason string
	}
	ports := func(n int) map[string]any {
		d := mt.Base()
		var ps []any
		for i := 1; i <= n; i++ {
			ps = append(ps, map[string]any{"host": i, "runtime": i})
		}
		d["published_ports"] = ps
		return d
	}
	images := func(n int) map[string]any {
		d := mt.Base()
		m := map[string]any{}
		for i := 0; i < n; i++ {
			m[fmt.Sprintf("svc%d", i)] = mt.Image
		}
		d["service_images"] = m
		return d
	}
	leases := func(n int) map[string]any {
		d := mt.Base()
		ls := d["leases"].([]any)
		for i := len(ls); i < n; i++ {
			ls = append(ls, map[string]any{"lease_id": fmt.Sprintf("outer%d", i), "scope": "platform-tunnel", "consumer": "c"})
		}
		d["leases"] = ls
		return d
	}
	inherited := func(n int) map[string]any {
		d := mt.Base()
		var names []any
		for i := 0; i < n; i++ {
			names = append(names, fmt.Sprintf("A_%02d", i))
		}
		mt.Lease(d, 0)["inherited_environment"] = names
		return d
	}
	bindings := func(n int) map[string]any {
		d := mt.Base()
		var ms []any
		for i := 0; i < n; i++ {
			ms = append(ms, map[string]any{"source_path": fmt.Sprintf("%s/materializations/v%d", run, i), "environment_name": fmt.Sprintf("V_%02d", i), "sha256": mt.FileDigest})
		}
		mt.Lease(d, 1)["materializations"] = ms
		return d
	}
	omitted := func(n int) map[string]any {
		d := mt.Base()
		v3(d)
		d["workspace_folder"] = "/workspaces/task"
		os := []any{}
		for i := 0; i < n; i++ {
			os = append(os, fmt.Sprintf("s%d", i))
		}
		d["omitted_services"] = os
		return d
	}
	strField := func(p string, mk func(n int) string) func(n int) map[string]any {
		return func(n int) map[string]any { d := mt.Base(); set(d, p, mk(n)); return d }
	}
	rep := func(c string) func(n int) string { return func(n int) string { return strings.Repeat(c, n) } }
	for _, l := range []limit{
		{"published ports", ports, assignment.MaxPublishedPorts, "published_ports", "more than 64"},
		{"service images", images, assignment.MaxServiceImages, "service_images", "more than 64"},
		{"leases", leases, assignment.MaxLeases, "leases", "more than 64"},
		{"inherited names", inherited, assignment.MaxInheritedEnvironment, "leases[0].inherited_environment", "more than 16"},
		{"provider bindings", bindings, assignment.MaxProviderEnvironmentBindings, "leases[1].materializations", "more than 16"},
		{"omitted services", omitted, assignment.MaxOmittedServices, "omitted_services", "more than 32"},
		{"run id bytes", func(n int) map[string]any {
			d := strField("run_id", rep("r"))(n)
			d["leases"] = []any{}
			return d
		}, assignment.MaxIDBytes, "run_id", "1-128"},
		{"lease id bytes", strField("leases.6.lease_id", rep("l")), assignment.MaxIDBytes, "leases[6].lease_id", "1-128"},
		{"consumer bytes", strField("leases.6.consumer", rep("c")), assignment.MaxLabelBytes, "leases[6].consumer", "1-128"},
		{"task branch bytes", strField("task_branch", rep("b")), assignment.MaxTaskBranchBytes, "task_branch", "1-255"},
		{"env name bytes", func(n int) map[string]any {
			d := mt.Base()
			mt.Mat(d, 1, 0)["environment_name"] = strings.Repeat("E", n)
			return d
		}, assignment.MaxEnvNameBytes, "leases[1].materializations[0].environment_name", "1-128"},
		{"service name bytes", func(n int) map[string]any {
			d := mt.Base()
			d["service_images"] = map[string]any{strings.Repeat("s", n): mt.Image}
			return d
		}, assignment.MaxServiceNameBytes, "service_images", "1-128"},
		{"image reference bytes", strField("service_images.app", func(n int) string {
			// registry.example/<path>@sha256:<64>; pad the path with
			// components of at most 63 characters.
			fixed := len("registry.example/") + len("@sha256:") + 64
			body := strings.Repeat("a", n-fixed)
			for i := 60; i < len(body); i += 61 {
				body = body[:i] + "/" + body[i+1:]
			}
			return "registry.example/" + body + "@sha256:" + mt.Digest
		}), assignment.MaxImageRefBytes, "service_images.app", "at most 512"},
		{"workspace folder bytes", func(n int) map[string]any {
			d := omitted(0)
			seg := strings.Repeat("f", 60)
			folder := "/workspaces/" + seg + "/" + seg + "/" + seg
			folder += "/" + strings.Repeat("g", n-len(folder)-1)
			d["workspace_folder"] = folder
			return d
		}, assignment.MaxWorkspaceFolderBytes, "workspace_folder", "at most 200"},
		{"workspace segments", func(n int) map[string]any {
			d := omitted(0)
			d["workspace_folder"] = "/workspaces" + strings.Repeat("/s", n)
			return d
		}, assignment.MaxWorkspaceFolderSegments, "workspace_folder", "1-4 segments"},
		{"workspace segment bytes", func(n int) map[string]any {
			d := omitted(0)
			d["workspace_folder"] = "/workspaces/" + strings.Repeat("s", n)
			return d
		}, assignment.MaxWorkspaceSegmentBytes, "workspace_folder", "1-64"},
	} {
		t.Run(l.name, func(t *testing.T) {
			if err := parse(t, l.build(l.at)); err != nil {
				t.Fatalf("at the limit %d: %v", l.at, err)
			}
			data := mt.Marshal(l.build(l.at + 1))
			_, err := assignment.Parse(data, opts())
			assertRefusal(t, err, l.field, l.reason, data)
		})
	}
}

func TestUIDLimit(t *testing.T) {
	d := mt.Base()
	v3(d)
	set(d, "workspace_consumer.uid", assignment.MaxUID)
	set(d, "leases.5.consumer_uid", assignment.MaxUID)
	if err := parse(t, d); err != nil {
		t.Fatal(err)
	}
	set(d, "workspace_consumer.uid", assignment.MaxUID+1)
	data := mt.Marshal(d)
	_, err := assignment.Parse(data, opts())
	assertRefusal(t, err, "workspace_consumer.uid", "at most 2147483647", data)
}

func TestDocumentSizeLimit(t *testing.T) {
	base := mt.Marshal(mt.Base())
	pad := func(n int) []byte {
		out := append([]byte{}, base...)
		return append(out, []byte(strings.Repeat(" ", n-len(base)))...)
	}
	if _, err := assignment.Parse(pad(assignment.MaxAssignmentBytes), opts()); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	_, err := assignment.Parse(pad(assignment.MaxAssignmentBytes+1), opts())
	assertRefusal(t, err, "", "larger than 1048576 bytes", nil)
}

func TestDepthLimit(t *testing.T) {
	// An unknown member nested to the limit is refused as unknown; one
	// level deeper, as too deep.
	nest := func(depth int) []byte {
		inner := strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1)
		return []byte(`{"version":"2","x":` + inner + `}`)
	}
	_, err := assignment.Parse(nest(assignment.MaxJSONDepth), opts())
	if err == nil || strings.Contains(err.Error(), "nesting") {
		t.Fatalf("at the limit: %v", err)
	}
	_, err = assignment.Parse(nest(assignment.MaxJSONDepth+1), opts())
	if err == nil || !strings.Contains(err.Error(), "nesting deeper than 16") {
		t.Fatalf("past the limit: %v", err)
	}
}
