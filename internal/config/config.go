// Package config parses the repository config, .jailbee/config.yaml, and
// the broker config, <state dir>/broker.yaml. It is pure: the parsers take
// the file's bytes (the caller reads the file).
//
// API:
//
//	Parse(data []byte) (*Repo, error)    strict YAML; errors are *Error naming the key path
//	Default() *Repo                      the config of a repository without the file
//	(*Repo) CheckRunner(grant.Runner) error        the spec's runner refusals
//	(*Repo) AutostartProfileDefined(name) bool
//	(*Repo) ServiceDefined(name) bool
//	(*Repo) WithDependencies(names []string) []string
//	(*Repo) StartOrder(names []string) []string   dependencies first
//	(*Repo) AllServices() []string
//	CheckWarmPath(glob string) error     warm_paths glob rule (shared with spawn manifests)
//
//	ParseBroker(data []byte) (*Broker, error)  broker.yaml, as strict as Parse
//	DefaultBroker() *Broker              the config of a broker without the file
//	(*Broker) Validate() error           every bound of a Broker built in code
//	(Limits) Override(LimitsOverride) Limits   a sandbox's limits: broker defaults, repo overrides
//	(LimitsOverride) Validate() error    the bounds of the keys a repo's `limits` sets
//	(UIDRange) Last() uint32, Contains(uid) bool
//	ParseSize(s string) (int64, error)   "4GiB", "512MiB", "1048576" (binary units only)
//	FormatSize(n int64) string           the inverse, in the largest exact unit
//
// Every key is documented with an example in docs/config.md (the
// repository config) and docs/broker-config.md (the broker config).
package config

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"agentbox/internal/grant"
	"agentbox/internal/untrusted"

	"go.yaml.in/yaml/v3"
)

// Repo is a parsed .jailbee/config.yaml.
type Repo struct {
	// Agents by name ([a-z0-9][a-z0-9-]{0,63}).
	Agents map[string]Agent `yaml:"agents"`
	// DefaultAgent names the agent a spawn without a runner starts when no
	// default runner is configured. Empty: none.
	DefaultAgent  string             `yaml:"default_agent"`
	LiteLLM       LiteLLM            `yaml:"litellm"`
	Autostart     Autostart          `yaml:"autostart"`
	Services      map[string]Service `yaml:"services"`
	Fork          Fork               `yaml:"fork"`
	Orchestration Orchestration      `yaml:"orchestration"`
	// Limits override the broker's per-sandbox resource limits
	// (broker.yaml `limits`) key by key; an absent key keeps the broker's.
	Limits LimitsOverride `yaml:"limits"`
}

// Agent is one agents.NAME entry.
type Agent struct {
	// Command is run with `sh -c` inside the sandbox as the agent user,
	// with the checkout as working directory. Required.
	Command string `yaml:"command"`
	// PromptArgs are appended to Command as arguments; "{prompt}" in an
	// item expands to the prompt text. Empty: the agent cannot take a
	// prompt.
	PromptArgs []string `yaml:"prompt_args"`
	// Enabled defaults to true for a defined agent.
	Enabled *bool `yaml:"enabled"`
	// Autostart starts the agent in the autostart session without a prompt.
	Autostart bool `yaml:"autostart"`
	// Install and Update are shell commands run at provisioning time.
	Install string `yaml:"install"`
	Update  string `yaml:"update"`
	// SkillsDir is a checkout-relative directory of agent skills.
	SkillsDir string `yaml:"skills_dir"`
}

// IsEnabled reports whether the agent may be started.
func (a Agent) IsEnabled() bool { return a.Enabled == nil || *a.Enabled }

// LiteLLM is the litellm section.
type LiteLLM struct {
	Enabled bool `yaml:"enabled"`
	// Profiles are the configured LiteLLM profiles and the route of each
	// model tier they serve.
	Profiles map[string]LiteLLMProfile `yaml:"profiles"`
	// Served, when not nil, is the set of profiles the LiteLLM proxy serves
	// right now; the broker may fill it from live state. nil: every
	// configured profile counts as served. Never read from YAML.
	Served map[string]bool `yaml:"-"`
}

// LiteLLMProfile is one litellm.profiles.NAME entry.
type LiteLLMProfile struct {
	// Tiers maps a tier (fable, opus, sonnet, haiku) to its route.
	Tiers map[string]string `yaml:"tiers"`
}

// Autostart is the autostart section.
type Autostart struct {
	// DefaultProfile is used by spawn when a manifest names none. Empty:
	// every service starts.
	DefaultProfile string                      `yaml:"default_profile"`
	Profiles       map[string]AutostartProfile `yaml:"profiles"`
}

// AutostartProfile is one autostart.profiles.NAME entry.
type AutostartProfile struct {
	// Services the profile starts (dependencies included). nil: all.
	Services []string `yaml:"services"`
	// Setup commands run once per container, before the first on_start.
	Setup []string `yaml:"setup"`
	// OnStart commands run at every start, after setup.
	OnStart []string `yaml:"on_start"`
}

// Service is one services.NAME entry.
type Service struct {
	Command   string   `yaml:"command"`
	DependsOn []string `yaml:"depends_on"`
}

// Fork is the fork section.
type Fork struct {
	// WarmPaths are the default warm_paths of a fork spawn.
	WarmPaths []string `yaml:"warm_paths"`
}

// Orchestration is the orchestration section.
type Orchestration struct {
	// IdleAfterSeconds is the idle report delay and cadence; 0 after Parse
	// never happens (absent means DefaultIdleAfterSeconds).
	IdleAfterSeconds int `yaml:"idle_after_seconds"`
	// Cap limits every orchestration grant in this repository.
	Cap grant.Cap `yaml:"cap"`
	// DefaultRunner is the repository's default runner ("repo" source).
	DefaultRunner *grant.Runner `yaml:"default_runner"`
}

// Default returns the config of a repository without .jailbee/config.yaml:
// no agents, no LiteLLM, no services, no caps, idle after 900 s, the
// broker's sandbox limits.
func Default() *Repo {
	return &Repo{Orchestration: Orchestration{IdleAfterSeconds: DefaultIdleAfterSeconds}}
}

var (
	agentNameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)
	serviceNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
)

// ValidServiceName reports whether name is a valid service name.
func ValidServiceName(name string) bool { return serviceNameRE.MatchString(name) }

// ValidAutostartProfileName reports whether name is a valid autostart
// profile name (the same rule as services).
func ValidAutostartProfileName(name string) bool { return serviceNameRE.MatchString(name) }

// Parse decodes .jailbee/config.yaml strictly: at most MaxConfigBytes, one
// YAML document, no unknown or duplicate keys at any level, no aliases,
// every `limits` value within its bounds, then every cross-reference is
// checked. Empty input is Default().
func Parse(data []byte) (*Repo, error) {
	if len(data) > MaxConfigBytes {
		return nil, &Error{Msg: fmt.Sprintf("config exceeds %d bytes", MaxConfigBytes)}
	}
	doc, err := decodeDocument(data)
	if err != nil {
		return nil, err
	}
	if doc == nil {
		return Default(), nil
	}
	if err := checkNode(doc, reflect.TypeFor[Repo](), ""); err != nil {
		return nil, err
	}
	repo := Default()
	if err := doc.Decode(repo); err != nil {
		return nil, &Error{Msg: "invalid value: " + err.Error()}
	}
	// An explicit null or missing idle_after_seconds keeps the default;
	// an explicit 0 is refused below.
	if !hasKey(doc, "orchestration", "idle_after_seconds") {
		repo.Orchestration.IdleAfterSeconds = DefaultIdleAfterSeconds
	}
	if err := repo.check(); err != nil {
		return nil, err
	}
	return repo, nil
}

// hasKey reports whether the document sets path to a non-null value.
func hasKey(doc *yaml.Node, path ...string) bool {
	n := doc
	for n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	for _, key := range path {
		if n.Kind != yaml.MappingNode {
			return false
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			return false
		}
		n = next
	}
	return !(n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

func (c *Repo) check() error {
	for _, name := range sortedKeys(c.Agents) {
		a := c.Agents[name]
		p := join("agents", name)
		if !agentNameRE.MatchString(name) {
			return &Error{Path: p, Msg: "agent names must match [a-z0-9][a-z0-9-]{0,63}"}
		}
		if a.Command == "" {
			return &Error{Path: p + ".command", Msg: "is required"}
		}
	}
	if c.DefaultAgent != "" {
		if _, ok := c.Agents[c.DefaultAgent]; !ok {
			return &Error{Path: "default_agent", Msg: fmt.Sprintf("agent `%s` is not defined under agents", shown(c.DefaultAgent))}
		}
	}
	for _, name := range sortedKeys(c.LiteLLM.Profiles) {
		p := join("litellm.profiles", name)
		if !grant.ValidProfile(name) {
			return &Error{Path: p, Msg: "profile names must match [a-z0-9][a-z0-9_-]{0,63}"}
		}
		for _, tier := range sortedKeys(c.LiteLLM.Profiles[name].Tiers) {
			if !slices.Contains(grant.Tiers, tier) {
				return &Error{Path: join(p+".tiers", tier), Msg: "tier must be fable, opus, sonnet or haiku"}
			}
			if c.LiteLLM.Profiles[name].Tiers[tier] == "" {
				return &Error{Path: join(p+".tiers", tier), Msg: "route must not be empty"}
			}
		}
	}
	for _, name := range sortedKeys(c.Services) {
		p := join("services", name)
		if !ValidServiceName(name) {
			return &Error{Path: p, Msg: "service names must match [a-z0-9][a-z0-9_-]{0,63}"}
		}
		if c.Services[name].Command == "" {
			return &Error{Path: p + ".command", Msg: "is required"}
		}
		if c.isAgentWindow(name) {
			// Both run in one tmux session, in windows named after them.
			return &Error{Path: p, Msg: "a service must not be named like an agent (agents' and services' tmux windows are named after them)"}
		}
		for i, dep := range c.Services[name].DependsOn {
			if _, ok := c.Services[dep]; !ok {
				return &Error{Path: fmt.Sprintf("%s.depends_on[%d]", p, i), Msg: fmt.Sprintf("service `%s` is not defined", shown(dep))}
			}
		}
	}
	if cycle := c.serviceCycle(); cycle != nil {
		return &Error{Path: "services." + cycle[0] + ".depends_on", Msg: "dependency cycle: " + strings.Join(cycle, " -> ")}
	}
	for _, name := range sortedKeys(c.Autostart.Profiles) {
		p := "autostart.profiles." + name
		if !ValidAutostartProfileName(name) {
			return &Error{Path: p, Msg: "profile names must match [a-z0-9][a-z0-9_-]{0,63}"}
		}
		for i, s := range c.Autostart.Profiles[name].Services {
			if _, ok := c.Services[s]; !ok {
				return &Error{Path: fmt.Sprintf("%s.services[%d]", p, i), Msg: fmt.Sprintf("service `%s` is not defined", shown(s))}
			}
		}
	}
	if d := c.Autostart.DefaultProfile; d != "" && !c.AutostartProfileDefined(d) {
		return &Error{Path: "autostart.default_profile", Msg: fmt.Sprintf("autostart profile `%s` is not defined", shown(d))}
	}
	if len(c.Fork.WarmPaths) > MaxWarmPaths {
		return &Error{Path: "fork.warm_paths", Msg: fmt.Sprintf("has more than %d items", MaxWarmPaths)}
	}
	for i, g := range c.Fork.WarmPaths {
		if err := CheckWarmPath(g); err != nil {
			return &Error{Path: fmt.Sprintf("fork.warm_paths[%d]", i), Msg: err.Error()}
		}
	}
	o := c.Orchestration
	if o.IdleAfterSeconds <= 0 || o.IdleAfterSeconds > MaxIdleAfterSeconds {
		return &Error{Path: "orchestration.idle_after_seconds", Msg: fmt.Sprintf("must be 1 to %d seconds", MaxIdleAfterSeconds)}
	}
	if err := checkCap(o.Cap); err != nil {
		return err
	}
	if r := o.DefaultRunner; r != nil {
		if err := r.Check("orchestration.default_runner"); err != nil {
			return &Error{Msg: err.Error()}
		}
	}
	return nil
}

func checkCap(c grant.Cap) error {
	const p = "orchestration.cap"
	if n := c.MaxRunningChildren; n != nil && (*n < 0 || *n > grant.MaxRunningChildrenLimit) {
		return &Error{Path: p + ".max_running_children", Msg: fmt.Sprintf("must be 0 to %d", grant.MaxRunningChildrenLimit)}
	}
	for i, op := range c.Operations {
		if !grant.ValidOperation(op) {
			return &Error{Path: fmt.Sprintf("%s.operations[%d]", p, i), Msg: fmt.Sprintf("unknown operation (want one of %v)", grant.Operations)}
		}
	}
	r := grant.Rights{Mounts: c.Mounts, Egress: c.Egress}
	if err := r.CheckSyntax(p); err != nil {
		return &Error{Msg: err.Error()}
	}
	if c.Publish != nil {
		if err := c.Publish.Check(p + ".publish"); err != nil {
			return &Error{Msg: err.Error()}
		}
	}
	return nil
}

// serviceCycle returns a depends_on cycle, its first service repeated at
// its end (a -> b -> a), or nil.
func (c *Repo) serviceCycle() []string {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var path []string
	var visit func(string) []string
	visit = func(s string) []string {
		switch state[s] {
		case visiting:
			i := slices.Index(path, s)
			return append(slices.Clone(path[i:]), s)
		case done:
			return nil
		}
		state[s] = visiting
		path = append(path, s)
		for _, d := range c.Services[s].DependsOn {
			if cycle := visit(d); cycle != nil {
				return cycle
			}
		}
		path = path[:len(path)-1]
		state[s] = done
		return nil
	}
	for _, s := range sortedKeys(c.Services) {
		if cycle := visit(s); cycle != nil {
			return cycle
		}
	}
	return nil
}

// isAgentWindow reports whether an agent's tmux window may be named name:
// an agents entry, or the Claude runners (claude-jb runs in claude's).
func (c *Repo) isAgentWindow(name string) bool {
	_, ok := c.Agents[name]
	return ok || name == grant.AgentClaude || name == grant.AgentClaudeJB
}

// StartOrder returns names (defined services, dependencies already
// included) so that each comes after everything it depends on; services
// that do not depend on each other keep their sorted order.
func (c *Repo) StartOrder(names []string) []string {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := make([]string, 0, len(names))
	placed := map[string]bool{}
	var place func(string)
	place = func(s string) {
		if placed[s] || !want[s] {
			return
		}
		placed[s] = true // no cycles: Parse refused them
		deps := slices.Clone(c.Services[s].DependsOn)
		sort.Strings(deps)
		for _, d := range deps {
			place(d)
		}
		out = append(out, s)
	}
	sorted := slices.Clone(names)
	sort.Strings(sorted)
	for _, s := range sorted {
		place(s)
	}
	return out
}

// AllServices returns every defined service's name, sorted.
func (c *Repo) AllServices() []string { return sortedKeys(c.Services) }

// AutostartProfileDefined reports whether autostart.profiles has name.
func (c *Repo) AutostartProfileDefined(name string) bool {
	_, ok := c.Autostart.Profiles[name]
	return ok
}

// ServiceDefined reports whether services has name.
func (c *Repo) ServiceDefined(name string) bool {
	_, ok := c.Services[name]
	return ok
}

// WithDependencies returns names followed by every service they depend on,
// transitively, each once, in first-seen order (spec: "dependencies are
// included"). Unknown names are kept as they are.
func (c *Repo) WithDependencies(names []string) []string {
	out := make([]string, 0, len(names))
	seen := map[string]bool{}
	var add func(string)
	add = func(s string) {
		if seen[s] {
			return
		}
		seen[s] = true
		out = append(out, s)
		for _, d := range c.Services[s].DependsOn {
			add(d)
		}
	}
	for _, n := range names {
		add(n)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// shown returns s bounded to maxShownLen bytes and printable (no
// control, escape or format character a terminal acts on) for use in a
// message: what it repeats is the repository's, and the message reaches
// the host's terminal.
func shown(s string) string { return bounded(s, maxShownLen) }

// bounded is s cut to at most n bytes (and a "…") and made printable.
func bounded(s string, n int) string {
	if len(s) <= n {
		return untrusted.Printable(s)
	}
	cut := n
	for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return untrusted.Printable(s[:cut]) + "…"
}
