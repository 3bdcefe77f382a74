package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
)

// Encode returns the manifest as a canonical request: compact JSON with
// sorted keys and, when the text came from the request body (PromptFile or
// BodyFile set), that text as body (nil otherwise). Decode(Encode()) yields
// a value equal to m. Defaults are written out (message kind, rights lists).
func (m *Manifest) Encode() (raw []byte, body *string, err error) {
	obj := map[string]any{"version": m.Version, "id": m.ID, "type": string(m.Type)}
	put := func(k string, v string) {
		if v != "" {
			obj[k] = v
		}
	}
	text := func(key, fileKey, text, file string) {
		if file != "" {
			obj[fileKey] = file
			t := text
			body = &t
			return
		}
		obj[key] = text
	}
	switch m.Type {
	case TypeSpawn:
		s := m.Spawn
		if s == nil {
			return nil, nil, errors.New("manifest: spawn without Spawn")
		}
		obj["kind"] = s.Kind
		put("branch", s.Branch)
		put("base", s.Base)
		put("ref", s.Ref)
		if s.PR != 0 {
			obj["pr"] = s.PR
		}
		if s.WarmPaths != nil {
			obj["warm_paths"] = s.WarmPaths
		}
		text("prompt", "prompt_file", s.Prompt, s.PromptFile)
		obj["rights"] = s.Rights
		put("note", s.Note)
		put("on_done", s.OnDone)
		if s.Runner != nil {
			obj["runner"] = s.Runner
		}
		put("autostart_profile", s.AutostartProfile)
		if s.Services != nil {
			obj["services"] = s.Services
		}
	case TypeMessage:
		x := m.Message
		if x == nil {
			return nil, nil, errors.New("manifest: message without Message")
		}
		put("to", x.To)
		text("body", "body_file", x.Body, x.BodyFile)
		obj["kind"] = x.Kind
		if x.InReplyTo != nil {
			obj["in_reply_to"] = *x.InReplyTo
		} else {
			obj["in_reply_to"] = nil
		}
	case TypeImport:
		if m.Import == nil {
			return nil, nil, errors.New("manifest: import without Import")
		}
		obj["child"] = m.Import.Child
	case TypeStop:
		if m.Stop == nil {
			return nil, nil, errors.New("manifest: stop without Stop")
		}
		obj["child"] = m.Stop.Child
	case TypeDestroy:
		if m.Destroy == nil {
			return nil, nil, errors.New("manifest: destroy without Destroy")
		}
		obj["child"] = m.Destroy.Child
		obj["force"] = m.Destroy.Force
	case TypeUpdate:
		x := m.Update
		if x == nil {
			return nil, nil, errors.New("manifest: update without Update")
		}
		obj["child"] = x.Child
		put("ref", x.Ref)
		put("base", x.Base)
		if x.Merge {
			obj["merge"] = true
		}
	case TypeRestart:
		x := m.Restart
		if x == nil {
			return nil, nil, errors.New("manifest: restart without Restart")
		}
		obj["child"] = x.Child
		text("prompt", "prompt_file", x.Prompt, x.PromptFile)
		if x.Runner.Set {
			obj["runner"] = x.Runner.Runner // nil encodes as null
		}
		put("on_done", x.OnDone)
		if x.AgentOnly {
			obj["agent_only"] = true
		}
		put("autostart_profile", x.AutostartProfile)
		if x.Services != nil {
			obj["services"] = x.Services
		}
	case TypeRefresh:
		x := m.Refresh
		if x == nil {
			return nil, nil, errors.New("manifest: refresh without Refresh")
		}
		obj["child"] = x.Child
		obj["services"] = x.Services
		obj["force"] = x.Force
	case TypeRights:
		x := m.Rights
		if x == nil {
			return nil, nil, errors.New("manifest: rights without Rights")
		}
		put("child", x.Child)
		switch {
		case x.Grant != nil:
			g := map[string]any{"mounts": nonNil(x.Grant.Items.Mounts), "loose": x.Grant.Items.Loose, "egress": nonNil(x.Grant.Items.Egress)}
			if x.Grant.For != "" {
				g["for"] = x.Grant.For
			}
			obj["grant"] = g
		case x.GrantNull:
			obj["grant"] = nil
		}
		if x.Revoke != nil {
			obj["revoke"] = *x.Revoke
		}
	case TypePublish:
		if m.Publish == nil {
			return nil, nil, errors.New("manifest: publish without Publish")
		}
		obj["outbox"] = m.Publish.Outbox
		obj["manifest"] = m.Publish.Manifest
	default:
		return nil, nil, errors.New("manifest: unknown type")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return nil, nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), body, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
