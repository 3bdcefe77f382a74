package manifest

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"agentbox/internal/config"
	"agentbox/internal/grant"
	"agentbox/internal/shortname"
)

// envelopeKeys are allowed on every manifest.
var envelopeKeys = []string{"version", "id", "type"}

// Decode decodes one manifest strictly and checks every rule that needs
// nothing but the manifest itself. body is the socket request's body, nil
// when the request has none; it supplies the text of prompt_file or
// body_file and is refused when the manifest names neither (and required
// when it does). Every refusal is a *Refusal.
func Decode(raw []byte, body *string) (*Manifest, error) {
	m, err := decode(raw, body)
	if err != nil {
		var r *Refusal
		if errors.As(err, &r) && m != nil {
			r.ID = m.ID
		}
		return nil, err
	}
	return m, nil
}

// decode returns the partial manifest with its ID (once valid) alongside a
// refusal, so Decode can attach the ID.
func decode(raw []byte, body *string) (*Manifest, error) {
	if len(raw) > MaxManifestBytes {
		return nil, refuse("manifest exceeds %d bytes", MaxManifestBytes)
	}
	if !utf8.Valid(raw) {
		return nil, refuse("manifest is not valid UTF-8")
	}
	if body != nil {
		if len(*body) > MaxTextBytes {
			return nil, refuse("request body exceeds %d bytes", MaxTextBytes)
		}
		if !utf8.ValidString(*body) {
			return nil, refuse("request body is not valid UTF-8")
		}
	}
	o, err := parseObject(raw, "")
	if errors.Is(err, errNotObject) {
		return nil, refuse("manifest must be a JSON object")
	}
	if err != nil {
		return nil, err
	}

	m := &Manifest{}
	id, err := o.reqStr("id")
	if err != nil {
		return nil, err
	}
	if !IDPattern.MatchString(id) {
		return nil, refuse("`id` must match ^[a-z0-9][a-z0-9-]{0,63}$")
	}
	m.ID = id

	typ, err := o.reqStr("type")
	if err != nil {
		return m, err
	}
	m.Type = Type(typ)
	if !slices.Contains(Types, m.Type) {
		return m, refuse("unknown type `%s` (want spawn, message, import, update, restart, refresh, stop, destroy, rights or publish)", shown(typ))
	}

	if !o.present("version") {
		return m, refuse("`version` is required")
	}
	v, _, bad := o.integer("version", 2)
	switch {
	case m.Type == TypeSpawn && (bad || v < 1):
		return m, refuse("`version` must be 1 or 2 for spawn")
	case m.Type != TypeSpawn && (bad || v != 1):
		return m, refuse("`version` must be 1")
	}
	m.Version = int(v)

	d := &decoder{o: o, body: body}
	switch m.Type {
	case TypeSpawn:
		m.Spawn, err = d.spawn(m.Version)
	case TypeMessage:
		m.Message, err = d.message()
	case TypeImport:
		m.Import = &Import{}
		err = d.childOnly(&m.Import.Child)
	case TypeStop:
		m.Stop = &Stop{}
		err = d.childOnly(&m.Stop.Child)
	case TypeDestroy:
		m.Destroy, err = d.destroy()
	case TypeUpdate:
		m.Update, err = d.update()
	case TypeRestart:
		m.Restart, err = d.restart()
	case TypeRefresh:
		m.Refresh, err = d.refresh()
	case TypeRights:
		m.Rights, err = d.rights()
	case TypePublish:
		m.Publish, err = d.publish()
	}
	if err != nil {
		return m, err
	}
	if body != nil && !d.bodyUsed {
		return m, refuse("request body given but the manifest has no `prompt_file` or `body_file`")
	}
	return m, nil
}

// decoder carries what the per-type readers share.
type decoder struct {
	o        *object
	body     *string
	bodyUsed bool
}

func (d *decoder) allow(keys ...string) error {
	return d.o.allow(append(slices.Clone(envelopeKeys), keys...)...)
}

// text resolves inline text (key) or request-body text (key_file).
func (d *decoder) text(key, fileKey string) (text, file string, err error) {
	o := d.o
	inline, hasInline, err := o.str(key)
	if err != nil {
		return "", "", err
	}
	file, hasFile, err := o.str(fileKey)
	if err != nil {
		return "", "", err
	}
	switch {
	case hasInline && hasFile:
		return "", "", refuse("`%s` and `%s` are mutually exclusive", key, fileKey)
	case hasFile:
		if file == "" || len(file) > MaxFileNameLen || strings.ContainsFunc(file, unsafeInLine) {
			return "", "", refuse("`%s` must be a file name of 1 to %d bytes", fileKey, MaxFileNameLen)
		}
		if d.body == nil {
			return "", "", refuse("`%s` needs the text as the request body", fileKey)
		}
		d.bodyUsed = true
		text = *d.body
	case hasInline:
		text = inline
	default:
		return "", "", refuse("`%s` or `%s` is required", key, fileKey)
	}
	if len(text) > MaxTextBytes {
		return "", "", refuse("`%s` text exceeds %d bytes", key, MaxTextBytes)
	}
	if strings.TrimSpace(text) == "" {
		return "", "", refuse("`%s` text is empty", key)
	}
	return text, file, nil
}

// shortName reads a child short name field.
func (d *decoder) shortName(key string, required bool) (string, error) {
	s, ok, err := d.o.str(key)
	if err != nil {
		return "", err
	}
	if !ok {
		if required {
			return "", refuse("`%s` is required", key)
		}
		return "", nil
	}
	if !shortname.Valid(s) {
		return "", refuse("`%s` must be a child's short name ([a-z0-9][a-z0-9-]{0,62})", key)
	}
	return s, nil
}

func (d *decoder) childOnly(child *string) (err error) {
	if err := d.allow("child"); err != nil {
		return err
	}
	*child, err = d.shortName("child", true)
	return err
}

func (d *decoder) destroy() (*Destroy, error) {
	if err := d.allow("child", "force"); err != nil {
		return nil, err
	}
	var x Destroy
	var err error
	if x.Child, err = d.shortName("child", true); err != nil {
		return nil, err
	}
	if x.Force, err = d.o.boolean("force"); err != nil {
		return nil, err
	}
	return &x, nil
}

func (d *decoder) message() (*Message, error) {
	if err := d.allow("to", "body", "body_file", "kind", "in_reply_to"); err != nil {
		return nil, err
	}
	var x Message
	var err error
	if x.To, err = d.shortName("to", false); err != nil {
		return nil, err
	}
	if x.Body, x.BodyFile, err = d.text("body", "body_file"); err != nil {
		return nil, err
	}
	kind, ok, err := d.o.str("kind")
	if err != nil {
		return nil, err
	}
	switch {
	case !ok:
		x.Kind = MsgNote
	case kind == MsgNote, kind == MsgQuestion, kind == MsgDone, kind == MsgBlocked:
		x.Kind = kind
	case kind == MsgIdle:
		return nil, refuse("kind `idle` is host-only and cannot be sent")
	default:
		return nil, refuse("`kind` must be note, question, done or blocked")
	}
	reply, ok, err := d.o.str("in_reply_to")
	if err != nil {
		return nil, refuse("`in_reply_to` must be a message id or null")
	}
	if ok {
		if !IDPattern.MatchString(reply) {
			return nil, refuse("`in_reply_to` must be a message id (h-<hex> or a manifest id)")
		}
		x.InReplyTo = &reply
	}
	return &x, nil
}

// branchName checks a branch (or base) name: git's ref-name rules that a
// user can hit, bounded, and nothing a terminal would not show as it is:
// no control or format character (a bidi override reverses what follows
// in the host's `jailbee ls`).
func branchName(key, b string) error {
	bad := b == "" || len(b) > MaxBranchLen || b == "@" ||
		strings.HasPrefix(b, "-") || strings.HasPrefix(b, "/") ||
		strings.HasSuffix(b, "/") || strings.HasSuffix(b, ".") || strings.HasSuffix(b, ".lock") ||
		strings.Contains(b, "..") || strings.Contains(b, "//") || strings.Contains(b, "@{") ||
		strings.Contains(b, "/.") || strings.HasPrefix(b, ".") ||
		strings.ContainsFunc(b, func(r rune) bool {
			return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.IsSpace(r) || strings.ContainsRune("~^:?*[\\", r)
		})
	if bad {
		return refuse("`%s` is not a valid branch name", key)
	}
	return nil
}

var commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// explicitRef checks spawn's and update's explicit ref: a full refs/ name
// or a 40-hex commit.
func explicitRef(r string) error {
	if commitRE.MatchString(r) {
		return nil
	}
	if len(r) <= len("refs/") || len(r) > MaxRefLen || !strings.HasPrefix(r, "refs/") || branchName("ref", r) != nil {
		return refuse("`ref` must be a full refs/ name (refs/heads/<name> for a local branch) or a 40-hex commit")
	}
	return nil
}

// services reads a services list: at most MaxServices names, each valid,
// duplicates removed in order; nil when absent or null.
func (d *decoder) services() ([]string, error) {
	list, err := d.o.strList("services")
	if err != nil || list == nil {
		return list, err
	}
	if len(list) > MaxServices {
		return nil, refuse("`services` has more than %d names", MaxServices)
	}
	out := make([]string, 0, len(list))
	for _, s := range list {
		if !config.ValidServiceName(s) {
			return nil, refuse("`services` has an invalid service name (want [a-z0-9][a-z0-9_-]{0,63})")
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

func (d *decoder) autostartProfile() (string, error) {
	p, ok, err := d.o.str("autostart_profile")
	if err != nil || !ok {
		return "", err
	}
	if !config.ValidAutostartProfileName(p) {
		return "", refuse("`autostart_profile` must match [a-z0-9][a-z0-9_-]{0,63}")
	}
	return p, nil
}

func (d *decoder) onDone() (string, error) {
	v, ok, err := d.o.str("on_done")
	if err != nil || !ok {
		return "", err
	}
	if v != OnDoneDestroy && v != OnDoneKeep {
		return "", refuse("`on_done` must be destroy or keep")
	}
	return v, nil
}

// runner reads a runner object; nil when absent or null.
func (d *decoder) runner() (*grant.Runner, error) {
	ro, err := d.o.child("runner")
	if err != nil || ro == nil {
		return nil, err
	}
	if err := ro.allow("agent", "profile", "model"); err != nil {
		return nil, err
	}
	var r grant.Runner
	if r.Agent, err = ro.reqStr("agent"); err != nil {
		return nil, err
	}
	if r.Profile, _, err = ro.str("profile"); err != nil {
		return nil, err
	}
	if r.Model, _, err = ro.str("model"); err != nil {
		return nil, err
	}
	if err := r.Check("runner"); err != nil {
		return nil, refuse("%s", err.Error())
	}
	return &r, nil
}

// rightsSet reads a {mounts, loose, egress} block (plus extra keys the
// caller handles); lists are deduplicated in order and nil when empty.
func rightsSet(o *object, extra ...string) (grant.Rights, error) {
	var r grant.Rights
	if err := o.allow(append([]string{"mounts", "loose", "egress"}, extra...)...); err != nil {
		return r, err
	}
	var err error
	if r.Mounts, err = o.strList("mounts"); err != nil {
		return r, err
	}
	if r.Loose, err = o.boolean("loose"); err != nil {
		return r, err
	}
	if r.Egress, err = o.strList("egress"); err != nil {
		return r, err
	}
	if err := r.CheckSyntax(o.path); err != nil {
		return r, refuse("%s", err.Error())
	}
	r.Mounts, r.Egress = grant.Dedupe(r.Mounts), grant.Dedupe(r.Egress)
	return r, nil
}

func (d *decoder) spawn(version int) (*Spawn, error) {
	if err := d.allow("kind", "branch", "base", "ref", "pr", "warm_paths", "prompt", "prompt_file",
		"rights", "note", "on_done", "runner", "autostart_profile", "services"); err != nil {
		return nil, err
	}
	o := d.o
	if version == 1 {
		for _, k := range []string{"ref", "pr", "warm_paths"} {
			if o.has(k) {
				return nil, refuse("`%s` needs spawn version 2", k)
			}
		}
	}
	var x Spawn
	var err error
	if x.Kind, err = o.reqStr("kind"); err != nil {
		return nil, err
	}
	switch x.Kind {
	case KindFork, KindNew:
	case KindPR:
		if version == 1 {
			return nil, refuse("kind `pr` needs spawn version 2")
		}
	default:
		return nil, refuse("`kind` must be fork, new or pr")
	}

	branch, hasBranch, err := o.str("branch")
	if err != nil {
		return nil, err
	}
	switch {
	case !hasBranch && x.Kind != KindPR:
		return nil, refuse("`branch` is required")
	case hasBranch:
		if err := branchName("branch", branch); err != nil {
			return nil, err
		}
		if name := shortname.FromBranch(branch); !shortname.Valid(name) {
			return nil, refuse("`branch` gives the short name `%s`, which cannot name a child (want [a-z0-9][a-z0-9-]{0,62})", shown(name))
		}
		x.Branch = branch
	}

	if base, ok, err := o.str("base"); err != nil {
		return nil, err
	} else if ok {
		if x.Kind != KindNew {
			return nil, refuse("`base` is only valid with kind `new`")
		}
		if err := branchName("base", base); err != nil {
			return nil, err
		}
		x.Base = base
	}
	if ref, ok, err := o.str("ref"); err != nil {
		return nil, err
	} else if ok {
		if x.Kind != KindFork {
			return nil, refuse("`ref` is only valid with kind `fork`")
		}
		if err := explicitRef(ref); err != nil {
			return nil, err
		}
		x.Ref = ref
	}
	pr, hasPR, bad := o.integer("pr", MaxPR)
	switch {
	case hasPR && x.Kind != KindPR, bad && x.Kind != KindPR:
		return nil, refuse("`pr` is only valid with kind `pr`")
	case x.Kind == KindPR && (bad || !hasPR || pr == 0):
		return nil, refuse("kind `pr` needs `pr`: a positive integer")
	}
	x.PR = int(pr)
	if x.WarmPaths, err = o.strList("warm_paths"); err != nil {
		return nil, err
	}
	if x.WarmPaths != nil {
		if x.Kind != KindFork {
			return nil, refuse("`warm_paths` is only valid with kind `fork`")
		}
		if len(x.WarmPaths) > config.MaxWarmPaths {
			return nil, refuse("`warm_paths` has more than %d globs", config.MaxWarmPaths)
		}
		for _, g := range x.WarmPaths {
			if err := config.CheckWarmPath(g); err != nil {
				return nil, refuse("`warm_paths`: %s", err.Error())
			}
		}
	}

	if x.Prompt, x.PromptFile, err = d.text("prompt", "prompt_file"); err != nil {
		return nil, err
	}
	if ro, err := o.child("rights"); err != nil {
		return nil, err
	} else if ro != nil {
		if x.Rights, err = rightsSet(ro); err != nil {
			return nil, err
		}
	}
	if note, ok, err := o.str("note"); err != nil {
		return nil, err
	} else if ok {
		if len(note) > MaxNoteBytes {
			return nil, refuse("`note` exceeds %d bytes", MaxNoteBytes)
		}
		x.Note = note
	}
	if x.OnDone, err = d.onDone(); err != nil {
		return nil, err
	}
	if x.Runner, err = d.runner(); err != nil {
		return nil, err
	}
	if x.AutostartProfile, err = d.autostartProfile(); err != nil {
		return nil, err
	}
	if x.Services, err = d.services(); err != nil {
		return nil, err
	}
	return &x, nil
}

func (d *decoder) update() (*Update, error) {
	if err := d.allow("child", "ref", "base", "merge"); err != nil {
		return nil, err
	}
	o := d.o
	var x Update
	var err error
	if x.Child, err = d.shortName("child", true); err != nil {
		return nil, err
	}
	ref, hasRef, err := o.str("ref")
	if err != nil {
		return nil, err
	}
	base, hasBase, err := o.str("base")
	if err != nil {
		return nil, err
	}
	if hasRef && hasBase {
		return nil, refuse("`ref` and `base` are mutually exclusive")
	}
	if hasRef {
		if err := explicitRef(ref); err != nil {
			return nil, err
		}
		x.Ref = ref
	}
	if hasBase {
		if err := branchName("base", base); err != nil {
			return nil, err
		}
		x.Base = base
	}
	if x.Merge, err = o.boolean("merge"); err != nil {
		return nil, err
	}
	return &x, nil
}

func (d *decoder) restart() (*Restart, error) {
	if err := d.allow("child", "prompt", "prompt_file", "runner", "on_done", "agent_only",
		"autostart_profile", "services"); err != nil {
		return nil, err
	}
	var x Restart
	var err error
	if x.Child, err = d.shortName("child", true); err != nil {
		return nil, err
	}
	if x.Prompt, x.PromptFile, err = d.text("prompt", "prompt_file"); err != nil {
		return nil, err
	}
	x.Runner.Set = d.o.has("runner")
	if x.Runner.Runner, err = d.runner(); err != nil {
		return nil, err
	}
	if x.OnDone, err = d.onDone(); err != nil {
		return nil, err
	}
	if x.AgentOnly, err = d.o.boolean("agent_only"); err != nil {
		return nil, err
	}
	if x.AutostartProfile, err = d.autostartProfile(); err != nil {
		return nil, err
	}
	if x.Services, err = d.services(); err != nil {
		return nil, err
	}
	if x.AgentOnly && d.o.present("autostart_profile") {
		return nil, refuse("`autostart_profile` cannot be combined with `agent_only`")
	}
	if x.AgentOnly && x.Services != nil {
		return nil, refuse("`services` cannot be combined with `agent_only`")
	}
	return &x, nil
}

func (d *decoder) refresh() (*Refresh, error) {
	if err := d.allow("child", "services", "force"); err != nil {
		return nil, err
	}
	var x Refresh
	var err error
	if x.Child, err = d.shortName("child", true); err != nil {
		return nil, err
	}
	if x.Services, err = d.services(); err != nil {
		return nil, err
	}
	if len(x.Services) == 0 {
		return nil, refuse("`services` needs 1 to %d service names", MaxServices)
	}
	if x.Force, err = d.o.boolean("force"); err != nil {
		return nil, err
	}
	return &x, nil
}

func (d *decoder) rights() (*Rights, error) {
	if err := d.allow("child", "grant", "revoke"); err != nil {
		return nil, err
	}
	o := d.o
	var x Rights
	var err error
	if x.Child, err = d.shortName("child", false); err != nil {
		return nil, err
	}
	x.GrantNull = o.null("grant")
	if g, err := o.child("grant"); err != nil {
		return nil, err
	} else if g != nil {
		items, err := rightsSet(g, "for")
		if err != nil {
			return nil, err
		}
		x.Grant = &RightsGrant{Items: items}
		if f, ok, err := g.str("for"); err != nil {
			return nil, err
		} else if ok {
			ttl, never, err := grant.ParseTTL(f)
			if err != nil {
				return nil, refuse("%s", err.Error())
			}
			x.Grant.For, x.Grant.TTL, x.Grant.Never = f, ttl, never
		}
	}
	if r, err := o.child("revoke"); err != nil {
		return nil, err
	} else if r != nil {
		items, err := rightsSet(r)
		if err != nil {
			return nil, err
		}
		x.Revoke = &items
	}

	var granted, revoked grant.Rights
	if x.Grant != nil {
		granted = x.Grant.Items
	}
	if x.Revoke != nil {
		revoked = *x.Revoke
	}
	if granted.Empty() && revoked.Empty() {
		return nil, refuse("rights needs at least one item to grant or revoke")
	}
	if granted.Loose && revoked.Loose {
		return nil, refuse("`loose` cannot be both granted and revoked")
	}
	for _, m := range granted.Mounts {
		if slices.Contains(revoked.Mounts, m) {
			return nil, refuse("mount `%s` cannot be both granted and revoked", m)
		}
	}
	for _, h := range granted.Egress {
		if slices.Contains(revoked.Egress, h) {
			return nil, refuse("egress `%s` cannot be both granted and revoked", h)
		}
	}
	return &x, nil
}

var publishNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.json$`)

// ValidPublishName reports whether name may name an outbox manifest: a
// file name matching the spec's pattern, never a path or .progress.json.
func ValidPublishName(name string) bool {
	return publishNameRE.MatchString(name) && !strings.HasSuffix(name, ".progress.json")
}

func (d *decoder) publish() (*Publish, error) {
	if err := d.allow("outbox", "manifest"); err != nil {
		return nil, err
	}
	var x Publish
	var err error
	if x.Outbox, err = d.o.reqStr("outbox"); err != nil {
		return nil, err
	}
	if x.Outbox != OutboxIssue && x.Outbox != OutboxPR {
		return nil, refuse("`outbox` must be issue or pr")
	}
	if x.Manifest, err = d.o.reqStr("manifest"); err != nil {
		return nil, err
	}
	if !ValidPublishName(x.Manifest) {
		return nil, refuse("`manifest` must be a file name matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\\.json$, never a path or .progress.json")
	}
	return &x, nil
}
