package example

import (
	"context"
	"fmt"
	"os"
	"path"

	"agentbox/internal/gitx"
	"agentbox/internal/managed/assignment"
	"agentbox/internal/secfs"
)

// Launchable is what makes the example ready for `feature start`: the
// image its one Compose service runs, a local content id
// ("sha256:<64 hex>") the caller read from the engine.
type Launchable struct {
	ServiceImage string
}

// The launchable example's repository, below DIR.
const (
	SrcDir     = "src"     // the assignment's workspace
	ProjectDir = "project" // the repository, below SrcDir
	// FeatureName is the feature the printed steps start.
	FeatureName = "example"
	// Service is the repository's one Compose service, the primary.
	Service = "app"
)

// repositoryFiles are the launchable example's repository: a
// devcontainer config and a Compose file whose build and port the
// launch replaces (it says so), and a README to look at in the container.
var repositoryFiles = []struct{ name, data string }{
	{".devcontainer/devcontainer.json", `{
	// A managed launch runs this service as the workspace consumer.
	"name": "branchbox example",
	"dockerComposeFile": ["../compose.yaml"],
	"service": "` + Service + `",
}
`},
	{"compose.yaml", `services:
  ` + Service + `:
    build: .                # replaced: the assignment binds a preloaded image
    command: ["sleep", "infinity"]
    ports: ["8080:8080"]    # replaced: only the assignment publishes ports
`},
	{"README", "the branchbox example repository\n"},
}

// launchPaths adds the repository's locations to p.
func launchPaths(p *Paths) {
	p.Workspace = path.Join(p.Dir, SrcDir)
	p.Repository = path.Join(p.Workspace, ProjectDir)
}

// addLaunch makes doc launchable: the workspace and repository at p, at
// revision, and its one service bound to l's image. No port is
// published, so no port proxy image is needed.
func addLaunch(doc map[string]any, p Paths, revision string, l *Launchable) {
	doc["workspace"] = p.Workspace
	doc["repository"] = map[string]any{"path": p.Repository, "revision": revision}
	doc["service_images"] = map[string]any{Service: l.ServiceImage}
}

// writeRepository creates the workspace and the repository below it,
// appending what it created to created, and returns the commit.
func writeRepository(p Paths, created *[]string) (string, error) {
	for _, dir := range []string{p.Workspace, p.Repository} {
		if err := secfs.MkdirFresh(dir); err != nil {
			return "", fmt.Errorf("%s cannot be created: %w", dir, secfs.WithoutPath(err))
		}
		*created = append(*created, dir)
	}
	for _, f := range repositoryFiles {
		name := path.Join(p.Repository, f.name)
		if err := os.MkdirAll(path.Dir(name), 0o755); err != nil {
			return "", fmt.Errorf("%s cannot be created: %w", path.Dir(name), secfs.WithoutPath(err))
		}
		if err := secfs.WriteFileAtomic(name, []byte(f.data), 0o644); err != nil {
			return "", fmt.Errorf("%s cannot be written: %w", name, secfs.WithoutPath(err))
		}
	}
	rev, err := gitx.InitCommit(context.Background(), p.Repository, "the branchbox example repository")
	if err != nil {
		return "", fmt.Errorf("the example repository cannot be committed: %w", err)
	}
	return rev, nil
}

// checkLaunchable applies the managed launch rule to the example, as
// `validate --require-launch` does.
func checkLaunchable(a *assignment.Assignment, runtime assignment.Identity) error {
	if err := a.RequireManagedLaunch(runtime); err != nil {
		return fmt.Errorf("the example is not launchable, so it was removed again: %w", err)
	}
	return nil
}

// launchSteps are the commands that launch the example, look at it and
// tear it down, env set as for the other steps.
func (r *Result) launchSteps(env string) []Step {
	feature := env + ProgramName + " feature "
	return []Step{
		{Purpose: "launch the managed Dev Container the assignment describes (as root)",
			Command: feature + "start " + FeatureName + " --repo " + ShellQuote(r.Repository) +
				" --runtime in-guest --runtime-manifest " + ShellQuote(r.Assignment)},
		{Purpose: "run a command in it, as the workspace consumer, in the worktree",
			Command: feature + "exec " + FeatureName + " cat README"},
		{Purpose: "list the features and their containers", Command: feature + "ls"},
		{Purpose: "remove everything the launch created and check nothing is left",
			Command: feature + "teardown " + FeatureName + " --force"},
	}
}
