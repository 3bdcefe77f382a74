package assignment_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/assignment"
	mt "agentbox/internal/managed/managedtest"
)

func TestImageReferences(t *testing.T) {
	d := mt.Digest
	for _, tc := range []struct {
		ref, reason string // reason "" = valid
	}{
		{"registry.example/team/app@sha256:" + d, ""},
		{"registry.example:5000/team/app:1.0@sha256:" + d, ""},
		{"registry.example/a/b/c/d@sha256:" + d, ""},
		{"sha256:" + d, ""},
		{"localhost:5000/app_x-y.z:tag_1@sha256:" + d, ""},
		{"", "must not be empty"},
		{"registry.example/${IMAGE}@sha256:" + d, "interpolation"},
		{"$IMAGE", "interpolation"},
		{"https://registry.example/app@sha256:" + d, "URL-shaped"},
		{"registry.example//app@sha256:" + d, "URL-shaped"},
		{"registry.example/app:latest", "tag-only"},
		{"registry.example/app", "tag-only"},
		{"Registry.example/app@sha256:" + d, "lowercase"},
		{"registry.example/app@SHA256:" + d, "lowercase"},
		{"registry.example/app@sha384:" + d, "must be sha256"},
		{"registry.example/app@" + d, "must be sha256"},
		{"registry.example/app@sha256:" + d[:63], "64 lowercase"},
		{"registry.example/app@sha256:" + d + "0", "64 lowercase"},
		{"registry.example/app@sha256:" + strings.Repeat("g", 64), "64 lowercase"},
		{"app@sha256:" + d, "registry and a repository"},
		{"a@b@sha256:" + d, "exactly one"},
		{"registry.example/app\t@sha256:" + d, "whitespace"},
		{"registry.example/app\u0000@sha256:" + d, "control"},
		{"-registry.example/app@sha256:" + d, "registry must be"},
		{"registry.example-/app@sha256:" + d, "registry must be"},
		// Docker reads a first component without '.' or ':' that is not
		// localhost as a docker.io namespace: myorg/app is
		// docker.io/myorg/app, not a registry named myorg.
		{"myorg/app@sha256:" + d, "must name a registry host"},
		{"myorg/team/app:1.0@sha256:" + d, "must name a registry host"},
		{"library/app@sha256:" + d, "must name a registry host"},
		{"my-registry/app@sha256:" + d, "must name a registry host"},
		{"localhostx/app@sha256:" + d, "must name a registry host"},
		{"-registry/app@sha256:" + d, "must name a registry host"},
		{"localhost/app@sha256:" + d, ""},
		{"registry:5000/app@sha256:" + d, ""},
		{"docker.io/myorg/app@sha256:" + d, ""},
		{"127.0.0.1:5000/app@sha256:" + d, ""},
		{"registry.example:99999/app@sha256:" + d, "port"},
		{"registry.example:/app@sha256:" + d, "port"},
		{"registry.example/app:-x@sha256:" + d, "tag"},
		{"registry.example/app:" + strings.Repeat("t", 129) + "@sha256:" + d, "tag"},
		{"registry.example/a:b/c@sha256:" + d, "path components"},
		{"registry.example/./app@sha256:" + d, "path components"},
		{"registry.example/../app@sha256:" + d, "path components"},
		{"registry.example/app.@sha256:" + d, "path components"},
		{"registry.example/a...b@sha256:" + d, "path components"},
		{"registry.example/app/@sha256:" + d, "path components"},
		{"sha256:" + strings.ToUpper(d), "lowercase"},
		{"sha256:" + d[:10], "local content digest"},
		{strings.Repeat("a", 513), "at most 512"},
	} {
		got := assignment.ImageReferenceReason(tc.ref)
		if tc.reason == "" && got != "" {
			t.Errorf("%q refused: %s", tc.ref, got)
		}
		if tc.reason != "" && !strings.Contains(got, tc.reason) {
			t.Errorf("%q: reason %q, want %q", tc.ref, got, tc.reason)
		}
		if tc.ref != "" && got != "" && strings.Contains(got, tc.ref) {
			t.Errorf("reason echoes the reference: %q", got)
		}
	}
}

func TestEnvironmentNames(t *testing.T) {
	for name, want := range map[string]string{
		"MODEL_ACCESS_TOKEN": "", "_PRIVATE": "", "A1": "", "GITHUB_TOKEN": "", "OPENAI_API_KEY": "",
		"":                       "1-128",
		"lower":                  "[A-Z_]",
		"1ABC":                   "[A-Z_]",
		"A-B":                    "[A-Z_]",
		"A B":                    "[A-Z_]",
		"PATH":                   "shell",
		"HOME":                   "shell",
		"IFS":                    "shell",
		"_":                      "shell",
		"BASH_ENV":               "shell",
		"ENV":                    "shell",
		"PROMPT_COMMAND":         "shell",
		"LD_PRELOAD":             "loader",
		"LD_AUDIT":               "loader",
		"DYLD_INSERT_LIBRARIES":  "loader",
		"NODE_OPTIONS":           "loader",
		"PYTHONPATH":             "loader",
		"PERL5OPT":               "loader",
		"JAVA_TOOL_OPTIONS":      "loader",
		"GIT_DIR":                "git-control",
		"GIT_CONFIG_COUNT":       "git-control",
		"GIT_SSH_COMMAND":        "git-control",
		"GIT_ASKPASS":            "git-control",
		"DOCKER_HOST":            "container-supervisor",
		"DOCKER_CONFIG":          "container-supervisor",
		"CONTAINER_HOST":         "container-supervisor",
		"CONTAINERD_ADDRESS":     "container-supervisor",
		"COMPOSE_PROJECT_NAME":   "container-supervisor",
		"DEVCONTAINER_ID":        "container-supervisor",
		"BUILDKIT_HOST":          "container-supervisor",
		"KUBECONFIG":             "container-supervisor",
		"SSH_AUTH_SOCK":          "container-supervisor",
		"BRANCHBOX_MANAGED_ROOT": "branchbox-control",
		"BRANCHBOX_ANYTHING":     "branchbox-control",
		strings.Repeat("A", 128): "",
		strings.Repeat("A", 129): "1-128",
	} {
		got := assignment.EnvironmentNameReason(name)
		if want == "" && got != "" {
			t.Errorf("%q refused: %s", name, got)
		}
		if want != "" && !strings.Contains(got, want) {
			t.Errorf("%q: reason %q, want %q", name, got, want)
		}
	}
}

func TestFileContent(t *testing.T) {
	pv := assignment.ScopeProviderEnvironment
	cap := assignment.ScopeToolRequest
	pe := assignment.ScopeProjectEnvironment
	cr := assignment.ScopeProviderCredential
	secret := "SECRET-"
	for _, tc := range []struct {
		name   string
		scope  assignment.Scope
		data   string
		reason string
	}{
		{"value at lower bound", pv, "SECRET-8", ""},
		{"value below lower bound", pv, "SECRET-", "8-16384 bytes"},
		{"value at upper bound", pv, secret + strings.Repeat("v", 16384-len(secret)), ""},
		{"value past upper bound", pv, secret + strings.Repeat("v", 16385-len(secret)), "8-16384 bytes"},
		{"value utf-8", pv, "SECRET-é€", ""},
		{"value invalid utf-8", pv, "SECRET-\xff\xfe", "UTF-8"},
		{"value trailing newline", pv, "SECRET-value\n", "control character"},
		{"value NUL", pv, "SECRET-\x00value", "control character"},
		{"value tab", pv, "SECRET-\tvalue", "control character"},
		{"value DEL", pv, "SECRET-\x7fvalue", "control character"},
		{"value C1 control", pv, "SECRET-\u0085value", "control character"},
		{"capability", cap, "SECRET-" + strings.Repeat("c", 25), ""},
		{"capability too short", cap, "SECRET-" + strings.Repeat("c", 24), "32-128 bytes"},
		{"capability at max", cap, "SECRET-" + strings.Repeat("c", 121), ""},
		{"capability too long", cap, "SECRET-" + strings.Repeat("c", 122), "32-128 bytes"},
		{"capability bad char", cap, "SECRET-" + strings.Repeat("c", 24) + "/", "may only use"},
		{"project env", pe, "A=1\nB=SECRET\n", ""},
		{"project env empty value", pe, "A=\n", ""},
		{"project env no newline", pe, "A=SECRET", "LF-terminated"},
		{"project env CR", pe, "A=SECRET\r\n", "LF-terminated"},
		{"project env comment", pe, "# c\nA=SECRET\n", "line 1"},
		{"project env blank line", pe, "A=SECRET\n\nB=1\n", "line 2"},
		{"project env unsorted", pe, "B=1\nA=SECRET\n", "sorted"},
		{"project env duplicate", pe, "A=1\nA=SECRET\n", "sorted"},
		{"project env reserved", pe, "PATH=SECRET\n", "reserved"},
		{"project env credential", pe, "OPENAI_API_KEY=SECRET\n", "provider credentials"},
		{"project env codex", pe, "CODEX_HOME=SECRET\n", "provider credentials"},
		{"project env lowercase", pe, "a=SECRET\n", "[A-Z_]"},
		{"project env control", pe, "A=SECRET\tx\n", "control"},
		{"project env too many", pe, strings.Repeat("A=1\n", 1) + manyEntries(256), "more than 256"},
		{"project env at entries", pe, manyEntries(256), ""},
		{"credential", cr, "{\"token\":\"SECRET\"}\n", ""},
		{"credential too big", cr, strings.Repeat("S", 64<<10+1), "1-65536 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := assignment.CheckFileContent(tc.scope, []byte(tc.data))
			if tc.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("err = %v, want %q", err, tc.reason)
			}
			if !errors.Is(err, assignment.ErrInvalid) || strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("bad refusal %v", err)
			}
		})
	}
}

func manyEntries(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "K%03d=SECRET\n", i)
	}
	return b.String()
}

func TestAuthorizeProvider(t *testing.T) {
	base := func() *assignment.Assignment {
		a, err := assignment.Parse(mt.Marshal(mt.Base()), opts())
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := base()
	g, err := a.AuthorizeProvider("provider-cli", []string{"MODEL_ACCESS_TOKEN"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if g.Consumer != "coding-agent" || len(g.Values) != 1 || g.Values[0].Name != "SOURCE_DELIVERY_TOKEN" || g.Identity != 0 {
		t.Fatalf("grant = %+v", g)
	}
	for _, tc := range []struct {
		name      string
		exe       string
		inherited []string
		at        time.Time
		reason    string
	}{
		{"unknown executable", "other-cli", []string{"MODEL_ACCESS_TOKEN"}, now, "no model-identity lease"},
		{"no inherited names", "provider-cli", nil, now, "exact ordered list"},
		{"extra inherited name", "provider-cli", []string{"MODEL_ACCESS_TOKEN", "OTHER_TOKEN"}, now, "exact ordered list"},
		{"other inherited name", "provider-cli", []string{"OTHER_TOKEN"}, now, "exact ordered list"},
		{"reserved inherited name", "provider-cli", []string{"LD_PRELOAD"}, now, "loader"},
		{"expired identity", "provider-cli", []string{"MODEL_ACCESS_TOKEN"}, time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), "has expired"},
		{"bad executable", "a=b", nil, now, "NAME=value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := base().AuthorizeProvider(tc.exe, tc.inherited, tc.at)
			if err == nil || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("err = %v, want %q", err, tc.reason)
			}
		})
	}
	t.Run("ordered list", func(t *testing.T) {
		d := mt.Base()
		mt.Lease(d, 0)["inherited_environment"] = []any{"A_TOKEN", "B_TOKEN"}
		a, err := assignment.Parse(mt.Marshal(d), opts())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.AuthorizeProvider("provider-cli", []string{"B_TOKEN", "A_TOKEN"}, now); err == nil {
			t.Fatal("reordered names accepted")
		}
		if _, err := a.AuthorizeProvider("provider-cli", []string{"A_TOKEN", "B_TOKEN"}, now); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("expired provider environment", func(t *testing.T) {
		d := mt.Base()
		mt.Lease(d, 1)["expires_at"] = "2050-01-01T00:00:00Z"
		a, err := assignment.Parse(mt.Marshal(d), opts())
		if err != nil {
			t.Fatal(err)
		}
		_, err = a.AuthorizeProvider("provider-cli", []string{"MODEL_ACCESS_TOKEN"}, time.Date(2060, 1, 1, 0, 0, 0, 0, time.UTC))
		if err == nil || !strings.Contains(err.Error(), "provider-environment lease of this consumer has expired") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("values only of the exact consumer", func(t *testing.T) {
		d := mt.Base()
		d["leases"] = append(d["leases"].([]any),
			map[string]any{"lease_id": "model2", "scope": "model-identity", "consumer": "other-agent", "executable": "other-cli", "expires_at": "2099-01-01T00:00:00Z"},
			map[string]any{"lease_id": "other_env", "scope": "provider-environment", "consumer": "other-agent", "expires_at": "2099-01-01T00:00:00Z",
				"materializations": []any{map[string]any{"source_path": run + "/materializations/other", "environment_name": "OTHER_TOKEN", "sha256": mt.FileDigest}}})
		a, err := assignment.Parse(mt.Marshal(d), opts())
		if err != nil {
			t.Fatal(err)
		}
		g, err := a.AuthorizeProvider("other-cli", nil, now)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Values) != 1 || g.Values[0].Name != "OTHER_TOKEN" {
			t.Fatalf("values = %+v", g.Values)
		}
	})
}

func TestAuthorizeProviderVersion1(t *testing.T) {
	d := mt.Base()
	v1(d)
	a, err := assignment.Parse(mt.Marshal(d), opts())
	if err != nil {
		t.Fatal(err)
	}
	g, err := a.AuthorizeProvider("codex", []string{"OPENAI_API_KEY"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if g.Consumer != "codex" || len(g.Values) != 0 {
		t.Fatalf("grant = %+v", g)
	}
	for _, tc := range []struct {
		exe       string
		inherited []string
		reason    string
	}{
		{"provider-cli", []string{"OPENAI_API_KEY"}, "fixed providers"},
		{"codex", nil, "exactly its one fixed"},
		{"codex", []string{"ANTHROPIC_API_KEY"}, "exactly its one fixed"},
		{"codex", []string{"OPENAI_API_KEY", "OTHER"}, "exactly its one fixed"},
		{"claude", []string{"ANTHROPIC_API_KEY"}, "no model-identity lease"},
	} {
		if _, err := a.AuthorizeProvider(tc.exe, tc.inherited, now); err == nil || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s %v: err = %v, want %q", tc.exe, tc.inherited, err, tc.reason)
		}
	}
	mt.Lease(d, 0)["expires_at"] = "2001-01-01T00:00:00Z"
	a, err = assignment.Parse(mt.Marshal(d), opts())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AuthorizeProvider("codex", []string{"OPENAI_API_KEY"}, now); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired v1 identity: %v", err)
	}
}

func TestRequireManagedLaunch(t *testing.T) {
	runtime := assignment.Identity{UID: 10001, GID: 10001}
	parsed := func(mutate func(map[string]any)) *assignment.Assignment {
		d := mt.Base()
		mutate(d)
		a, err := assignment.Parse(mt.Marshal(d), assignment.Options{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if err := parsed(v3).RequireManagedLaunch(runtime); err != nil {
		t.Fatalf("v3 with consumer and images: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(map[string]any)
		rt     assignment.Identity
		field  string
		reason string
	}{
		{"version 2", func(map[string]any) {}, runtime, "version", "version \"3\""},
		{"version 1", v1, runtime, "version", "version \"3\""},
		{"consumer uid is runtime", v3, assignment.Identity{UID: 1000, GID: 1}, "workspace_consumer.uid", "distinct from the runtime's uid"},
		{"consumer gid is runtime", v3, assignment.Identity{UID: 1, GID: 1000}, "workspace_consumer.gid", "distinct from the runtime's gid"},
		{"no service images", all(v3, with("service_images", del), with("port_proxy_image", del)), runtime, "service_images", "preloaded images"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := parsed(tc.mutate).RequireManagedLaunch(tc.rt)
			var ae *assignment.Error
			if !errors.As(err, &ae) || ae.Field != tc.field || !strings.Contains(ae.Reason, tc.reason) {
				t.Fatalf("err = %v, want %s: %q", err, tc.field, tc.reason)
			}
		})
	}
}

func TestCheckServiceImagesComplete(t *testing.T) {
	images := map[string]string{"app": mt.Image, "db": mt.Image}
	if err := assignment.CheckServiceImagesComplete(images, []string{"db", "app"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		runnable []string
		reason   string
	}{
		{[]string{"app", "db", "cache"}, `without an image: ["cache"]`},
		{[]string{"app"}, `not runnable services (unknown or disabled connectors): ["db"]`},
		{[]string{"app", "cache"}, `without an image: ["cache"]; names that are not runnable services: ["db"]`},
	} {
		err := assignment.CheckServiceImagesComplete(images, tc.runnable)
		if err == nil || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%v: err = %v, want %q", tc.runnable, err, tc.reason)
		}
	}
}
