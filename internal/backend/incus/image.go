package incus

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// DefaultImage is the alias of the sandbox image `jailbee image build`
// makes and the broker uses unless told otherwise.
const DefaultImage = "jailbee"

// imageRecipe names what BuildImage puts in the image; an image whose
// property differs is rebuilt. Change it whenever the recipe changes.
const imageRecipe = "bookworm-minbase-git-tmux-v1"

// recipeProperty is the image property that records imageRecipe.
const recipeProperty = "jailbee.recipe"

// imagePackages are installed on top of debootstrap's minbase.
var imagePackages = []string{"git", "tmux", "ca-certificates"}

// initScript is the image's pid 1: it reaps, and ends at once on the
// signals incus stop sends (minbase has no init; without this, a stop
// waits for its timeout).
const initScript = `#!/bin/sh
# jailbee sandbox init: reap, and stop at once when asked.
trap 'exit 0' PWR TERM INT
while :; do
	sleep 86400 &
	wait $!
done
`

// BuildOptions configure BuildImage.
type BuildOptions struct {
	Alias string // default DefaultImage
	// Mirror is the Debian mirror; "" reads it from the machine's apt
	// sources (no registry name is written into this code).
	Mirror string
	// Progress receives one line per step.
	Progress io.Writer
	// Force rebuilds even when the alias holds this recipe already.
	Force bool
}

// BuildImage makes the default sandbox image offline from the machine's
// Debian mirror and imports it into Incus under opts.Alias: debootstrap
// minbase with git, tmux and ca-certificates, an init that stops at once,
// the agent user (uid 1000) and an empty /workspace it owns. It is
// idempotent: an alias that already holds this recipe is kept.
func (b *Backend) BuildImage(ctx context.Context, opts BuildOptions) error {
	if opts.Alias == "" {
		opts.Alias = DefaultImage
	}
	say := func(format string, args ...any) {
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, format+"\n", args...)
		}
	}
	if !opts.Force {
		if recipe, err := b.imageRecipe(ctx, opts.Alias); err == nil && recipe == imageRecipe {
			say("image %s is up to date (%s)", opts.Alias, imageRecipe)
			return nil
		}
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return errors.New("debootstrap not found on PATH: install it (apt-get install debootstrap)")
	}
	mirror := opts.Mirror
	if mirror == "" {
		m, err := AptMirror()
		if err != nil {
			return err
		}
		mirror = m
	}
	work, err := os.MkdirTemp("/var/tmp", "jailbee-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	rootfs := filepath.Join(work, "rootfs")

	start := time.Now()
	say("[1/4] debootstrap bookworm (minbase, %s) from the machine's Debian mirror", strings.Join(imagePackages, ", "))
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include="+strings.Join(imagePackages, ","), "bookworm", rootfs, mirror)
	if err := runWithProgress(cmd, say); err != nil {
		return fmt.Errorf("debootstrap: %w", err)
	}
	say("[2/4] agent user, /workspace, init")
	if err := customize(rootfs); err != nil {
		return err
	}
	say("[3/4] packing")
	meta := filepath.Join(work, "meta.tar")
	if err := writeMetadata(work, meta); err != nil {
		return err
	}
	rootTar := filepath.Join(work, "rootfs.tar")
	if out, err := exec.CommandContext(ctx, "tar", "--numeric-owner", "-cf", rootTar, "-C", rootfs, ".").CombinedOutput(); err != nil {
		return fmt.Errorf("tar rootfs: %v: %s", err, bytesTail(out))
	}
	say("[4/4] importing as %s", opts.Alias)
	if old, err := b.imageFingerprint(ctx, opts.Alias); err == nil {
		if _, err := b.run(ctx, nil, "image", "delete", old); err != nil {
			return fmt.Errorf("remove the old image %s: %w", opts.Alias, err)
		}
	}
	if _, err := b.run(ctx, nil, "image", "import", meta, rootTar, "--alias", opts.Alias); err != nil {
		return fmt.Errorf("import the image: %w", err)
	}
	say("image %s built in %s", opts.Alias, time.Since(start).Round(time.Second))
	return nil
}

// runWithProgress runs cmd, passing debootstrap's "I: " lines on as
// progress, and keeps the output's tail for an error.
func runWithProgress(cmd *exec.Cmd, say func(string, ...any)) error {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var tail []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			tail = append(tail, line)
			if len(tail) > 20 {
				tail = tail[1:]
			}
			if strings.HasPrefix(line, "I: Retrieving Release") || strings.HasPrefix(line, "I: Installing core") ||
				strings.HasPrefix(line, "I: Unpacking the base") || strings.HasPrefix(line, "I: Configuring the base") ||
				strings.HasPrefix(line, "I: Base system installed") {
				say("      %s", strings.TrimPrefix(line, "I: "))
			}
		}
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.Join(tail, "\n"))
	}
	return nil
}

// customize adds the agent user, /workspace, the init and drops apt's
// caches.
func customize(rootfs string) error {
	appendLine := func(rel, line string) error {
		f, err := os.OpenFile(filepath.Join(rootfs, rel), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = fmt.Fprintln(f, line)
		return err
	}
	uid := fmt.Sprint(AgentUID)
	for rel, line := range map[string]string{
		"etc/passwd": AgentUser + ":x:" + uid + ":" + uid + "::" + HomePath + ":/bin/bash",
		"etc/group":  AgentUser + ":x:" + uid + ":",
		"etc/shadow": AgentUser + ":!:19000::::::",
	} {
		if err := appendLine(rel, line); err != nil {
			return fmt.Errorf("agent user: %w", err)
		}
	}
	for _, dir := range []string{HomePath, WorkspacePath} {
		p := filepath.Join(rootfs, dir)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chown(p, AgentUID, AgentUID); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(rootfs, "sbin", "init"), []byte(initScript), 0o755); err != nil {
		// /sbin may be a symlink to usr/sbin (merged /usr): write there.
		if err2 := os.WriteFile(filepath.Join(rootfs, "usr", "sbin", "init"), []byte(initScript), 0o755); err2 != nil {
			return fmt.Errorf("init: %w", err)
		}
	}
	for _, glob := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*"} {
		matches, _ := filepath.Glob(filepath.Join(rootfs, glob))
		for _, m := range matches {
			os.Remove(m)
		}
	}
	return nil
}

// writeMetadata writes Incus's image metadata.yaml and tars it as meta.
func writeMetadata(work, meta string) error {
	now := time.Now().Unix()
	yaml := fmt.Sprintf(`architecture: x86_64
creation_date: %d
properties:
  description: jailbee sandbox (Debian bookworm minbase, git, tmux)
  os: debian
  release: bookworm
  %s: %s
`, now, recipeProperty, imageRecipe)
	if err := os.WriteFile(filepath.Join(work, "metadata.yaml"), []byte(yaml), 0o644); err != nil {
		return err
	}
	if out, err := exec.Command("tar", "-cf", meta, "-C", work, "metadata.yaml").CombinedOutput(); err != nil {
		return fmt.Errorf("tar metadata: %v: %s", err, bytesTail(out))
	}
	return nil
}

// HasImage reports whether the backend's image alias exists.
func (b *Backend) HasImage(ctx context.Context) bool {
	_, err := b.imageFingerprint(ctx, b.opts.Image)
	return err == nil
}

// imageRecipe reads the recipe property of the image alias names.
func (b *Backend) imageRecipe(ctx context.Context, alias string) (string, error) {
	fp, err := b.imageFingerprint(ctx, alias)
	if err != nil {
		return "", err
	}
	var img struct {
		Properties map[string]string `json:"properties"`
	}
	if err := b.query(ctx, "/1.0/images/"+fp, &img); err != nil {
		return "", err
	}
	return img.Properties[recipeProperty], nil
}

// imageFingerprint is the fingerprint of the image alias names.
func (b *Backend) imageFingerprint(ctx context.Context, alias string) (string, error) {
	var a struct {
		Target string `json:"target"`
	}
	if err := b.query(ctx, "/1.0/images/aliases/"+alias, &a); err != nil {
		return "", err
	}
	if a.Target == "" {
		return "", ErrNoImage
	}
	return a.Target, nil
}

// ErrNoImage: the image alias does not exist.
var ErrNoImage = errors.New("no such image")

// AptMirror returns the Debian mirror of the machine's apt sources: the
// URIs of the first deb822 stanza in /etc/apt/sources.list.d/debian.sources,
// else the first "deb" line of /etc/apt/sources.list.
func AptMirror() (string, error) {
	if data, err := os.ReadFile("/etc/apt/sources.list.d/debian.sources"); err == nil {
		for line := range strings.Lines(string(data)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "URIs:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					return f[0], nil
				}
			}
		}
	}
	if data, err := os.ReadFile("/etc/apt/sources.list"); err == nil {
		for line := range strings.Lines(string(data)) {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == "deb" {
				for _, w := range f[1:] {
					if strings.Contains(w, "://") {
						return w, nil
					}
				}
			}
		}
	}
	return "", errors.New("no Debian mirror in the apt sources (/etc/apt/sources.list.d/debian.sources, /etc/apt/sources.list)")
}

func bytesTail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 400 {
		s = "..." + s[len(s)-400:]
	}
	return s
}
