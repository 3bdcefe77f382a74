package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"agentbox/internal/managed/assignment"
	"agentbox/internal/managed/engine"
	"agentbox/internal/managed/example"
)

// exampleOutput is the --json result of a written example.
type exampleOutput struct {
	Written bool `json:"written"`
	*example.Result
	NextSteps []example.Step `json:"next_steps"`
	Notes     []string       `json:"notes"`
}

// exampleRefusal is the --json result of a refused example.
type exampleRefusal struct {
	Written bool   `json:"written"`
	Error   string `json:"error"`
}

// DefaultExampleImage is the image a launchable example binds unless
// --service-image names another: the one scripts/docker-setup.sh builds.
const DefaultExampleImage = "agentbox-test/service:1"

func newExample(env *Env) *cobra.Command {
	var asJSON, launchable bool
	var version, serviceImage string
	c := &cobra.Command{
		Use:   "example DIR [--version 1|2|3] [--launchable [--service-image REF]] [--json]",
		Short: "Write a complete, valid example run to try validate and exec-provider",
		Long: `Write a complete, valid managed run below DIR, for trying branchbox without an
orchestrator, then print the exact commands that try it:

  DIR/                                   0700 created (or an existing empty directory)
  DIR/bin/                               0700 (versions 2, 3)
  DIR/bin/example-provider               0700 a shell script provider (versions 2, 3)
  DIR/managed/                           0700 the managed root (BRANCHBOX_MANAGED_ROOT)
  DIR/managed/example/                   0700 the run directory (run_id "example")
  DIR/managed/example/materializations/  0700
    example-delivery-token               0600 a provider-environment value
  DIR/managed/example/assignment.json    0600 the assignment

Every entry belongs to the user running the command; run the printed steps as
that user. No root privilege is needed. The assignment must live directly in
<managed root>/<run-id>/, so DIR/managed is the example's managed root and the
steps set BRANCHBOX_MANAGED_ROOT to it (not needed when DIR is /run/branchbox).

The assignment is the minimal one exec-provider can start a provider under: a
model-identity lease naming the example provider and inheriting
EXAMPLE_MODEL_TOKEN, and a provider-environment lease binding
EXAMPLE_DELIVERY_TOKEN to the value file by its SHA-256. Version 3 adds a
workspace consumer whose uid and gid differ from yours. The example provider
prints its arguments and the NAMES of the environment variables it received,
never their values. The leases expire 30 days after writing.

Without --launchable it has no service_images (a managed launch needs
preloaded images), so validate reports managed_launch.ready false. Version 1
starts only the fixed providers claude, codex and gemini from the fixed PATH,
so its example names codex and writes no provider.

DIR may be relative; its parent must exist. Refused, before anything is
written (exit 1, a refusal, since the command line itself is well-formed):
DIR exists and is not an empty directory; DIR or a directory on its path is a
symbolic link; DIR or an ancestor could be replaced by another uid (validate
refuses a run below it); DIR is longer than ` + strconv.Itoa(example.MaxDirBytes) + ` bytes or holds whitespace (the
provider path is signed as the lease's executable, a label of at most 128
bytes).

With --launchable (version 3 only) the example is ready for 'feature start':
  DIR/src/                               0700 the assignment's workspace
  DIR/src/project/                       a Git repository, one commit on main:
                                         .devcontainer/devcontainer.json and a
                                         compose.yaml with one service, app
and the assignment binds app (service_images) to the local content id
(sha256:...) of the image --service-image names on the Docker engine (default
` + DefaultExampleImage + `, which scripts/docker-setup.sh builds); it publishes no
port. The image is looked up, never pulled or built: a missing image, or an
engine that does not answer, is refused before anything is written. The
printed steps then start the feature, run a command in it, list it and tear
it down (feature start runs as root).

  --version        the assignment version to write (default 3, the newest)
  --launchable     also write a repository and bind a local image (version 3)
  --service-image  the local image the launchable example's service runs
  --json           print the written files, the next steps and notes as JSON

Exit status: 0 written, 1 refused or failed (nothing it created is left behind),
2 usage error (including a --version other than 1, 2 or 3).`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if !slices.Contains(example.Versions, version) {
				return usage("--version must be 1, 2 or 3")
			}
			if launchable && version != example.DefaultVersion {
				return usage("--launchable needs --version 3")
			}
			if c.Flags().Changed("service-image") && !launchable {
				return usage("--service-image needs --launchable")
			}
			dir, err := absDir(args[0])
			if err != nil {
				return reportExampleRefusal(env.Stdout, asJSON, err)
			}
			opts := example.Options{Dir: dir, Version: version, Now: env.Now(), Runtime: env.Runtime}
			if launchable {
				id, err := localImage(serviceImage)
				if err != nil {
					return reportExampleRefusal(env.Stdout, asJSON, err)
				}
				opts.Launch = &example.Launchable{ServiceImage: id}
			}
			res, err := example.Write(opts)
			if err != nil {
				return reportExampleRefusal(env.Stdout, asJSON, err)
			}
			if asJSON {
				return writeJSON(env.Stdout, exampleOutput{Written: true, Result: res, NextSteps: res.NextSteps(), Notes: res.Notes()})
			}
			writeExample(env.Stdout, res)
			return nil
		},
	}
	c.Flags().StringVar(&version, "version", example.DefaultVersion, "assignment version to write: 1, 2 or 3")
	c.Flags().BoolVar(&launchable, "launchable", false, "write a repository and bind a local image, ready for feature start")
	c.Flags().StringVar(&serviceImage, "service-image", DefaultExampleImage, "the local image the launchable example runs")
	c.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return c
}

// localImage is the content id of the image ref names on the local
// engine; a missing image or a silent engine is a refusal that says what
// to do.
func localImage(ref string) (string, error) {
	eng, err := engine.Open()
	if err != nil {
		return "", err
	}
	defer eng.Close()
	ctx, cancel := context.WithTimeout(context.Background(), imageLookupTimeout)
	defer cancel()
	if err := eng.Ping(ctx); err != nil {
		return "", fmt.Errorf("--launchable binds a local image: %w", err)
	}
	id, err := eng.ImageID(ctx, ref)
	if errors.Is(err, engine.ErrNotFound) {
		return "", fmt.Errorf("--launchable: the image %q is not on the local Docker engine, and branchbox never pulls or builds one: "+
			"build it (sudo bash scripts/docker-setup.sh builds %s) or name a local image with --service-image", ref, DefaultExampleImage)
	}
	if err != nil {
		return "", fmt.Errorf("--launchable: %w", err)
	}
	if r := assignment.ImageReferenceReason(id); r != "" {
		return "", fmt.Errorf("--launchable: the engine's id of image %q %s", ref, r)
	}
	return id, nil
}

// imageLookupTimeout bounds the engine's answers about the image.
const imageLookupTimeout = 30 * time.Second

// absDir makes DIR absolute against the kernel's working directory
// (getcwd(2), which holds no symbolic link, unlike $PWD).
func absDir(dir string) (string, error) {
	if filepath.IsAbs(dir) {
		return filepath.Clean(dir), nil
	}
	wd, err := unix.Getwd()
	if err != nil {
		return "", fmt.Errorf("the working directory cannot be read to resolve DIR: %w", err)
	}
	return filepath.Join(wd, dir), nil
}

func reportExampleRefusal(w io.Writer, asJSON bool, err error) error {
	if !asJSON {
		return refused(err)
	}
	if werr := writeJSON(w, exampleRefusal{Written: false, Error: err.Error()}); werr != nil {
		return werr
	}
	return &exitError{code: ExitRefused}
}

func writeExample(w io.Writer, res *example.Result) {
	fmt.Fprintf(w, "wrote a version %q example run below %s:\n\n", res.Version, res.Dir)
	width := 0
	for _, f := range res.Files {
		width = max(width, len(entryName(f)))
	}
	for _, f := range res.Files {
		fmt.Fprintf(w, "  %-*s  %s  %d:%d  %s\n", width, entryName(f), f.Mode, f.UID, f.GID, f.Role)
	}
	fmt.Fprintf(w, "\nnext steps:\n")
	for _, s := range res.NextSteps() {
		fmt.Fprintf(w, "\n  # %s\n  %s\n", s.Purpose, s.Command)
	}
	fmt.Fprintf(w, "\nnotes:\n")
	for _, n := range res.Notes() {
		fmt.Fprintf(w, "  - %s\n", n)
	}
}

func entryName(f example.File) string {
	if f.Type == "directory" && !strings.HasSuffix(f.Path, "/") {
		return f.Path + "/"
	}
	return f.Path
}
