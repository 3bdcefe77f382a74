package outboxread

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"agentbox/internal/manifest"
)

// home makes a home with both outboxes and files (outbox/name -> content).
func home(t *testing.T, files map[string]string) string {
	t.Helper()
	h := t.TempDir()
	for _, d := range Dirs {
		if err := os.MkdirAll(filepath.Join(h, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for path, content := range files {
		ob, name, _ := strings.Cut(path, "/")
		if err := os.WriteFile(filepath.Join(h, Dirs[ob], name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func TestReadRegularFile(t *testing.T) {
	h := home(t, map[string]string{"issue/close-12.json": "{}", "pr/src.json": "x", "issue/x.progress.json": "p", "issue/notes.txt": "n"})
	r := Read(h, manifest.OutboxIssue, "close-12.json")
	if r.Error != "" || string(r.Manifest) != "{}" {
		t.Fatalf("got %+v", r)
	}
	if got := strings.Join(r.Staged, ","); got != "issue/close-12.json,pr/src.json" || r.More {
		t.Fatalf("staged %s more %v", got, r.More)
	}
}

func TestReadRefusals(t *testing.T) {
	h := home(t, map[string]string{"issue/target.json": "secret"})
	issue := filepath.Join(h, Dirs[manifest.OutboxIssue])
	if err := os.Symlink(filepath.Join(issue, "target.json"), filepath.Join(issue, "link.json")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(issue, "fifo.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(issue, "dir.json"), 0o700); err != nil {
		t.Fatal(err)
	}
	// The pr outbox itself a symlink to the issue outbox.
	pr := filepath.Join(h, Dirs[manifest.OutboxPR])
	if err := os.Remove(pr); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(issue, pr); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ outbox, name, want string }{
		{"issue", "link.json", ErrNotRegular},
		{"issue", "fifo.json", ErrNotRegular},
		{"issue", "dir.json", ErrNotRegular},
		{"issue", "none.json", ErrMissing},
		{"pr", "target.json", ErrNotRegular},
	} {
		r := Read(h, c.outbox, c.name)
		if r.Error != c.want || r.Manifest != nil {
			t.Errorf("%s/%s: got %q %q, want %q", c.outbox, c.name, r.Error, r.Manifest, c.want)
		}
	}
}

func TestReadSizeCap(t *testing.T) {
	h := home(t, map[string]string{
		"issue/at.json":   strings.Repeat("x", manifest.MaxOutboxBytes),
		"issue/past.json": strings.Repeat("x", manifest.MaxOutboxBytes+1),
	})
	if r := Read(h, "issue", "at.json"); r.Error != "" || len(r.Manifest) != manifest.MaxOutboxBytes {
		t.Fatalf("at the cap: %q %d", r.Error, len(r.Manifest))
	}
	if r := Read(h, "issue", "past.json"); r.Error != ErrTooLarge || r.Manifest != nil {
		t.Fatalf("past the cap: %q", r.Error)
	}
}

func TestListBounded(t *testing.T) {
	files := map[string]string{}
	for i := range MaxListed + 1 {
		files["pr/m"+strings.Repeat("a", i)+".json"] = "{}"
	}
	r := Read(home(t, files), "pr", "ma.json")
	if len(r.Staged) != MaxListed || !r.More {
		t.Fatalf("listed %d, more %v", len(r.Staged), r.More)
	}
}
