package provider_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/leasecheck"
	mt "agentbox/internal/managed/managedtest"
	"agentbox/internal/managed/provider"
)

var now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fixture lays out the spec's model-identity example with executable exe.
func fixture(t *testing.T, exe string) (*mt.Fixture, *leasecheck.Checked) {
	t.Helper()
	doc := mt.Example("spec-model-identity")
	mt.Lease(doc, 0)["executable"] = exe
	f := mt.New(t, doc)
	c, err := leasecheck.Load(f.Path, leasecheck.Options{ManagedRoot: f.Root, Now: now,
		Runtime: assignment.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}})
	must(t, err)
	return f, c
}

// hostile is a caller environment full of things a provider must not see.
func hostile(f *mt.Fixture) []string {
	return []string{
		"PATH=/tmp/evil:/usr/bin",
		"HOME=/root",
		"LD_PRELOAD=/tmp/evil.so",
		"OTHER_TOKEN=other-" + mt.Secret,
		"SOURCE_DELIVERY_TOKEN=caller-override",
		"MODEL_ACCESS_TOKEN=caller-" + mt.Secret,
		"MODEL_ACCESS_TOKEN=second-definition",
		"DOCKER_HOST=unix:///var/run/docker.sock",
		f.Env(),
	}
}

func run(t *testing.T, plan *provider.Plan, caller []string) (string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := plan.Run(context.Background(), caller, strings.NewReader(""), &out, &errb)
	must(t, err)
	return out.String(), code
}

func envLines(s string) []string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	slices.Sort(lines)
	return lines
}

func TestExactEnvironment(t *testing.T) {
	for _, exe := range []string{"/usr/bin/env", "env"} {
		t.Run(exe, func(t *testing.T) {
			f, c := fixture(t, exe)
			plan, err := provider.Authorize(c, provider.Request{Executable: exe, Inherit: []string{"MODEL_ACCESS_TOKEN"}}, now)
			must(t, err)
			if plan.Path() != "/usr/bin/env" {
				t.Fatalf("resolved %q", plan.Path())
			}
			out, code := run(t, plan, hostile(f))
			if code != 0 {
				t.Fatalf("exit %d", code)
			}
			want := []string{
				"MODEL_ACCESS_TOKEN=caller-" + mt.Secret,
				"PATH=" + provider.SafePATH,
				"SOURCE_DELIVERY_TOKEN=" + string(mt.Content("provider-environment", 1, 0)),
			}
			if got := envLines(out); !slices.Equal(got, want) {
				t.Fatalf("child environment\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestArgumentsAndExitStatus(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "provider.sh")
	mt.WriteFile(t, script, []byte("#!/bin/sh\necho \"$0|$1|$2\"\nexit 3\n"), 0o700)
	f, c := fixture(t, script)
	plan, err := provider.Authorize(c, provider.Request{Executable: script, Inherit: []string{"MODEL_ACCESS_TOKEN"}, Args: []string{"a b", "--flag"}}, now)
	must(t, err)
	out, code := run(t, plan, hostile(f))
	// The kernel hands a #! script to its interpreter by the name it
	// executed: the checked handle, descriptor 3 (a binary's argv[0] is
	// the signed path: TestArgv0IsTheSignedPath).
	if code != 3 || out != "/proc/self/fd/3|a b|--flag\n" {
		t.Fatalf("code %d out %q", code, out)
	}
}

func TestValueRotatedAfterValidation(t *testing.T) {
	f, c := fixture(t, "/usr/bin/env")
	plan, err := provider.Authorize(c, provider.Request{Executable: "/usr/bin/env", Inherit: []string{"MODEL_ACCESS_TOKEN"}}, now)
	must(t, err)
	// Rotate the value after validation and authorization, keeping its
	// mode and owner: the digest recomputed at exec refuses it.
	mt.WriteFile(t, f.Source(1, 0), []byte("rotated-"+mt.Secret+"-value"), 0o600)
	var out bytes.Buffer
	_, err = plan.Run(context.Background(), hostile(f), nil, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "does not match its sha256") {
		t.Fatalf("rotated value: err = %v", err)
	}
	if strings.Contains(err.Error(), mt.Secret) || out.Len() != 0 {
		t.Fatalf("message %q or output %q leaks", err, out.String())
	}
	// Widened mode with the signed bytes: refused too.
	mt.WriteFile(t, f.Source(1, 0), mt.Content("provider-environment", 1, 0), 0o644)
	if _, err := plan.Environment(hostile(f)); err == nil || !strings.Contains(err.Error(), "owner-only") {
		t.Fatalf("widened mode: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	f, c := fixture(t, "/usr/bin/env")
	for _, tc := range []struct {
		name   string
		req    provider.Request
		at     time.Time
		reason string
	}{
		{"other executable", provider.Request{Executable: "/usr/bin/id", Inherit: []string{"MODEL_ACCESS_TOKEN"}}, now, "no model-identity lease"},
		{"missing inherited name", provider.Request{Executable: "/usr/bin/env"}, now, "exact ordered list"},
		{"extra inherited name", provider.Request{Executable: "/usr/bin/env", Inherit: []string{"MODEL_ACCESS_TOKEN", "OTHER_TOKEN"}}, now, "exact ordered list"},
		{"expired identity", provider.Request{Executable: "/usr/bin/env", Inherit: []string{"MODEL_ACCESS_TOKEN"}}, time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := provider.Authorize(c, tc.req, tc.at)
			if err == nil || !strings.Contains(err.Error(), tc.reason) || !errors.Is(err, assignment.ErrInvalid) {
				t.Fatalf("err = %v, want %q", err, tc.reason)
			}
		})
	}
	t.Run("inherited name unset in the caller", func(t *testing.T) {
		plan, err := provider.Authorize(c, provider.Request{Executable: "/usr/bin/env", Inherit: []string{"MODEL_ACCESS_TOKEN"}}, now)
		must(t, err)
		_, err = plan.Environment([]string{"PATH=/usr/bin", f.Env()})
		if err == nil || !strings.Contains(err.Error(), "MODEL_ACCESS_TOKEN is not set") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("bare name outside the fixed PATH", func(t *testing.T) {
		_, c := fixture(t, "no-such-provider")
		_, err := provider.Authorize(c, provider.Request{Executable: "no-such-provider", Inherit: []string{"MODEL_ACCESS_TOKEN"}}, now)
		if err == nil || !strings.Contains(err.Error(), "not in the fixed PATH") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("signed path not executable", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "provider")
		mt.WriteFile(t, p, []byte("#!/bin/sh\n"), 0o600)
		_, c := fixture(t, p)
		_, err := provider.Authorize(c, provider.Request{Executable: p, Inherit: []string{"MODEL_ACCESS_TOKEN"}}, now)
		if err == nil || !strings.Contains(err.Error(), "does not name an executable regular file") {
			t.Fatalf("err = %v", err)
		}
	})
}

// Version 1: a fixed allowlisted provider name, exactly its one inherited
// name, and nothing else.
func TestVersion1Allowlist(t *testing.T) {
	dir := t.TempDir()
	env, err := os.ReadFile("/usr/bin/env")
	must(t, err)
	mt.WriteFile(t, filepath.Join(dir, "codex"), env, 0o755)
	defer provider.SetLookupDirsForTest([]string{dir})()

	doc := map[string]any{"version": "1", "leases": []any{
		map[string]any{"lease_id": "model", "scope": "model-identity", "consumer": "codex"},
	}}
	mt.Complete(doc, "run-v1")
	f := mt.New(t, doc)
	c, err := leasecheck.Load(f.Path, leasecheck.Options{ManagedRoot: f.Root, Now: now,
		Runtime: assignment.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}})
	must(t, err)
	plan, err := provider.Authorize(c, provider.Request{Executable: "codex", Inherit: []string{"OPENAI_API_KEY"}}, now)
	must(t, err)
	out, code := run(t, plan, []string{"OPENAI_API_KEY=sk-" + mt.Secret, "ANTHROPIC_API_KEY=x", "HOME=/root"})
	want := []string{"OPENAI_API_KEY=sk-" + mt.Secret, "PATH=" + provider.SafePATH}
	if got := envLines(out); code != 0 || !slices.Equal(got, want) {
		t.Fatalf("code %d env %q, want %q", code, got, want)
	}
	if _, err := provider.Authorize(c, provider.Request{Executable: "codex", Inherit: []string{"ANTHROPIC_API_KEY"}}, now); err == nil {
		t.Fatal("v1 provider with another name accepted")
	}
	if _, err := provider.Authorize(c, provider.Request{Executable: "claude", Inherit: []string{"ANTHROPIC_API_KEY"}}, now); err == nil {
		t.Fatal("v1 provider without a model identity accepted")
	}
}
