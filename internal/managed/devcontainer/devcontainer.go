// Package devcontainer reads a repository's devcontainer config (JSON
// with comments) for a managed launch and writes the config the Dev
// Containers CLI is given instead: Compose-based, on the checked Compose
// copies and the facade, with nothing that runs on the host, mounts a
// host path, publishes a port or rewrites the container user's uid.
package devcontainer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// MaxConfigBytes bounds a devcontainer config.
const MaxConfigBytes = 1 << 20

// Paths are where a devcontainer config may be, relative to the worktree,
// in the order they are looked for.
var Paths = []string{".devcontainer/devcontainer.json", ".devcontainer.json"}

// Config is a parsed devcontainer config: its keys as decoded JSON.
type Config struct {
	path string
	raw  map[string]any
}

// Path is the config's path relative to the worktree, as given to Parse.
func (c *Config) Path() string { return c.path }

// Refuse is an error naming the config's file and the key path at: every
// refusal of the config is worded so.
func (c *Config) Refuse(at, format string, args ...any) error {
	return refusal(c.path, at, format, args...)
}

func refusal(path, at, format string, args ...any) error {
	return fmt.Errorf("devcontainer: %s: %s: %s", path, at, fmt.Sprintf(format, args...))
}

// Service is the Compose service the devcontainer runs in.
func (c *Config) Service() string { s, _ := c.raw["service"].(string); return s }

// ComposeFiles is the config's dockerComposeFile: set when the key is
// there, files its entries (a string is one entry).
func (c *Config) ComposeFiles() (files []string, set bool, err error) {
	v, ok := c.raw["dockerComposeFile"]
	if !ok {
		return nil, false, nil
	}
	switch v := v.(type) {
	case string:
		return []string{v}, true, nil
	case []any:
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, true, c.Refuse(fmt.Sprintf("dockerComposeFile[%d]", i), "not a string")
			}
			files = append(files, s)
		}
		return files, true, nil
	}
	return nil, true, c.Refuse("dockerComposeFile", "neither a string nor a list")
}

// User is the user the config asks its processes to run as: remoteUser,
// else containerUser ("" when neither is set). A launch runs them as the
// workspace consumer whatever it says, and refuses a config whose user is
// not the consumer.
func (c *Config) User() string {
	_, user := c.UserKey()
	return user
}

// UserKey is the key User comes from, and its value ("", "" when
// neither is set).
func (c *Config) UserKey() (key, user string) {
	for _, k := range []string{"remoteUser", "containerUser"} {
		if s, ok := c.raw[k].(string); ok && s != "" {
			return k, s
		}
	}
	return "", ""
}

// imageKeys make a config image- or Dockerfile-based; a managed launch
// runs Compose services only.
var imageKeys = []string{"image", "dockerFile", "build"}

// Parse reads the devcontainer config at path (relative to the worktree,
// for messages): JSON with comments and trailing commas. It refuses,
// naming the file and the key:
//   - a config that is not Compose-based (image, dockerFile, build) or
//     names no service;
//   - initializeCommand (it runs on the host);
//   - any `${localEnv:` or `${env:` reference (a host environment
//     variable: the Dev Containers CLI reads `env` as `localEnv`).
func Parse(path string, data []byte) (*Config, error) {
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("devcontainer: %s: the config is over %d bytes", path, MaxConfigBytes)
	}
	plain, err := StripJSONC(data)
	if err != nil {
		return nil, fmt.Errorf("devcontainer: %s: %s", path, strings.TrimPrefix(err.Error(), "devcontainer: "))
	}
	dec := json.NewDecoder(bytes.NewReader(plain))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("devcontainer: %s: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("devcontainer: %s: data after the config", path)
	}
	c := &Config{path: path, raw: raw}
	for _, k := range imageKeys {
		if _, ok := raw[k]; ok {
			return nil, c.Refuse(k, "a managed launch runs Compose services only (dockerComposeFile and service)")
		}
	}
	if _, ok := raw["initializeCommand"]; ok {
		return nil, c.Refuse("initializeCommand", "runs on the host")
	}
	for _, ref := range hostEnvRefs {
		if where := findString(raw, "", func(s string) bool { return strings.Contains(s, "${"+ref+":") }); where != "" {
			return nil, c.Refuse(where, "${%s:...} reads the host's environment", ref)
		}
	}
	if c.Service() == "" {
		return nil, c.Refuse("service", "names no Compose service")
	}
	return c, nil
}

// hostEnvRefs are the Dev Containers CLI's variables that read the
// environment of the CLI, on the host: it substitutes `${env:NAME}`
// exactly as `${localEnv:NAME}`, anywhere in the config it is given.
var hostEnvRefs = []string{"localEnv", "env"}

// dropped are the keys the generated config leaves out: what runs on the
// host, mounts a host path, publishes a port, adds capabilities, sets
// the environment from outside, or builds and adds features; and
// notApplied.
var dropped = append([]string{"initializeCommand", "remoteEnv", "workspaceMount", "mounts", "appPort", "forwardPorts",
	"capAdd", "features", "build", "runArgs", "securityOpt", "init", "overrideFeatureInstallOrder", "portsAttributes",
	"otherPortsAttributes", "hostRequirements"}, notApplied...)

// notApplied are keys the CLI would apply to the container's
// configuration: a managed launch creates (and inspects) the containers
// from the Compose files before the CLI runs, so they would have no
// effect. The launch says so rather than leaving them in.
var notApplied = []string{"containerEnv", "overrideCommand"}

// NotApplied lists the keys of the config that a managed launch does not
// apply (the container's environment and command come from the Compose
// files), sorted.
func (c *Config) NotApplied() []string {
	var out []string
	for _, k := range notApplied {
		if _, ok := c.raw[k]; ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Generate is the config the Dev Containers CLI gets: the source's keys
// less the dropped ones, with composeFiles (the checked copies, then the
// facade, as absolute paths) as dockerComposeFile, only the primary
// service run, the workspace folder the launch binds the worktree at,
// privileged off, the container user's uid left as the image has it, and
// user ("uid:gid", the workspace consumer) as remoteUser and
// containerUser: the CLI runs the lifecycle commands as remoteUser, so
// a name in the repository's config can never make them root.
func (c *Config) Generate(composeFiles []string, workspaceFolder, user string) ([]byte, error) {
	if len(composeFiles) == 0 {
		return nil, errors.New("devcontainer: no Compose files to run")
	}
	if user == "" {
		return nil, errors.New("devcontainer: no user to run as")
	}
	out := make(map[string]any, len(c.raw))
	for k, v := range c.raw {
		if !slices.Contains(dropped, k) {
			out[k] = v
		}
	}
	out["dockerComposeFile"] = composeFiles
	out["runServices"] = []string{c.Service()}
	out["workspaceFolder"] = workspaceFolder
	out["privileged"] = false
	out["updateRemoteUserUID"] = false
	out["remoteUser"] = user
	out["containerUser"] = user
	data, err := json.MarshalIndent(out, "", "\t")
	if err != nil {
		return nil, fmt.Errorf("devcontainer: %w", err)
	}
	return append(data, '\n'), nil
}

// findString is the path of the first string under v (keys included)
// that match accepts, or "".
func findString(v any, where string, match func(string) bool) string {
	switch v := v.(type) {
	case string:
		if match(v) {
			return orTop(where)
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			at := segment(k)
			if where != "" {
				at = where + "." + at
			}
			if match(k) {
				return at
			}
			if w := findString(v[k], at, match); w != "" {
				return w
			}
		}
	case []any:
		for i, e := range v {
			if w := findString(e, fmt.Sprintf("%s[%d]", where, i), match); w != "" {
				return w
			}
		}
	}
	return ""
}

// segment is one key of a key path as a message shows it, as Compose
// refusals show theirs: a key of at most 64 printable ASCII characters as
// it is, any other quoted (Go syntax: every control, format or non-ASCII
// character escaped) and cut short. Keys are the repository's bytes: a
// message goes to the operator's terminal and into the launch record,
// and no key may put an escape sequence or a forged line there.
func segment(key string) string {
	if key == "" || len(key) > 64 || strings.IndexFunc(key, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		if len(key) > 64 {
			key = key[:64] + "..."
		}
		return fmt.Sprintf("%q", key)
	}
	return key
}

func orTop(where string) string {
	if where == "" {
		return "the config"
	}
	return where
}
