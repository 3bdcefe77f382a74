package compose

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// keyUse is what a managed launch does with a Compose key it accepts.
type keyUse int

const (
	// keyKept: the value is kept as written (after the file's own checks).
	keyKept keyUse = iota + 1
	// keyReplaced: accepted so that ordinary Compose files load, but the
	// facade replaces the value (or empties it) on every runnable service.
	keyReplaced
	// keyKeptButPrimary: kept on other services, replaced on the primary.
	keyKeptButPrimary
)

// serviceKeys are the only keys a runnable service may have, each for a
// reason docs/branchbox.md ("Compose keys") gives. Anything else, in any
// Compose file of the launch, is refused before any container exists.
var serviceKeys = map[string]keyUse{
	// What the service runs, inside its own container.
	"command":           keyKept,
	"entrypoint":        keyKept,
	"environment":       keyKept, // no valueless entries, no engine variables
	"working_dir":       keyKept,
	"healthcheck":       keyKept, // a command the engine runs inside the container
	"init":              keyKept, // the engine's own init as pid 1
	"tty":               keyKept,
	"stdin_open":        keyKept,
	"stop_signal":       keyKept,
	"stop_grace_period": keyKept,
	"restart":           keyKept,
	"hostname":          keyKept, // the container's private UTS namespace
	"read_only":         keyKept, // only takes away
	"mem_limit":         keyKept, // only takes away
	"cpus":              keyKept, // only takes away
	"pids_limit":        keyKept, // only takes away
	"depends_on":        keyKept, // start order; bound services only
	// The user: kept on other services (root there holds only
	// policy.ServiceCapabilities and reaches no host path); the primary
	// always runs as the workspace consumer.
	"user": keyKeptButPrimary,
	// Replaced: the bound image, never built or pulled; no host file,
	// port or mount (the primary gets exactly the signed ones).
	"image":       keyReplaced,
	"build":       keyReplaced,
	"pull_policy": keyReplaced,
	"volumes":     keyReplaced,
	"ports":       keyReplaced,
	"expose":      keyReplaced,
	"env_file":    keyReplaced,
	"cap_drop":    keyReplaced, // always ALL
}

// topKeys are the only top-level keys a Compose file of the launch may
// have (besides x- extensions).
var topKeys = []string{"services", "volumes", "version"}

// AllowedServiceKeys lists the keys a runnable service may have, sorted
// (for docs and messages).
func AllowedServiceKeys() []string {
	return slices.Sorted(maps.Keys(serviceKeys))
}

// isExtension reports whether key is a Compose extension ("x-..."),
// which Compose itself ignores.
func isExtension(key string) bool { return strings.HasPrefix(key, "x-") }

// checkTopKeys refuses a file's top-level keys outside topKeys, and a
// top-level volume with any definition: the facade mounts no volume of
// the repository's, and a definition (a driver, its options, external)
// could reach a host path or another project's data.
func checkTopKeys(path string, model map[string]any) error {
	for _, key := range slices.Sorted(maps.Keys(model)) {
		if !isExtension(key) && !slices.Contains(topKeys, key) {
			return &Refusal{Rule: fmt.Sprintf("top-level key %s is not allowed in a managed launch", quoteShort(key)), Where: path}
		}
	}
	vols, _ := model["volumes"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(vols)) {
		if def, ok := vols[name].(map[string]any); vols[name] != nil && (!ok || len(def) > 0) {
			return &Refusal{Rule: "a volume definition (a managed launch mounts none of the repository's volumes; declare it empty)", Where: path + ": volume " + quoteShort(name)}
		}
	}
	return nil
}

// CheckRunnable applies the key allow-list to every runnable service in
// every file, and requires each depends_on to name a runnable service
// (Compose would start a dependency whatever its profile). Connectors and
// omitted services are not checked: no container of theirs is ever
// created, which the launch's inspection of the project confirms.
func (p *Project) CheckRunnable() error {
	for i, f := range p.Files {
		services, _ := p.fileModels[i]["services"].(map[string]any)
		for _, name := range p.Runnable {
			svc, ok := services[name].(map[string]any)
			if !ok {
				continue
			}
			for _, key := range slices.Sorted(maps.Keys(svc)) {
				if _, ok := serviceKeys[key]; !ok && !isExtension(key) {
					return &Refusal{Rule: fmt.Sprintf("key %s is not allowed in a managed launch", quoteShort(key)), Where: f.Path + ": service " + name}
				}
			}
		}
	}
	for _, name := range p.Runnable {
		for _, dep := range slices.Sorted(maps.Keys(p.Model.Services[name].DependsOn)) {
			if !slices.Contains(p.Runnable, dep) {
				return &Refusal{Rule: fmt.Sprintf("depends_on %s, which is not a bound service", quoteShort(dep)), Where: "service " + name}
			}
		}
	}
	return nil
}
