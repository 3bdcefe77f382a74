// Package agentbin installs coding-agent binaries on the host, once per
// version, for every sandbox to run read-only: no sandbox downloads
// anything (it has no network). An agent is an npm platform package
// holding a native binary (Claude Code's `claude`); the package is looked
// up with the host's npm client (so its registry and proxy settings
// apply), downloaded, checked against the registry's integrity digest,
// and the binary kept under the state directory by agent and version:
//
//	<state>/agents/<agent>/<version>/bin/<file>       0755, the binary
//	<state>/agents/<agent>/<version>/installed.json   what was installed
//
// A version directory appears whole (written beside it, fsync'd, then
// renamed) or not at all.
package agentbin

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"agentbox/internal/secfs"
)

// Agent is an installable agent: the npm package that holds its binary
// and the binary's path in the package.
type Agent struct {
	Name           string
	Package        string
	File           string // inside the package tarball
	DefaultVersion string
}

// ClaudeDefaultVersion is the Claude Code release installed when none is
// named (a pin: the newest seen working on these machines).
const ClaudeDefaultVersion = "2.1.332"

// Agents are the agents agentbin knows, by name.
var Agents = map[string]Agent{
	"claude": {Name: "claude", Package: "@anthropic-ai/claude-code-linux-x64", File: "package/claude", DefaultVersion: ClaudeDefaultVersion},
}

// MaxBinaryBytes bounds an agent's binary (Claude Code's is about 400 MB)
// and MaxTarballBytes its download.
const (
	MaxBinaryBytes  = 1 << 30
	MaxTarballBytes = 1 << 30
)

// versionPattern is a pinned release: no range, tag or path.
var versionPattern = regexp.MustCompile(`^[0-9]{1,6}\.[0-9]{1,6}\.[0-9]{1,6}$`)

// Installed is one installed agent version.
type Installed struct {
	Agent       string    `json:"agent"`
	Version     string    `json:"version"`
	Path        string    `json:"path"` // the binary
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`    // of the binary
	Integrity   string    `json:"integrity"` // the registry's, of the tarball
	InstalledAt time.Time `json:"installed_at"`
}

// Options are an installation's surroundings.
type Options struct {
	// StateDir is the broker's state directory.
	StateDir string
	// CacheDir, when set, keeps verified tarballs (by their digest), so a
	// machine downloads each version once whatever state directories it
	// installs into.
	CacheDir string
	// Progress receives what the installation is doing.
	Progress io.Writer
	// NPM is the npm command ("npm" when empty).
	NPM string
	// Client downloads the tarball (nil: one that honours the proxy
	// environment).
	Client *http.Client
}

// Dir is where agent's version lives under stateDir.
func Dir(stateDir, agent, version string) string {
	return filepath.Join(stateDir, "agents", agent, version)
}

// BinDir is the directory holding agent version's binary: what a
// sandbox gets read-only on its PATH.
func BinDir(stateDir, agent, version string) string {
	return filepath.Join(Dir(stateDir, agent, version), "bin")
}

// lookup finds an agent and checks a version.
func lookup(agent, version string) (Agent, string, error) {
	a, ok := Agents[agent]
	if !ok {
		return Agent{}, "", fmt.Errorf("agentbin: unknown agent %q (known: %s)", agent, strings.Join(names(), ", "))
	}
	if version == "" {
		version = a.DefaultVersion
	}
	if !versionPattern.MatchString(version) {
		return Agent{}, "", fmt.Errorf("agentbin: version %q is not a release number like %s", version, a.DefaultVersion)
	}
	return a, version, nil
}

func names() []string {
	var out []string
	for n := range Agents {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Install installs agent's version (its default when empty) and returns
// it; present reports that it was installed already (nothing was done).
func Install(ctx context.Context, o Options, agent, version string) (inst Installed, present bool, err error) {
	a, version, err := lookup(agent, version)
	if err != nil {
		return Installed{}, false, err
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	dir := Dir(o.StateDir, a.Name, version)
	if got, err := readInstalled(dir); err == nil {
		if err := verifyBinary(got); err != nil {
			return Installed{}, false, fmt.Errorf("agentbin: %s %s is installed but its binary changed (%v): remove %s and install again", a.Name, version, err, dir)
		}
		return got, true, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Installed{}, false, err
	}

	fmt.Fprintf(progress, "looking up %s@%s\n", a.Package, version)
	tarballURL, integrity, err := resolve(ctx, o.NPM, a.Package, version)
	if err != nil {
		return Installed{}, false, err
	}
	tarball, cleanup, err := fetch(ctx, o, tarballURL, integrity, progress)
	if err != nil {
		return Installed{}, false, err
	}
	defer cleanup()

	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Installed{}, false, fmt.Errorf("agentbin: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+version+".tmp-")
	if err != nil {
		return Installed{}, false, fmt.Errorf("agentbin: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := secfs.Chmod(tmp, 0o755); err != nil {
		return Installed{}, false, fmt.Errorf("agentbin: %w", err)
	}
	fmt.Fprintf(progress, "extracting %s\n", a.File)
	bin := filepath.Join(tmp, "bin", filepath.Base(a.File))
	size, sum, err := extract(tarball, a.File, bin)
	if err != nil {
		return Installed{}, false, err
	}
	inst = Installed{Agent: a.Name, Version: version, Path: filepath.Join(dir, "bin", filepath.Base(a.File)),
		Size: size, SHA256: sum, Integrity: integrity, InstalledAt: time.Now().UTC().Truncate(time.Second)}
	record, err := json.MarshalIndent(inst, "", "  ")
	if err != nil {
		return Installed{}, false, fmt.Errorf("agentbin: %w", err)
	}
	if err := secfs.WriteFileAtomic(filepath.Join(tmp, "installed.json"), append(record, '\n'), 0o644); err != nil {
		return Installed{}, false, fmt.Errorf("agentbin: %w", err)
	}
	if err := secfs.FsyncDir(filepath.Join(tmp, "bin")); err != nil {
		return Installed{}, false, fmt.Errorf("agentbin: %w", err)
	}
	if err := secfs.RenameNoReplace(tmp, dir); err != nil {
		if errors.Is(err, fs.ErrExist) {
			// Another installation of the same version won the race.
			got, err := readInstalled(dir)
			return got, true, err
		}
		return Installed{}, false, fmt.Errorf("agentbin: %w", err)
	}
	if err := secfs.FsyncDir(parent); err != nil {
		return Installed{}, false, fmt.Errorf("agentbin: %w", err)
	}
	fmt.Fprintf(progress, "installed %s %s (%d MB)\n", a.Name, version, size>>20)
	return inst, false, nil
}

// List returns every installed agent version under stateDir, by agent
// then version.
func List(stateDir string) ([]Installed, error) {
	var out []Installed
	agents, err := os.ReadDir(filepath.Join(stateDir, "agents"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("agentbin: %w", err)
	}
	for _, a := range agents {
		if _, known := Agents[a.Name()]; !known || !a.IsDir() {
			continue
		}
		versions, err := os.ReadDir(filepath.Join(stateDir, "agents", a.Name()))
		if err != nil {
			return nil, fmt.Errorf("agentbin: %w", err)
		}
		for _, v := range versions {
			if !versionPattern.MatchString(v.Name()) {
				continue // a partial installation's temporary directory
			}
			inst, err := readInstalled(filepath.Join(stateDir, "agents", a.Name(), v.Name()))
			if err != nil {
				continue
			}
			out = append(out, inst)
		}
	}
	return out, nil
}

// Find returns agent's installed version (its default when empty).
func Find(stateDir, agent, version string) (Installed, error) {
	a, version, err := lookup(agent, version)
	if err != nil {
		return Installed{}, err
	}
	inst, err := readInstalled(Dir(stateDir, a.Name, version))
	if errors.Is(err, fs.ErrNotExist) {
		return Installed{}, fmt.Errorf("agentbin: %s %s is not installed (run: jailbee agent install %s --version %s)", a.Name, version, a.Name, version)
	}
	return inst, err
}

func readInstalled(dir string) (Installed, error) {
	data, err := secfs.ReadFileNoFollow(filepath.Join(dir, "installed.json"), 64<<10)
	if err != nil {
		return Installed{}, err
	}
	var inst Installed
	if err := json.Unmarshal(data, &inst); err != nil {
		return Installed{}, fmt.Errorf("agentbin: %s: %w", filepath.Join(dir, "installed.json"), err)
	}
	return inst, nil
}

// verifyBinary checks the binary is the one recorded: its size (its
// digest is checked at install; reading 400 MB on every start is not).
func verifyBinary(inst Installed) error {
	fi, err := os.Lstat(inst.Path)
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return errors.New("not a regular file")
	case fi.Size() != inst.Size:
		return fmt.Errorf("%d bytes, recorded %d", fi.Size(), inst.Size)
	}
	return nil
}

// resolve asks npm for the version's tarball and its integrity.
func resolve(ctx context.Context, npm, pkg, version string) (tarballURL, integrity string, err error) {
	if npm == "" {
		npm = "npm"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "view", pkg+"@"+version, "dist.tarball", "dist.integrity", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var e struct {
			Error struct {
				Summary string `json:"summary"`
			} `json:"error"`
		}
		if json.Unmarshal(out, &e) == nil && e.Error.Summary != "" {
			return "", "", fmt.Errorf("agentbin: npm view %s@%s: %s", pkg, version, e.Error.Summary)
		}
		if errors.Is(err, exec.ErrNotFound) {
			return "", "", fmt.Errorf("agentbin: npm is needed to look the package up (apt-get install npm)")
		}
		return "", "", fmt.Errorf("agentbin: npm view %s@%s: %v", pkg, version, err)
	}
	var dist map[string]string
	if err := json.Unmarshal(out, &dist); err != nil {
		return "", "", fmt.Errorf("agentbin: npm view %s@%s printed no package: %w", pkg, version, err)
	}
	tarballURL, integrity = dist["dist.tarball"], dist["dist.integrity"]
	if !strings.HasPrefix(tarballURL, "https://") && !strings.HasPrefix(tarballURL, "http://") {
		return "", "", fmt.Errorf("agentbin: %s@%s has no tarball to download", pkg, version)
	}
	if !strings.HasPrefix(integrity, "sha512-") {
		return "", "", fmt.Errorf("agentbin: %s@%s has no sha512 integrity to verify", pkg, version)
	}
	return tarballURL, integrity, nil
}

// integrityDigest decodes an npm "sha512-<base64>" integrity.
func integrityDigest(integrity string) ([]byte, error) {
	b64, ok := strings.CutPrefix(integrity, "sha512-")
	if !ok {
		return nil, errors.New("agentbin: not a sha512 integrity")
	}
	d, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(d) != sha512.Size {
		return nil, errors.New("agentbin: a malformed integrity")
	}
	return d, nil
}

// fetch returns a verified tarball's path: from the cache when it holds
// one, else downloaded (into the cache when there is one). cleanup
// removes a temporary download.
func fetch(ctx context.Context, o Options, tarballURL, integrity string, progress io.Writer) (path string, cleanup func(), err error) {
	want, err := integrityDigest(integrity)
	if err != nil {
		return "", nil, err
	}
	nothing := func() {}
	var cached string
	if o.CacheDir != "" {
		cached = filepath.Join(o.CacheDir, "sha512-"+hex.EncodeToString(want)+".tgz")
		switch err := checkFile(cached, want); {
		case err == nil:
			fmt.Fprintf(progress, "using the cached download\n")
			return cached, nothing, nil
		case !errors.Is(err, fs.ErrNotExist):
			// Not the bytes its name promises: replaced by a download.
			if err := os.Remove(cached); err != nil {
				return "", nil, fmt.Errorf("agentbin: %w", err)
			}
		}
	}
	dir := o.CacheDir
	if dir == "" {
		dir = os.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("agentbin: %w", err)
	}
	f, err := os.CreateTemp(dir, ".download-*.tgz")
	if err != nil {
		return "", nil, fmt.Errorf("agentbin: %w", err)
	}
	tmp := f.Name()
	remove := func() { os.Remove(tmp) }
	defer func() {
		if err != nil {
			f.Close()
			remove()
		}
	}()
	client := o.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: time.Minute}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tarballURL, nil)
	if err != nil {
		return "", nil, fmt.Errorf("agentbin: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", nil, fmt.Errorf("agentbin: download: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", nil, fmt.Errorf("agentbin: download: %s", resp.Status)
	}
	h := sha512.New()
	counter := &progressWriter{w: progress, total: resp.ContentLength, next: 1}
	n, err := io.Copy(io.MultiWriter(f, h, counter), io.LimitReader(resp.Body, MaxTarballBytes+1))
	if err != nil {
		return "", nil, fmt.Errorf("agentbin: download: %w", err)
	}
	if n > MaxTarballBytes {
		return "", nil, fmt.Errorf("agentbin: the download is over %d bytes", MaxTarballBytes)
	}
	if !digestIs(h, want) {
		return "", nil, errors.New("agentbin: the download does not match the registry's integrity digest")
	}
	if err := f.Sync(); err != nil {
		return "", nil, fmt.Errorf("agentbin: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", nil, fmt.Errorf("agentbin: %w", err)
	}
	fmt.Fprintf(progress, "downloaded %d MB, integrity verified\n", n>>20)
	if cached == "" {
		return tmp, remove, nil
	}
	if err := secfs.RenameNoReplace(tmp, cached); errors.Is(err, fs.ErrExist) {
		// Another download got there first: use ours unless its checks out.
		if checkFile(cached, want) != nil {
			return tmp, remove, nil
		}
		remove()
	} else if err != nil {
		return "", nil, fmt.Errorf("agentbin: %w", err)
	}
	return cached, nothing, nil
}

// digestIs reports whether h's sum is want (published digests: no
// secret to time).
func digestIs(h hash.Hash, want []byte) bool {
	got := h.Sum(nil)
	return len(got) == len(want) && string(got) == string(want)
}

// checkFile verifies a cached tarball against its digest.
func checkFile(path string, want []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha512.New()
	if _, err := io.Copy(h, io.LimitReader(f, MaxTarballBytes+1)); err != nil {
		return err
	}
	if !digestIs(h, want) {
		return errors.New("agentbin: the cached download does not match its digest")
	}
	return nil
}

// extract writes the tarball's file name to dst (0755, fsync'd) and
// returns its size and sha256. Only that regular file is taken; links
// and other entries are ignored, and the size is bounded.
func extract(tarball, name, dst string) (int64, string, error) {
	f, err := os.Open(tarball)
	if err != nil {
		return 0, "", fmt.Errorf("agentbin: %w", err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return 0, "", fmt.Errorf("agentbin: the tarball: %w", err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return 0, "", fmt.Errorf("agentbin: the package has no %s", name)
		}
		if err != nil {
			return 0, "", fmt.Errorf("agentbin: the tarball: %w", err)
		}
		if hdr.Name != name || hdr.Typeflag != tar.TypeReg {
			continue
		}
		if hdr.Size > MaxBinaryBytes {
			return 0, "", fmt.Errorf("agentbin: %s is over %d bytes", name, MaxBinaryBytes)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return 0, "", fmt.Errorf("agentbin: %w", err)
		}
		out, err := secfs.CreateNew(dst, 0o755)
		if err != nil {
			return 0, "", fmt.Errorf("agentbin: %w", err)
		}
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(tr, MaxBinaryBytes))
		if err == nil {
			err = out.Sync()
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return 0, "", fmt.Errorf("agentbin: write %s: %w", filepath.Base(dst), err)
		}
		return n, hex.EncodeToString(h.Sum(nil)), nil
	}
}

// progressWriter prints each tenth of a download of a known length of
// 16 MiB or more, else every 64 MiB.
type progressWriter struct {
	w     io.Writer
	total int64
	n     int64
	next  int64
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	if p.total >= 16<<20 {
		for p.next <= 10 && p.n*10 >= p.total*p.next {
			fmt.Fprintf(p.w, "  %3d%% of %d MB\n", p.next*10, p.total>>20)
			p.next++
		}
	} else if p.n >= p.next<<26 {
		fmt.Fprintf(p.w, "  %d MB\n", p.n>>20)
		p.next = p.n>>26 + 1
	}
	return len(b), nil
}
