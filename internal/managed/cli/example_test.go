package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/cli"
	"agentbox/internal/managed/dockertest"
	"agentbox/internal/managed/example"
	"agentbox/internal/managed/leasecheck"
	mt "agentbox/internal/managed/managedtest"
)

type exampleJSON struct {
	Written        bool   `json:"written"`
	Error          string `json:"error"`
	Version        string `json:"version"`
	Dir            string `json:"dir"`
	ManagedRoot    string `json:"managed_root"`
	AssignmentPath string `json:"assignment_path"`
	Provider       string `json:"provider"`
	DirCreated     bool   `json:"dir_created"`
	Consumer       *struct {
		UID, GID uint32
	} `json:"workspace_consumer"`
	Files     []example.File `json:"files"`
	NextSteps []example.Step `json:"next_steps"`
	Notes     []string       `json:"notes"`
}

func runExample(t *testing.T, args ...string) (result, exampleJSON) {
	t.Helper()
	r := runCLI(t, nil, append([]string{"managed", "example", "--json"}, args...)...)
	var out exampleJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("example --json: exit %d, %v: %q %q", r.code, err, r.stdout, r.stderr)
	}
	return r, out
}

var assignmentWord = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)

// runStep runs one printed command line through the command tree: leading
// NAME=value words are its whole environment, then "branchbox" and its
// arguments. The test directories need no shell quoting.
func runStep(t *testing.T, command string) result {
	t.Helper()
	if strings.ContainsAny(command, `'"\$`) {
		t.Fatalf("the test expects an unquoted command: %s", command)
	}
	words := strings.Fields(command)
	var environ []string
	for len(words) > 0 && assignmentWord.MatchString(words[0]) {
		environ, words = append(environ, words[0]), words[1:]
	}
	if len(words) == 0 || words[0] != example.ProgramName {
		t.Fatalf("not a branchbox command: %s", command)
	}
	return runCLI(t, environ, words[1:]...)
}

// TestExampleTryIt writes the example of every version, then runs each
// printed next step exactly as printed: validate exits 0 with a valid
// summary, and exec-provider runs the example provider, which prints the
// names (never the values) of exactly the environment its lease allows.
func TestExampleTryIt(t *testing.T) {
	euid, egid := uint32(os.Geteuid()), uint32(os.Getegid())
	for _, version := range example.Versions {
		t.Run("v"+version, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "try")
			r, out := runExample(t, "--version", version, dir)
			if r.code != cli.ExitOK || !out.Written || r.stderr != "" {
				t.Fatalf("exit %d %+v stderr %q", r.code, out, r.stderr)
			}
			managed := filepath.Join(dir, example.ManagedDir)
			assignmentPath := filepath.Join(managed, example.RunID, "assignment.json")
			if out.Version != version || out.Dir != dir || out.ManagedRoot != managed || out.AssignmentPath != assignmentPath || !out.DirCreated {
				t.Fatalf("json %+v", out)
			}

			// The files: owned by this process, with the modes the rules require.
			want := map[string]string{
				dir:                          "0700",
				managed:                      "0700",
				filepath.Dir(assignmentPath): "0700",
				assignmentPath:               "0600",
			}
			if version != assignment.Version1 {
				want[filepath.Join(dir, "bin")] = "0700"
				want[filepath.Join(dir, "bin", example.ProviderFile)] = "0700"
				want[filepath.Join(managed, example.RunID, "materializations")] = "0700"
				want[filepath.Join(managed, example.RunID, "materializations", example.ValueFile)] = "0600"
			}
			if len(out.Files) != len(want) {
				t.Fatalf("files %+v, want %v", out.Files, want)
			}
			for _, f := range out.Files {
				fi, err := os.Lstat(f.Path)
				if err != nil {
					t.Fatal(err)
				}
				st := fi.Sys().(*syscall.Stat_t)
				if want[f.Path] != f.Mode || uint32(fi.Mode().Perm()) != parseMode(t, f.Mode) || f.UID != euid || st.Uid != euid || f.GID != st.Gid || f.Role == "" {
					t.Errorf("file %+v (on disk %v uid %d), want mode %s uid %d", f, fi.Mode(), st.Uid, want[f.Path], euid)
				}
			}
			if version == assignment.Version3 {
				if c := out.Consumer; c == nil || c.UID == 0 || c.UID == euid || c.GID == egid {
					t.Fatalf("workspace consumer %+v must be non-root and differ from %d:%d", c, euid, egid)
				}
			}

			wantSteps := 2
			if version == assignment.Version1 {
				wantSteps = 1
			}
			if len(out.NextSteps) != wantSteps {
				t.Fatalf("next steps %+v", out.NextSteps)
			}
			for _, step := range out.NextSteps {
				if !strings.Contains(step.Command, leasecheck.ManagedRootEnv+"="+managed+" ") {
					t.Errorf("step does not point at the managed root: %s", step.Command)
				}
			}

			// Step 1: validate --json.
			r = runStep(t, out.NextSteps[0].Command)
			if r.code != cli.ExitOK {
				t.Fatalf("validate: exit %d %q %q", r.code, r.stdout, r.stderr)
			}
			var v struct {
				Valid          bool   `json:"valid"`
				Version        string `json:"version"`
				RunID          string `json:"run_id"`
				AssignmentPath string `json:"assignment_path"`
				Leases         []struct {
					LeaseID string `json:"lease_id"`
					Live    bool   `json:"live"`
				} `json:"leases"`
				ManagedLaunch struct{ Ready bool } `json:"managed_launch"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
				t.Fatal(err)
			}
			if !v.Valid || v.Version != version || v.RunID != example.RunID || v.AssignmentPath != assignmentPath || v.ManagedLaunch.Ready || len(v.Leases) == 0 {
				t.Fatalf("validate: %+v", v)
			}
			for _, l := range v.Leases {
				if !l.Live {
					t.Errorf("lease %s is not live", l.LeaseID)
				}
			}
			if strings.Contains(r.stdout, example.Value) {
				t.Fatalf("validate prints the value")
			}
			if version == assignment.Version1 {
				return
			}

			// Step 2: exec-provider runs the example provider.
			r = runStep(t, out.NextSteps[1].Command)
			if r.code != cli.ExitOK || r.stderr != "" {
				t.Fatalf("exec-provider: exit %d %q %q", r.code, r.stdout, r.stderr)
			}
			wantOut := "example provider: started with 1 argument(s): hello\n" +
				"environment names received (values are never printed):\n" +
				"  " + example.ValueName + "\n  " + example.InheritedName + "\n  PATH\n"
			if r.stdout != wantOut {
				t.Fatalf("provider output %q, want %q", r.stdout, wantOut)
			}

			// Without the inherited name the same command is refused.
			noInherit := strings.Replace(out.NextSteps[1].Command, example.InheritedName+"="+example.InheritedValue+" ", "", 1)
			if r = runStep(t, noInherit); r.code != cli.ExitRefused || r.stdout != "" {
				t.Fatalf("without %s: exit %d %q %q", example.InheritedName, r.code, r.stdout, r.stderr)
			}
		})
	}
}

func parseMode(t *testing.T, s string) uint32 {
	t.Helper()
	var m uint32
	for _, c := range s {
		if c < '0' || c > '7' {
			t.Fatalf("mode %q", s)
		}
		m = m*8 + uint32(c-'0')
	}
	return m
}

// TestExampleText: without --json the default is version 3, and the text
// names every file and prints the same next steps and notes.
func TestExampleText(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "try")
	r := runCLI(t, nil, "managed", "example", dir)
	if r.code != cli.ExitOK || r.stderr != "" {
		t.Fatalf("exit %d %q", r.code, r.stderr)
	}
	if !strings.HasPrefix(r.stdout, `wrote a version "3" example run below `+dir+":\n") {
		t.Fatalf("text:\n%s", r.stdout)
	}
	// The same example, written as JSON elsewhere, prints the same steps
	// for its own directory.
	other := filepath.Join(t.TempDir(), "try")
	_, out := runExample(t, other)
	if out.Version != example.DefaultVersion {
		t.Fatalf("default version %q", out.Version)
	}
	for _, s := range out.NextSteps {
		if cmd := strings.ReplaceAll(s.Command, other, dir); !strings.Contains(r.stdout, "\n  "+cmd+"\n") || !strings.Contains(r.stdout, "# "+s.Purpose) {
			t.Errorf("text misses step %q:\n%s", cmd, r.stdout)
		}
	}
	for _, f := range out.Files {
		if p := strings.ReplaceAll(f.Path, other, dir); !strings.Contains(r.stdout, p) {
			t.Errorf("text misses %s", p)
		}
	}
	for _, n := range out.Notes {
		if !strings.Contains(r.stdout, "  - "+n+"\n") {
			t.Errorf("text misses note %q", n)
		}
	}
	if strings.Contains(r.stdout, example.Value) {
		t.Fatal("the text prints the value")
	}
}

// TestExampleExistingEmptyDir: an existing empty directory is used as is,
// its mode untouched; the run below it validates.
func TestExampleExistingEmptyDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "empty")
	must(t, os.Mkdir(dir, 0o755))
	must(t, os.Chmod(dir, 0o755))
	r, out := runExample(t, dir)
	if r.code != cli.ExitOK || out.DirCreated || out.Files[0].Path != dir || out.Files[0].Mode != "0755" {
		t.Fatalf("exit %d %+v", r.code, out)
	}
	if r = runStep(t, out.NextSteps[0].Command); r.code != cli.ExitOK {
		t.Fatalf("validate: exit %d %q", r.code, r.stderr)
	}
}

// TestExampleRelativeDir: a relative DIR is resolved against the working
// directory and every printed path is absolute.
func TestExampleRelativeDir(t *testing.T) {
	base := t.TempDir()
	t.Chdir(base)
	r, out := runExample(t, "rel")
	real, err := filepath.EvalSymlinks(base)
	must(t, err)
	if r.code != cli.ExitOK || out.Dir != filepath.Join(real, "rel") {
		t.Fatalf("exit %d dir %q", r.code, out.Dir)
	}
	for _, s := range out.NextSteps {
		if r = runStep(t, s.Command); r.code != cli.ExitOK {
			t.Fatalf("%s: exit %d %q", s.Command, r.code, r.stderr)
		}
	}
}

// TestExampleRefusals: each refusal exits 1 (a refusal: the command line is
// well-formed, the place is not), explains itself, and writes nothing.
func TestExampleRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, base string) string // returns DIR
		reason string
	}{
		{name: "non-empty dir", setup: func(t *testing.T, base string) string {
			dir := filepath.Join(base, "full")
			must(t, os.Mkdir(dir, 0o700))
			must(t, os.WriteFile(filepath.Join(dir, "keep"), []byte("keep"), 0o600))
			return dir
		}, reason: "exists and is not empty"},
		{name: "dir with only a hidden file", setup: func(t *testing.T, base string) string {
			dir := filepath.Join(base, "hidden")
			must(t, os.Mkdir(dir, 0o700))
			must(t, os.WriteFile(filepath.Join(dir, ".keep"), nil, 0o600))
			return dir
		}, reason: "exists and is not empty"},
		{name: "symlink dir", setup: func(t *testing.T, base string) string {
			target := filepath.Join(base, "target")
			must(t, os.Mkdir(target, 0o700))
			must(t, os.Symlink(target, filepath.Join(base, "link")))
			return filepath.Join(base, "link")
		}, reason: "is a symbolic link: example never follows one"},
		{name: "dangling symlink dir", setup: func(t *testing.T, base string) string {
			must(t, os.Symlink(filepath.Join(base, "nowhere"), filepath.Join(base, "link")))
			return filepath.Join(base, "link")
		}, reason: "is a symbolic link"},
		{name: "symlink ancestor", setup: func(t *testing.T, base string) string {
			target := filepath.Join(base, "target")
			must(t, os.Mkdir(target, 0o700))
			must(t, os.Symlink(target, filepath.Join(base, "link")))
			return filepath.Join(base, "link", "dir")
		}, reason: "a symbolic link is on the path to DIR"},
		{name: "file", setup: func(t *testing.T, base string) string {
			p := filepath.Join(base, "file")
			must(t, os.WriteFile(p, nil, 0o600))
			return p
		}, reason: "exists and is not a directory"},
		{name: "missing parent", setup: func(t *testing.T, base string) string {
			return filepath.Join(base, "missing", "dir")
		}, reason: "does not exist"},
		{name: "writable parent", setup: func(t *testing.T, base string) string {
			parent := filepath.Join(base, "open")
			must(t, os.Mkdir(parent, 0o777))
			must(t, os.Chmod(parent, 0o777))
			return filepath.Join(parent, "dir")
		}, reason: "group- or other-writable without the sticky bit"},
		{name: "writable empty dir", setup: func(t *testing.T, base string) string {
			dir := filepath.Join(base, "open")
			must(t, os.Mkdir(dir, 0o770))
			must(t, os.Chmod(dir, 0o770))
			return dir
		}, reason: "group- or other-writable without the sticky bit"},
		{name: "whitespace in dir", setup: func(t *testing.T, base string) string {
			return filepath.Join(base, "with space")
		}, reason: "leases[0].executable: must not contain whitespace"},
		{name: "dir too long for the executable label", setup: func(t *testing.T, base string) string {
			return filepath.Join(base, strings.Repeat("d", assignment.MaxLabelBytes))
		}, reason: "leases[0].executable: must be a label of 1-128 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dir := tc.setup(t, base)
			before := tree(t, base)
			r := runCLI(t, nil, "managed", "example", dir)
			if r.code != cli.ExitRefused || r.stdout != "" || !strings.HasPrefix(r.stderr, "branchbox: refused: ") || !strings.Contains(r.stderr, tc.reason) {
				t.Fatalf("exit %d stdout %q stderr %q, want %q", r.code, r.stdout, r.stderr, tc.reason)
			}
			r, out := runExample(t, dir)
			if r.code != cli.ExitRefused || out.Written || !strings.Contains(out.Error, tc.reason) || r.stderr != "" {
				t.Fatalf("--json: exit %d %+v stderr %q", r.code, out, r.stderr)
			}
			if after := tree(t, base); !slices.Equal(before, after) {
				t.Fatalf("a refusal changed the tree:\n%q\n%q", before, after)
			}
		})
	}
}

// tree lists every path below base without following a link.
func tree(t *testing.T, base string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
	must(t, err)
	return out
}

func TestExampleUsage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "try")
	for _, args := range [][]string{
		{"managed", "example"},
		{"managed", "example", dir, "extra"},
		{"managed", "example", "--version", "4", dir},
		{"managed", "example", "--version", "", dir},
		{"managed", "example", "--no-such-flag", dir},
	} {
		r := runCLI(t, nil, args...)
		if r.code != cli.ExitUsage || !strings.Contains(r.stderr, "--help") {
			t.Errorf("%q: exit %d stderr %q", args, r.code, r.stderr)
		}
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatalf("a usage error wrote %s", dir)
	}
	r := runCLI(t, nil, "managed", "example", "--help")
	if r.code != cli.ExitOK || !strings.Contains(r.stdout, "Exit status") || !strings.Contains(r.stdout, "BRANCHBOX_MANAGED_ROOT") {
		t.Fatalf("--help: exit %d %q", r.code, r.stdout)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestExampleLaunchableUsage: --launchable is version 3's, and
// --service-image needs it; both are usage errors, before anything is
// looked up or written.
func TestExampleLaunchableUsage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ex")
	for _, args := range [][]string{
		{"managed", "example", dir, "--launchable", "--version", "2"},
		{"managed", "example", dir, "--service-image", "x/y:1"},
	} {
		if r := runCLI(t, nil, args...); r.code != cli.ExitUsage {
			t.Errorf("%q: exit %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatalf("a refused example wrote DIR: %v", err)
	}
}

// TestExampleLaunchable writes a launchable example on the real engine
// and runs every printed step, feature start to feature teardown, as
// printed (plus a state directory of the test's). A missing image is
// refused and nothing is written.
func TestExampleLaunchable(t *testing.T) {
	mt.RequireRoot(t)
	image := dockertest.ImageID(t, dockertest.ServiceImageTag)
	base := t.TempDir()

	missing := filepath.Join(base, "missing")
	r := runCLI(t, nil, "managed", "example", missing, "--launchable", "--service-image", "agentbox-test/no-such-image:1")
	if r.code != cli.ExitRefused || !strings.Contains(r.stderr, `the image "agentbox-test/no-such-image:1" is not on the local Docker engine`) {
		t.Fatalf("a missing image: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := os.Lstat(missing); !os.IsNotExist(err) {
		t.Fatalf("a refused example wrote DIR: %v", err)
	}

	dir := filepath.Join(base, "ex")
	r, out := runExample(t, "--launchable", dir)
	if r.code != cli.ExitOK || !out.Written {
		t.Fatalf("exit %d %+v stderr %q", r.code, out, r.stderr)
	}
	data, err := os.ReadFile(out.AssignmentPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		ServiceImages map[string]string `json:"service_images"`
		Repository    struct{ Path, Revision string }
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.ServiceImages["app"] != image || len(doc.ServiceImages) != 1 || doc.Repository.Path != filepath.Join(dir, "src", "project") {
		t.Fatalf("the assignment binds %v at %s, want app on %s", doc.ServiceImages, doc.Repository.Path, image)
	}
	if rev, err := mt.Git(doc.Repository.Path, "rev-parse", "HEAD"); err != nil || strings.TrimSpace(rev) != doc.Repository.Revision {
		t.Fatalf("the assigned revision %s is not the repository's HEAD %q: %v", doc.Repository.Revision, rev, err)
	}

	state := "BRANCHBOX_STATE_DIR=" + filepath.Join(base, "state")
	t.Cleanup(func() {
		if _, err := os.Lstat(filepath.Join(base, "state", "features", example.FeatureName)); err == nil {
			runCLI(t, []string{state, "BRANCHBOX_MANAGED_ROOT=" + out.ManagedRoot}, "feature", "teardown", example.FeatureName, "--force")
		}
	})
	var ran []string
	for _, step := range out.NextSteps {
		words := strings.Fields(step.Command)
		if !slices.Contains(words, "feature") && !slices.Contains(words, "validate") {
			continue // exec-provider: TestExampleTryIt runs it
		}
		environ := []string{state}
		for len(words) > 0 && assignmentWord.MatchString(words[0]) {
			environ, words = append(environ, words[0]), words[1:]
		}
		r := runCLI(t, environ, words[1:]...)
		if r.code != cli.ExitOK {
			t.Fatalf("%s: exit %d\n%s%s", step.Command, r.code, r.stdout, r.stderr)
		}
		ran = append(ran, strings.Join(words[1:3], " "))
		switch words[2] {
		case "exec":
			if r.stdout != "the branchbox example repository\n" {
				t.Fatalf("exec: %q", r.stdout)
			}
		case "ls":
			if !strings.Contains(r.stdout, "example  running") {
				t.Fatalf("ls:\n%s", r.stdout)
			}
		case "teardown":
			if !strings.Contains(r.stdout, "residue_free=true") {
				t.Fatalf("teardown:\n%s", r.stdout)
			}
		}
	}
	if want := []string{"managed validate", "feature start", "feature exec", "feature ls", "feature teardown"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %q, want %q", ran, want)
	}
}
