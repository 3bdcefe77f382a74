package agentbin_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/agentbin"
)

// Env, set to 1, makes the tests that need the npm registry fail rather
// than skip when it cannot be reached (CI sets it); CacheEnv names the
// machine's download cache, so a machine downloads each version once.
const (
	Env      = "JAILBEE_TEST_AGENT"
	CacheEnv = "JAILBEE_AGENT_CACHE"
)

// TestInstallClaude installs the pinned Claude Code from the npm registry
// (through the cache), runs it, and installs it again: the second time
// nothing is looked up or downloaded.
func TestInstallClaude(t *testing.T) {
	if _, err := exec.LookPath("npm"); err != nil {
		if os.Getenv(Env) == "1" {
			t.Fatal("npm is not installed")
		}
		t.Skip("npm is not installed")
	}
	state := t.TempDir()
	var progress bytes.Buffer
	o := agentbin.Options{StateDir: state, CacheDir: os.Getenv(CacheEnv), Progress: &progress}
	inst, present, err := agentbin.Install(context.Background(), o, "claude", "")
	if err != nil {
		if os.Getenv(Env) != "1" && strings.Contains(err.Error(), "npm view") {
			t.Skipf("the registry cannot be reached: %v", err)
		}
		t.Fatalf("install: %v\n%s", err, progress.String())
	}
	if present || inst.Version != agentbin.ClaudeDefaultVersion || inst.Path != filepath.Join(agentbin.BinDir(state, "claude", inst.Version), "claude") {
		t.Fatalf("installed %+v present %v", inst, present)
	}
	if !strings.Contains(progress.String(), "installed claude "+inst.Version) {
		t.Errorf("progress:\n%s", progress.String())
	}
	fi, err := os.Stat(inst.Path)
	if err != nil || fi.Mode().Perm() != 0o755 || fi.Size() != inst.Size {
		t.Fatalf("the binary: %v %v", fi, err)
	}
	out, err := exec.Command(inst.Path, "--version").Output()
	if err != nil || strings.TrimSpace(string(out)) != inst.Version+" (Claude Code)" {
		t.Fatalf("claude --version: %q %v", out, err)
	}

	// Again: a no-op, whatever npm would say.
	o.NPM = "/bin/false"
	again, present, err := agentbin.Install(context.Background(), o, "claude", inst.Version)
	if err != nil || !present || again.SHA256 != inst.SHA256 {
		t.Fatalf("second install: %+v %v %v", again, present, err)
	}
	list, err := agentbin.List(state)
	if err != nil || len(list) != 1 || list[0].Version != inst.Version {
		t.Fatalf("List = %+v %v", list, err)
	}
	if _, err := agentbin.Find(state, "claude", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := agentbin.Find(state, "claude", "1.0.0"); err == nil || !strings.Contains(err.Error(), "jailbee agent install claude --version 1.0.0") {
		t.Fatalf("Find of a version not installed: %v", err)
	}
}

// registry plays the npm registry for the refusal cases: a loopback
// server with one tarball, and an npm stand-in that names it with the
// integrity given.
type registry struct {
	npm, url string
}

func newRegistry(t *testing.T, tarball []byte, integrity string) registry {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(tarball) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String() + "/pkg.tgz"
	npm := filepath.Join(t.TempDir(), "npm")
	script := fmt.Sprintf("#!/bin/sh\nprintf '%%s' '{\"dist.tarball\": \"%s\", \"dist.integrity\": \"%s\"}'\n", url, integrity)
	if err := os.WriteFile(npm, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return registry{npm: npm, url: url}
}

// tarballOf is a gzipped tar of entries (name -> content; a content
// starting with "->" is a symlink to the rest).
func tarballOf(t *testing.T, entries map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, content := range entries {
		hdr := &tar.Header{Name: name, Mode: 0o755, Size: int64(len(content)), Typeflag: tar.TypeReg}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			hdr = &tar.Header{Name: name, Mode: 0o777, Typeflag: tar.TypeSymlink, Linkname: target}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			tw.Write([]byte(content))
		}
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func integrityOf(b []byte) string {
	sum := sha512.Sum512(b)
	return "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
}

func TestInstallRefuses(t *testing.T) {
	good := tarballOf(t, map[string]string{"package/claude": "#!/bin/sh\necho 9.9.9 (Claude Code)\n", "package/package.json": "{}"})
	for _, tc := range []struct {
		name, agent, version string
		tarball              []byte
		integrity            string // "" for the tarball's own
		want                 string
	}{
		{name: "unknown agent", agent: "codex", want: `unknown agent "codex"`},
		{name: "a range", agent: "claude", version: "^2.1.0", want: "not a release number"},
		{name: "a tag", agent: "claude", version: "latest", want: "not a release number"},
		{name: "a path", agent: "claude", version: "../../etc", want: "not a release number"},
		{name: "a changed download", agent: "claude", version: "9.9.9", tarball: good, integrity: integrityOf([]byte("other")), want: "does not match the registry's integrity"},
		{name: "not sha512", agent: "claude", version: "9.9.9", tarball: good, integrity: "sha1-AAAA", want: "no sha512 integrity"},
		{name: "no binary", agent: "claude", version: "9.9.9", tarball: tarballOf(t, map[string]string{"package/README": "x"}), want: "has no package/claude"},
		{name: "the binary a link", agent: "claude", version: "9.9.9", tarball: tarballOf(t, map[string]string{"package/claude": "->/bin/sh"}), want: "has no package/claude"},
		{name: "not gzip", agent: "claude", version: "9.9.9", tarball: []byte("plain"), want: "the tarball"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			o := agentbin.Options{StateDir: state, NPM: "/bin/false"}
			if tc.tarball != nil {
				integrity := tc.integrity
				if integrity == "" {
					integrity = integrityOf(tc.tarball)
				}
				o.NPM = newRegistry(t, tc.tarball, integrity).npm
			}
			_, _, err := agentbin.Install(context.Background(), o, tc.agent, tc.version)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Install: %v, want %q", err, tc.want)
			}
			if list, _ := agentbin.List(state); len(list) != 0 {
				t.Fatalf("a refused install left %+v", list)
			}
			entries, _ := os.ReadDir(filepath.Join(state, "agents", "claude"))
			if len(entries) != 0 {
				t.Fatalf("a refused install left %d entries", len(entries))
			}
		})
	}
}

// TestInstallFromCache: a verified download is kept in the cache by its
// digest and used again by another state directory; a cached file that
// no longer matches is downloaded again.
func TestInstallFromCache(t *testing.T) {
	tarball := tarballOf(t, map[string]string{"package/claude": "#!/bin/sh\necho ok\n"})
	reg := newRegistry(t, tarball, integrityOf(tarball))
	cache := t.TempDir()
	var progress bytes.Buffer
	for i := 0; i < 2; i++ {
		progress.Reset()
		o := agentbin.Options{StateDir: t.TempDir(), CacheDir: cache, NPM: reg.npm, Progress: &progress}
		inst, present, err := agentbin.Install(context.Background(), o, "claude", "9.9.9")
		if err != nil || present {
			t.Fatalf("install %d: %v %v", i, err, present)
		}
		cached := strings.Contains(progress.String(), "using the cached download")
		if cached != (i == 1) {
			t.Fatalf("install %d: cached %v:\n%s", i, cached, progress.String())
		}
		if out, err := exec.Command(inst.Path).Output(); err != nil || string(out) != "ok\n" {
			t.Fatalf("the binary: %q %v", out, err)
		}
	}
	entries, _ := os.ReadDir(cache)
	if len(entries) != 1 {
		t.Fatalf("cache holds %d files", len(entries))
	}
	os.WriteFile(filepath.Join(cache, entries[0].Name()), []byte("tampered"), 0o644)
	progress.Reset()
	if _, _, err := agentbin.Install(context.Background(), agentbin.Options{StateDir: t.TempDir(), CacheDir: cache, NPM: reg.npm, Progress: &progress}, "claude", "9.9.9"); err != nil ||
		strings.Contains(progress.String(), "using the cached download") {
		t.Fatalf("a tampered cache file: %v\n%s", err, progress.String())
	}
}

// TestListSkipsPartial: an installation's temporary directory (a killed
// install) and unknown names are not listed.
func TestListSkipsPartial(t *testing.T) {
	state := t.TempDir()
	for _, d := range []string{"agents/claude/.2.1.332.tmp-123/bin", "agents/other/1.0.0", "agents/claude/notaversion"} {
		os.MkdirAll(filepath.Join(state, d), 0o755)
	}
	if list, err := agentbin.List(state); err != nil || len(list) != 0 {
		t.Fatalf("List = %+v %v", list, err)
	}
	if list, err := agentbin.List(filepath.Join(state, "missing")); err != nil || len(list) != 0 {
		t.Fatalf("List of a new state dir = %+v %v", list, err)
	}
}
