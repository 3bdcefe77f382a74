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
	// The environment: kept on other services (no valueless entries, no
	// engine variables); the primary runs with its image's environment
	// only, as the Dev Containers CLI starts a root shell in it (to patch
	// /etc/environment and /etc/profile) with the container's
	// environment: PATH, LD_PRELOAD or a line break there would run the
	// repository's code as root.
	"environment": keyKeptButPrimary,
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

// replacedWhy says, for each key the facade replaces, what runs instead:
// the notice a launch prints for each one the repository sets.
var replacedWhy = map[string]string{
	"image":       "the service runs the image service_images binds",
	"build":       "nothing is built",
	"pull_policy": "nothing is pulled",
	"volumes":     "no mount of the repository's (the primary gets exactly the workspace, the signed leases and the spools)",
	"ports":       "no port is published but the assignment's published_ports, through loopback proxies",
	"expose":      "no port is published but the assignment's published_ports, through loopback proxies",
	"env_file":    "no host file is read",
	"cap_drop":    "every capability is dropped but the policy's",
	"user":        "the primary service runs as the workspace consumer",
	"environment": "the primary service runs with its image's environment only (the Dev Containers CLI starts a root shell in it with that environment)",
}

// Replacement is a key one of the repository's Compose files sets on a
// runnable service and the facade replaces.
type Replacement struct {
	File, Service, Key string
}

func (r Replacement) String() string {
	return fmt.Sprintf("%s: services.%s.%s: replaced by the managed launch: %s", r.File, segment(r.Service), r.Key, replacedWhy[r.Key])
}

// Replaced lists, file by file, service by service and key by key (each
// sorted), the keys of runnable services whose values the facade
// replaces: keyReplaced ones, and keyKeptButPrimary ones on primary.
func (p *Project) Replaced(primary string) []Replacement {
	var out []Replacement
	for i, f := range p.Files {
		services, _ := p.fileModels[i]["services"].(map[string]any)
		for _, name := range p.Runnable {
			svc, _ := services[name].(map[string]any)
			for _, key := range slices.Sorted(maps.Keys(svc)) {
				if use := serviceKeys[key]; use == keyReplaced || use == keyKeptButPrimary && name == primary {
					out = append(out, Replacement{File: f.Path, Service: name, Key: key})
				}
			}
		}
	}
	return out
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
			return &Refusal{Rule: "top-level key not allowed in a managed launch", Where: path + ": " + segment(key)}
		}
	}
	vols, _ := model["volumes"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(vols)) {
		if def, ok := vols[name].(map[string]any); vols[name] != nil && (!ok || len(def) > 0) {
			return &Refusal{Rule: "a volume definition (a managed launch mounts none of the repository's volumes; declare it empty)", Where: path + ": volumes." + segment(name)}
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
					return &Refusal{Rule: "not allowed in a managed launch", Where: f.Path + ": services." + segment(name) + "." + segment(key)}
				}
			}
		}
	}
	for _, name := range p.Runnable {
		for _, dep := range slices.Sorted(maps.Keys(p.Model.Services[name].DependsOn)) {
			if !slices.Contains(p.Runnable, dep) {
				return &Refusal{Rule: fmt.Sprintf("%s is not a bound service", quoteShort(dep)), Where: p.dependsOnAt(name, dep)}
			}
		}
	}
	return nil
}

// dependsOnAt is where service name's depends_on names dep: the last
// file that does (later files merge over earlier ones), and the entry.
func (p *Project) dependsOnAt(name, dep string) string {
	where := "services." + segment(name) + ".depends_on"
	for i := len(p.Files) - 1; i >= 0; i-- {
		services, _ := p.fileModels[i]["services"].(map[string]any)
		svc, _ := services[name].(map[string]any)
		switch deps := svc["depends_on"].(type) {
		case []any:
			if j := slices.Index(deps, any(dep)); j >= 0 {
				return fmt.Sprintf("%s: %s[%d]", p.Files[i].Path, where, j)
			}
		case map[string]any:
			if _, ok := deps[dep]; ok {
				return p.Files[i].Path + ": " + where + "." + segment(dep)
			}
		}
	}
	return where
}
