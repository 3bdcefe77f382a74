package assignment

import (
	"slices"
	"time"
)

// V1Providers is version 1's fixed provider allowlist: each provider
// executable with the one environment name it inherits. Version 1 has no
// executable or inherited_environment fields; its model-identity lease
// names the provider as its consumer. The spec does not list the allowlist;
// the reference allows only codex with OPENAI_API_KEY, and we add the two
// other providers the reference knows by name (see docs/branchbox.md).
var V1Providers = map[string]string{
	"claude": "ANTHROPIC_API_KEY",
	"codex":  "OPENAI_API_KEY",
	"gemini": "GEMINI_API_KEY",
}

// ValueBinding is one provider-environment value to read just before exec.
type ValueBinding struct {
	Name   string // the environment name
	Lease  int    // index of the provider-environment lease
	Index  int    // index of the materialization in that lease
	Source string // the value file
	SHA256 string // its signed digest
	Field  string // JSON location, for messages
}

// ProviderGrant is what one authorized provider start may receive.
type ProviderGrant struct {
	// Identity is the index of the matching model-identity lease.
	Identity int
	// Consumer is that lease's consumer.
	Consumer string
	// Executable is the requested and signed executable.
	Executable string
	// Inherited are the exact names to copy from the caller's environment,
	// in the signed order.
	Inherited []string
	// Values are the provider-environment bindings of that exact consumer.
	Values []ValueBinding
}

// AuthorizeProvider decides whether executable may start with exactly the
// inherited names (in the given order): it must match one live
// model-identity lease exactly (version 1: be on the fixed allowlist, ask
// for exactly its one name, and have a live model-identity lease whose
// consumer is that provider). The grant then carries the provider-
// environment values of that lease's exact consumer; an expired
// provider-environment lease of that consumer refuses the start rather than
// silently dropping its values. Messages never echo the request.
func (a *Assignment) AuthorizeProvider(executable string, inherited []string, now time.Time) (*ProviderGrant, error) {
	if r := executableReason(executable); r != "" {
		return nil, Errorf("provider", "%s", r)
	}
	for i, n := range inherited {
		if r := EnvironmentNameReason(n); r != "" {
			return nil, Errorf("inherit-env", "name %d: %s", i+1, r)
		}
	}
	match := -1
	if a.Version == Version1 {
		name, ok := V1Providers[executable]
		if !ok {
			return nil, Errorf("provider", "version 1 assignments start only the fixed providers claude, codex and gemini")
		}
		if !slices.Equal(inherited, []string{name}) {
			return nil, Errorf("inherit-env", "a version 1 provider inherits exactly its one fixed environment name")
		}
		for i := range a.Leases {
			if a.Leases[i].Scope == ScopeModelIdentity && a.Leases[i].Consumer == executable {
				match = i
			}
		}
	} else {
		for i := range a.Leases {
			if a.Leases[i].Scope == ScopeModelIdentity && a.Leases[i].Executable == executable {
				match = i // executables are unique across model identities
			}
		}
	}
	if match < 0 {
		return nil, Errorf("provider", "no model-identity lease binds this executable")
	}
	id := &a.Leases[match]
	if !id.Live(now) {
		return nil, Errorf(field(LeaseField(match), "expires_at"), "the model-identity lease for this executable has expired")
	}
	if a.Version != Version1 && !slices.Equal(inherited, id.InheritedEnvironment) {
		return nil, Errorf("inherit-env", "the inherited names differ from the model-identity lease's exact ordered list")
	}
	g := &ProviderGrant{
		Identity:   match,
		Consumer:   id.Consumer,
		Executable: executable,
		Inherited:  slices.Clone(inherited),
	}
	for i := range a.Leases {
		l := &a.Leases[i]
		if l.Scope != ScopeProviderEnvironment || l.Consumer != id.Consumer {
			continue
		}
		if !l.Live(now) {
			return nil, Errorf(field(LeaseField(i), "expires_at"), "a provider-environment lease of this consumer has expired")
		}
		for j, m := range l.Materializations {
			g.Values = append(g.Values, ValueBinding{
				Name: m.EnvironmentName, Lease: i, Index: j,
				Source: m.SourcePath, SHA256: m.SHA256, Field: m.Field,
			})
		}
	}
	return g, nil
}
