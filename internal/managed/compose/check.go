package compose

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v3"

	"agentbox/internal/managed/policy"
)

// Refusal is a Compose input the managed launch will not run: Rule names
// what it breaks, Where the file and the key path in it
// ("compose.yaml: services.app.ports[0]").
type Refusal struct {
	Rule  string
	Where string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("compose: %s: %s", r.Where, r.Rule)
}

// Project is what the launch needs to know of checked Compose inputs.
type Project struct {
	Files []File
	// Services are every service declared, sorted; Connectors those the
	// launch disables as outer tunnel connectors; Omitted those the
	// assignment leaves out (see Omit); Runnable the others, which
	// service_images must bind exactly.
	Services, Connectors, Omitted, Runnable []string
	Model                                   *types.Project
	// fileModels are Files as Compose reads each alone (anchors, merge
	// keys and !reset applied), for the key allow-list.
	fileModels []map[string]any
}

// Omit takes the assignment's omitted_services out of the runnable
// services: they are not bound to an image and the facade disables them
// as it does connectors. Each must be a runnable service, and the primary
// cannot be omitted.
func (p *Project) Omit(names []string, primary string) error {
	for i, name := range names {
		where := fmt.Sprintf("assignment: omitted_services[%d]", i)
		switch {
		case name == primary:
			return &Refusal{Rule: quoteShort(name) + " is the primary service, which cannot be omitted", Where: where}
		case !slices.Contains(p.Runnable, name):
			return &Refusal{Rule: quoteShort(name) + " is not a runnable service of the Compose files", Where: where}
		}
		p.Runnable = slices.DeleteFunc(p.Runnable, func(s string) bool { return s == name })
		p.Omitted = append(p.Omitted, name)
	}
	return nil
}

// connectorNames are service names (lowercased) of outer tunnel
// connectors; a name ending in "-tunnel" is one too.
var connectorNames = []string{"cloudflared", "tailscale", "ngrok", "tunnel"}

// connectorImages are image names (the last path element, lowercased)
// of outer tunnel connectors.
var connectorImages = []string{"cloudflared", "tailscale", "ngrok"}

// Check parses files (in order, later ones merged over earlier ones) and
// applies every rule; the first broken rule is returned as a *Refusal.
func Check(ctx context.Context, worktree string, files []File) (*Project, error) {
	p := &Project{Files: files}
	for _, f := range files {
		if err := checkRaw(f); err != nil {
			return nil, err
		}
		alone, err := loader.LoadModelWithContext(ctx, details(worktree, f), loadOptions, func(o *loader.Options) {
			o.SkipValidation = true
			o.SkipNormalization = true
			o.SkipConsistencyCheck = true
			o.SkipDefaultValues = true
		})
		if err != nil {
			return nil, fmt.Errorf("compose: %s: %w", f.Path, err)
		}
		if err := checkTopKeys(f.Path, alone); err != nil {
			return nil, err
		}
		if err := checkEveryService(f.Path, alone); err != nil {
			return nil, err
		}
		p.fileModels = append(p.fileModels, alone)
	}
	model, err := loader.LoadWithContext(ctx, details(worktree, files...), loadOptions)
	if err != nil {
		return nil, fmt.Errorf("compose: %w", err)
	}
	p.Model = model
	for _, name := range slices.Sorted(maps.Keys(model.Services)) {
		svc := model.Services[name]
		p.Services = append(p.Services, name)
		if isConnector(name, svc) {
			p.Connectors = append(p.Connectors, name)
		} else {
			p.Runnable = append(p.Runnable, name)
		}
	}
	return p, nil
}

// details is the loader's input: files, in order, read from nowhere but
// their bytes.
func details(worktree string, files ...File) types.ConfigDetails {
	d := types.ConfigDetails{WorkingDir: worktree, Environment: types.Mapping{}}
	for _, f := range files {
		d.ConfigFiles = append(d.ConfigFiles, types.ConfigFile{Filename: f.Path, Content: f.Data})
	}
	return d
}

// loadOptions read nothing but the given bytes: no interpolation, no
// include or extends, no environment or label files, no remote
// resources.
func loadOptions(o *loader.Options) {
	o.SkipInterpolation = true
	o.SkipInclude = true
	o.SkipExtends = true
	o.SkipResolveEnvironment = true
	o.SkipResolveLabels = true
	o.ResolvePaths = false
	o.ResourceLoaders = nil
	// Every profile: a service behind one is a service like any other
	// here (runnable, a connector or omitted), so every rule and the
	// facade's resets reach it. The Dev Containers CLI loads the files
	// with every profile too (config --profile '*'), which reads such a
	// service's env_file on the host.
	o.Profiles = []string{"*"}
	o.SetProjectName("branchbox-check", true)
}

// isConnector reports whether a service is an outer tunnel connector.
func isConnector(name string, s types.ServiceConfig) bool {
	lower := strings.ToLower(name)
	if slices.Contains(connectorNames, lower) || strings.HasSuffix(lower, "-tunnel") {
		return true
	}
	image := strings.ToLower(s.Image)
	if i := strings.LastIndexAny(image, "@"); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndex(image, "/"); i >= 0 {
		image = image[i+1:]
	}
	if i := strings.Index(image, ":"); i >= 0 {
		image = image[:i]
	}
	if slices.Contains(connectorImages, image) {
		return true
	}
	for _, d := range s.Devices {
		if d.Source == "/dev/net/tun" {
			return true
		}
	}
	return false
}

// checkRaw applies the rules that must see a file as written: keys the
// loader is told to skip (include, extends, provider), interpolation,
// engine sockets and variables, and environment entries without a value.
// It reads every YAML document of the file: Compose merges them all, in
// order, as it merges files.
func checkRaw(f File) error {
	dec := yaml.NewDecoder(bytes.NewReader(f.Data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("compose: %s: %w", f.Path, err)
		}
		if err := checkDocument(f, &doc); err != nil {
			return err
		}
	}
}

// everyServiceRefused are keys refused in every service, connectors and
// omitted services included, as Compose reads the file (anchors, merge
// keys and every document applied): Compose acts on each when it loads
// the files, whether the service runs or not (extends reads another
// file, a local one or a remote one Compose fetches on the host;
// label_file reads a host file), or runs a program on the host
// (provider).
var everyServiceRefused = []string{"extends", "label_file", "provider", "volumes_from"}

// checkEveryService applies, to every service of a file as Compose reads
// it, the rules checkRaw applies as written: everyServiceRefused and
// environment entries without a value (an alias or a merge key can make
// one that checkRaw does not see).
func checkEveryService(path string, model map[string]any) error {
	services, _ := model["services"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(services)) {
		svc, _ := services[name].(map[string]any)
		at := path + ": services." + segment(name)
		for _, key := range everyServiceRefused {
			if _, ok := svc[key]; ok {
				return &Refusal{Rule: "not allowed in a managed launch", Where: at + "." + key}
			}
		}
		switch env := svc["environment"].(type) {
		case []any:
			for i, item := range env {
				if s, ok := item.(string); !ok || !strings.Contains(s, "=") {
					return &Refusal{Rule: "a valueless entry " + quoteShort(fmt.Sprint(item)), Where: fmt.Sprintf("%s.environment[%d]", at, i)}
				}
			}
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(env)) {
				if env[k] == nil {
					return &Refusal{Rule: "a valueless entry " + quoteShort(k), Where: at + ".environment." + segment(k)}
				}
			}
		}
	}
	return nil
}

// checkDocument applies checkRaw's rules to one document of f.
func checkDocument(f File, doc *yaml.Node) error {
	if len(doc.Content) == 0 {
		return nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return &Refusal{Rule: "not a mapping", Where: f.Path}
	}
	refuse := func(rule, where string) error { return &Refusal{Rule: rule, Where: f.Path + ": " + where} }
	if mapValue(top, "include") != nil {
		return refuse("not allowed in a managed launch (it reads other files)", "include")
	}
	if services := mapValue(top, "services"); services != nil && services.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(services.Content); i += 2 {
			name, svc := services.Content[i].Value, services.Content[i+1]
			if svc.Kind != yaml.MappingNode {
				continue
			}
			at := "services." + segment(name)
			for _, key := range []string{"extends", "provider", "volumes_from"} {
				if mapValue(svc, key) != nil {
					return refuse("not allowed in a managed launch", at+"."+segment(key))
				}
			}
			if err := checkEnvironment(mapValue(svc, "environment"), func(entry, rule string) error {
				return refuse(rule, at+".environment"+entry)
			}); err != nil {
				return err
			}
		}
	}
	return walkScalars(top, f.Path, func(where, s string) error {
		if pos := unescapedInterpolation(s); pos >= 0 {
			return refuse("interpolation (write $$ for a literal $)", where)
		}
		lower := strings.ToLower(s)
		for _, sock := range policy.EngineSocketNames {
			if strings.Contains(lower, sock) {
				return refuse("a container-engine socket ("+sock+")", where)
			}
		}
		upper := strings.ToUpper(s)
		for _, v := range policy.EngineEnv {
			if containsWord(upper, v) {
				return refuse("a container-engine variable ("+v+")", where)
			}
		}
		return nil
	})
}

// checkEnvironment refuses environment entries without a value: a list
// item without '=', or a mapping key with a null value (the engine would
// take the value from wherever Compose runs). refuse gets the entry's
// key path below environment ("[2]", ".NAME").
func checkEnvironment(env *yaml.Node, refuse func(entry, rule string) error) error {
	if env == nil {
		return nil
	}
	switch env.Kind {
	case yaml.SequenceNode:
		for i, item := range env.Content {
			if item.Kind == yaml.ScalarNode && !strings.Contains(item.Value, "=") {
				return refuse(fmt.Sprintf("[%d]", i), "a valueless entry "+quoteShort(item.Value))
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(env.Content); i += 2 {
			if v := env.Content[i+1]; v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
				return refuse("."+segment(env.Content[i].Value), "a valueless entry "+quoteShort(env.Content[i].Value))
			}
		}
	}
	return nil
}

// mapValue is the value node of key in a mapping node, or nil.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// maxDepth bounds the YAML nesting walked (a hostile file cannot exhaust
// the stack; Compose files are a few levels deep).
const maxDepth = 64

// walkScalars calls fn with every scalar (keys too) under n, file's top
// level, and where it is, as a dotted path of keys.
func walkScalars(n *yaml.Node, file string, fn func(where, s string) error) error {
	return walk(n, file, "", 0, fn)
}

func walk(n *yaml.Node, file, where string, depth int, fn func(where, s string) error) error {
	if depth > maxDepth {
		return &Refusal{Rule: "nested too deep", Where: file + ": " + where}
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if err := checkTag(n, file, where); err != nil {
			return err
		}
		return fn(where, n.Value)
	case yaml.AliasNode:
		return nil // its anchor is walked where it is defined
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			at := segment(key)
			if where != "" {
				at = where + "." + at
			}
			if err := checkTag(n.Content[i], file, at); err != nil {
				return err
			}
			if err := fn(at, key); err != nil {
				return err
			}
			if err := walk(n.Content[i+1], file, at, depth+1, fn); err != nil {
				return err
			}
		}
	default:
		for i, c := range n.Content {
			if err := walk(c, file, fmt.Sprintf("%s[%d]", where, i), depth+1, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkTag refuses a scalar tagged !!binary: Compose reads it decoded,
// text the rules here would never see as written (an interpolation in
// base64 has no '$').
func checkTag(n *yaml.Node, file, where string) error {
	if n.ShortTag() == "!!binary" {
		return &Refusal{Rule: "a !!binary value (write it as text)", Where: file + ": " + where}
	}
	return nil
}

// unescapedInterpolation is the index of the first '$' that Compose would
// interpolate ($NAME or ${...}), or -1; "$$" is a literal '$'.
func unescapedInterpolation(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			i++
			continue
		}
		if i+1 < len(s) && (s[i+1] == '{' || s[i+1] == '_' || isLetter(s[i+1])) {
			return i
		}
	}
	return -1
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// containsWord reports whether s holds w not preceded or followed by a
// letter, digit or '_'.
func containsWord(s, w string) bool {
	for i := 0; ; {
		j := strings.Index(s[i:], w)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(w)
		if (start == 0 || !isWordByte(s[start-1])) && (end == len(s) || !isWordByte(s[end])) {
			return true
		}
		i = start + 1
	}
}

func isWordByte(c byte) bool { return isLetter(c) || c >= '0' && c <= '9' || c == '_' }

// segment is one key of a key path as a message shows it: a key of at
// most 64 printable ASCII characters as it is, any other quoted and cut
// short (keys are the repository's bytes: none may forge a line).
func segment(key string) string {
	if key == "" || len(key) > 64 || strings.IndexFunc(key, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return quoteShort(key)
	}
	return key
}

// quoteShort quotes s, at most 64 bytes of it.
func quoteShort(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("%q", s)
}
