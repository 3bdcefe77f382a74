package orchestrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"agentbox/internal/config"
	"agentbox/internal/grant"
	"agentbox/internal/manifest"
	"agentbox/internal/secfs"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// RepoConfigPath is the repository config, relative to the repository.
const RepoConfigPath = ".jailbee/config.yaml"

// Send decodes and validates a manifest for its requester and runs the
// type's handler. Every refusal is a *Refusal whose detail the requester
// may read; other errors are broker faults.
func (o *Orchestrator) Send(ctx context.Context, req wire.Caller, raw json.RawMessage, body *string) (store.Sent, error) {
	m, err := manifest.Decode(raw, body)
	if err != nil {
		return store.Sent{}, asRefusal(err)
	}
	from, err := o.sender(ctx, req)
	if err != nil {
		return store.Sent{}, err
	}
	if err := manifest.Validate(m, from); err != nil {
		return store.Sent{}, asRefusal(err)
	}
	switch m.Type {
	case manifest.TypeMessage:
		msg := m.Message
		return o.SendMessage(ctx, req, Message{ID: m.ID, To: msg.To, Kind: msg.Kind, Body: msg.Body, InReplyTo: msg.InReplyTo})
	case manifest.TypeSpawn:
		return o.Spawn(ctx, req, m, from)
	case manifest.TypeImport:
		return o.Import(ctx, req, m)
	case manifest.TypeStop:
		return o.StopChild(ctx, req, m)
	case manifest.TypeDestroy:
		return o.DestroyChild(ctx, req, m)
	case manifest.TypeUpdate:
		return o.Update(ctx, req, m)
	case manifest.TypeRestart:
		return o.Restart(ctx, req, m, from)
	case manifest.TypeRights:
		return o.Rights(ctx, req, m)
	case manifest.TypeRefresh:
		return o.Refresh(ctx, req, m)
	case manifest.TypePublish:
		return o.Publish(ctx, req, m, from)
	default:
		return store.Sent{}, asRefusal(manifest.NotAvailable(m.Type))
	}
}

// asRefusal turns a manifest refusal into the requester's refusal; other
// errors pass through as faults.
func asRefusal(err error) error {
	var r *manifest.Refusal
	if errors.As(err, &r) {
		return &Refusal{Detail: r.Detail}
	}
	return err
}

// sender gathers what manifest.Validate needs about the requester: its
// identity, stored grant and the host repository's config.
func (o *Orchestrator) sender(ctx context.Context, req wire.Caller) (manifest.Sender, error) {
	sb, err := o.Store.Sandbox(ctx, req.Sandbox)
	if err != nil {
		return manifest.Sender{}, err
	}
	from := manifest.Sender{Caller: req}
	if req.Role == wire.RoleOrchestrator {
		if sb.Grant != "" {
			g, err := o.parsedGrant(sb.Grant)
			if err != nil {
				return manifest.Sender{}, fmt.Errorf("stored grant of %s: %w", sb.Name, err)
			}
			from.Grant = &g
		}
	}
	repo, err := LoadRepoConfig(sb.Repo)
	if err != nil {
		return manifest.Sender{}, err
	}
	if o.ModelSockets {
		// A claude-jb runner's profile must have a model socket.
		repo.LiteLLM.Served = o.LiteLLMProfiles
		if repo.LiteLLM.Served == nil {
			repo.LiteLLM.Served = map[string]bool{}
		}
	}
	from.Repo = repo
	return from, nil
}

// LoadRepoConfig reads <repo>/.jailbee/config.yaml, through no symlink
// (neither .jailbee nor config.yaml may be one: a branch merged from a
// sandbox could commit `.jailbee` pointing into a sandbox's own checkout
// and make the config its to change at will); a repository without one
// gets the default config. A config
// that does not parse refuses every manifest that needs it, with the
// parser's message (key path and line; never a host path).
func LoadRepoConfig(repo string) (*config.Repo, error) {
	data, err := secfs.ReadFileBelow(repo, RepoConfigPath, config.MaxConfigBytes)
	if errors.Is(err, os.ErrNotExist) {
		return config.Default(), nil
	}
	if err != nil {
		return nil, &Refusal{Detail: "the repository config " + RepoConfigPath + " cannot be read"}
	}
	cfg, err := config.Parse(data)
	if err != nil {
		return nil, &Refusal{Detail: "the repository config " + RepoConfigPath + " is invalid: " + err.Error()}
	}
	return cfg, nil
}

// maxCachedGrants bounds the parsed-grant cache; grants change rarely, so a
// full cache is simply cleared.
const maxCachedGrants = 1024

// parsedGrant parses a stored grant document, caching by its text: every
// orchestrator send needs it.
func (o *Orchestrator) parsedGrant(doc string) (grant.Grant, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if g, ok := o.grants[doc]; ok {
		return g, nil
	}
	g, err := grant.Parse([]byte(doc))
	if err != nil {
		return grant.Grant{}, err
	}
	if o.grants == nil || len(o.grants) >= maxCachedGrants {
		o.grants = map[string]grant.Grant{}
	}
	o.grants[doc] = g
	return g, nil
}
