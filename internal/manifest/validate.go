package manifest

import (
	"errors"

	"agentbox/internal/config"
	"agentbox/internal/grant"
	"agentbox/internal/wire"
)

// Sender is what Validate needs to know about who sent a manifest.
type Sender struct {
	// Caller is the sender's identity, fixed by the socket it came
	// through (its Sandbox is the child's own name for its rights).
	Caller wire.Caller
	// Grant is the sender's stored grant, nil when it holds none. Validate
	// caps it with Repo's orchestration.cap itself.
	Grant *grant.Grant
	// Revoked is true once the sender's grant was revoked.
	Revoked bool
	// Repo is the host repository's config; nil means config.Default().
	Repo *config.Repo
}

// Validate applies the caller-dependent rules to a decoded manifest:
//
//   - a child may send only message without `to` and revoke-only rights for
//     itself (child absent or its own short name, grant absent, not even
//     null);
//   - an orchestrator needs an active grant holding the type's operation
//     (revoke-only rights needs no operation), and must name the child of
//     message and rights;
//   - spawn and rights grants pass the rights rule against the effective
//     (repo-capped) grant; spawn/restart on_done destroy needs the destroy
//     operation; runners, autostart profiles and services are checked
//     against the repo config.
//
// A refusal is a *Refusal carrying the manifest's ID.
func Validate(m *Manifest, from Sender) error {
	if m == nil {
		return errors.New("manifest: Validate of a nil manifest")
	}
	repo := from.Repo
	if repo == nil {
		repo = config.Default()
	}
	var err error
	switch from.Caller.Role {
	case wire.RoleChild:
		err = validateChild(m, from.Caller.Sandbox)
	case wire.RoleOrchestrator:
		err = validateOrchestrator(m, from, repo)
	default:
		return errors.New("manifest: Validate needs the sender's role")
	}
	if r, ok := err.(*Refusal); ok {
		r.ID = m.ID
	}
	return err
}

func validateChild(m *Manifest, self string) error {
	switch m.Type {
	case TypeMessage:
		if m.Message.To != "" {
			return &Refusal{Detail: DetailChildTo}
		}
		return nil
	case TypeRights:
		r := m.Rights
		if (r.Child != "" && r.Child != self) || r.Grant != nil || r.GrantNull {
			return &Refusal{Detail: DetailChildRightsOnly}
		}
		return nil
	}
	return &Refusal{Detail: DetailChildTypes}
}

// CheckSpawnRights applies the rights rule to a spawn's rights against
// from's grant capped by its repository's orchestration.cap: the check
// Validate makes of a spawn when it is sent, which a queued spawn passes
// again when it starts (the grant or the cap may have narrowed
// meanwhile). A refusal is a *Refusal whose detail names the right that
// does not pass (or the missing grant).
func CheckSpawnRights(from Sender, r grant.Rights) error {
	repo := from.Repo
	if repo == nil {
		repo = config.Default()
	}
	eff, err := effectiveGrant(from, repo)
	if err != nil {
		return err
	}
	return checkRights(eff, repo, r)
}

// effectiveGrant is from's grant capped by repo's orchestration.cap; a
// refusal when from's grant was revoked or it holds none.
func effectiveGrant(from Sender, repo *config.Repo) (grant.Grant, error) {
	if from.Revoked {
		return grant.Grant{}, &Refusal{Detail: DetailGrantRevoked}
	}
	if from.Grant == nil {
		return grant.Grant{}, &Refusal{Detail: DetailNoGrant}
	}
	return from.Grant.Capped(repo.Orchestration.Cap), nil
}

// checkRights refuses rights that do not pass the rights rule against the
// effective grant eff and repo's cap.
func checkRights(eff grant.Grant, repo *config.Repo, r grant.Rights) error {
	if err := grant.CheckRights(eff, repo.Orchestration.Cap, r); err != nil {
		return refuse("%s", err.Error())
	}
	return nil
}

func validateOrchestrator(m *Manifest, from Sender, repo *config.Repo) error {
	eff, err := effectiveGrant(from, repo)
	if err != nil {
		return err
	}
	revokeOnly := m.Type == TypeRights && m.Rights.RevokeOnly()
	if op := OperationFor(m.Type); !revokeOnly && !eff.Has(op) {
		return &Refusal{Detail: MissingOperation(op)}
	}
	switch m.Type {
	case TypeMessage:
		if m.Message.To == "" {
			return refuse("`to` is required: name the child")
		}
	case TypeSpawn:
		s := m.Spawn
		if err := needDestroy(s.OnDone, eff); err != nil {
			return err
		}
		if err := checkRights(eff, repo, s.Rights); err != nil {
			return err
		}
		if s.Runner != nil {
			if err := repo.CheckRunner(*s.Runner); err != nil {
				return refuse("%s", err.Error())
			}
		}
		return checkStartup(repo, s.AutostartProfile, s.Services)
	case TypeRestart:
		r := m.Restart
		if err := needDestroy(r.OnDone, eff); err != nil {
			return err
		}
		if r.Runner.Runner != nil {
			if err := repo.CheckRunner(*r.Runner.Runner); err != nil {
				return refuse("%s", err.Error())
			}
		}
		return checkStartup(repo, r.AutostartProfile, r.Services)
	case TypeRefresh:
		return checkStartup(repo, "", m.Refresh.Services)
	case TypeRights:
		r := m.Rights
		if r.Child == "" {
			return refuse("`child` is required: name the child whose rights change")
		}
		if r.Grant != nil {
			if r.Grant.For == "" {
				return refuse("`grant.for` is required: a TTL of at most 24h, or never")
			}
			if err := checkRights(eff, repo, r.Grant.Items); err != nil {
				return err
			}
		}
	}
	return nil
}

// needDestroy refuses an explicit on_done destroy without the destroy
// operation.
func needDestroy(onDone string, eff grant.Grant) error {
	if onDone == OnDoneDestroy && !eff.Has(grant.OpDestroy) {
		return refuse("on_done `destroy` needs operation `destroy`, which is not in this container's grant")
	}
	return nil
}

// checkStartup checks an autostart profile and services against the repo.
func checkStartup(repo *config.Repo, profile string, services []string) error {
	if profile != "" && !repo.AutostartProfileDefined(profile) {
		return refuse("autostart profile `%s` is not defined", profile)
	}
	for _, s := range services {
		if !repo.ServiceDefined(s) {
			return refuse("service `%s` is not defined", s)
		}
	}
	return nil
}
