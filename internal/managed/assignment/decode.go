package assignment

import (
	"math"
	"time"
)

// Decode reads an assignment strictly: one JSON object, valid UTF-8, at most
// MaxAssignmentBytes, no duplicate key and no unknown field at any level,
// every member of its JSON type. It checks types and shapes only; Validate
// applies the rules. Errors never echo a value.
func Decode(data []byte) (*Assignment, error) {
	root, err := parseJSON(data)
	if err != nil {
		return nil, err
	}
	o, err := asObject(root, "")
	if err != nil {
		return nil, Errorf("", "document must be a JSON object")
	}
	a := &Assignment{}

	// The version first, so a document of another version is refused as
	// such rather than for a field that version might define.
	if a.Version, _, err = o.str("version", true); err != nil {
		return nil, err
	}
	if a.Version != Version1 && a.Version != Version2 && a.Version != Version3 {
		return nil, Errorf("version", "unsupported version; this runtime accepts \"1\", \"2\" and \"3\" (as strings)")
	}
	if a.RunID, _, err = o.str("run_id", true); err != nil {
		return nil, err
	}
	if a.LeaseID, _, err = o.str("lease_id", true); err != nil {
		return nil, err
	}
	if a.OuterRuntimeID, _, err = o.str("outer_runtime_id", true); err != nil {
		return nil, err
	}
	if a.Workspace, _, err = o.str("workspace", true); err != nil {
		return nil, err
	}
	if a.WorkspaceFolder, _, err = o.str("workspace_folder", false); err != nil {
		return nil, err
	}
	if omitted, ok, err := o.strArray("omitted_services"); err != nil {
		return nil, err
	} else if ok {
		a.OmittedServices = append(make([]string, 0, len(omitted)), omitted...)
	}
	repo, err := o.child("repository", true)
	if err != nil {
		return nil, err
	}
	if a.Repository.Path, _, err = repo.str("path", true); err != nil {
		return nil, err
	}
	if a.Repository.Revision, _, err = repo.str("revision", true); err != nil {
		return nil, err
	}
	if err := repo.unknown(); err != nil {
		return nil, err
	}
	if a.TaskBranch, _, err = o.str("task_branch", true); err != nil {
		return nil, err
	}
	if a.TunnelPlacement, _, err = o.str("tunnel_placement", true); err != nil {
		return nil, err
	}
	if err := decodePorts(o, a); err != nil {
		return nil, err
	}
	if err := decodeServiceImages(o, a); err != nil {
		return nil, err
	}
	if a.PortProxyImage, _, err = o.str("port_proxy_image", false); err != nil {
		return nil, err
	}
	wc, err := o.child("workspace_consumer", false)
	if err != nil {
		return nil, err
	}
	if wc != nil {
		uid, _, err := wc.uint("uid", true, MaxUID)
		if err != nil {
			return nil, err
		}
		gid, _, err := wc.uint("gid", true, MaxUID)
		if err != nil {
			return nil, err
		}
		if err := wc.unknown(); err != nil {
			return nil, err
		}
		a.WorkspaceConsumer = &Identity{UID: uint32(uid), GID: uint32(gid)}
	}
	leases, _, err := o.array("leases")
	if err != nil {
		return nil, err
	}
	if len(leases) > MaxLeases {
		return nil, Errorf("leases", "holds more than %d leases", MaxLeases)
	}
	for i, ln := range leases {
		l, err := decodeLease(ln, LeaseField(i))
		if err != nil {
			return nil, err
		}
		a.Leases = append(a.Leases, *l)
	}
	if err := o.unknown(); err != nil {
		return nil, err
	}
	return a, nil
}

func decodePorts(o *object, a *Assignment) error {
	ports, _, err := o.array("published_ports")
	if err != nil {
		return err
	}
	if len(ports) > MaxPublishedPorts {
		return Errorf("published_ports", "holds more than %d ports", MaxPublishedPorts)
	}
	for i, pn := range ports {
		p := index("published_ports", i)
		po, err := asObject(pn, p)
		if err != nil {
			return err
		}
		host, _, err := po.uint("host", true, math.MaxUint16)
		if err != nil {
			return err
		}
		runtime, _, err := po.uint("runtime", true, math.MaxUint16)
		if err != nil {
			return err
		}
		if err := po.unknown(); err != nil {
			return err
		}
		a.PublishedPorts = append(a.PublishedPorts, Port{Host: uint16(host), Runtime: uint16(runtime)})
	}
	return nil
}

func decodeServiceImages(o *object, a *Assignment) error {
	si, err := o.child("service_images", false)
	if err != nil {
		return err
	}
	if si == nil {
		return nil
	}
	if len(si.n.obj) > MaxServiceImages {
		return Errorf("service_images", "binds more than %d services", MaxServiceImages)
	}
	a.ServiceImages = make(map[string]string, len(si.n.obj))
	for i, m := range si.n.obj {
		si.used[i] = true
		// Duplicate keys were refused by the parser; names are checked by
		// Validate before any message names them.
		if m.val.kind != kindString {
			return Errorf("service_images", "entry %d must be a string image reference, not %s", i+1, m.val.kind)
		}
		a.ServiceImages[m.key] = m.val.str
	}
	return nil
}

func decodeLease(n *jsonNode, p string) (*Lease, error) {
	o, err := asObject(n, p)
	if err != nil {
		return nil, err
	}
	l := &Lease{}
	if l.LeaseID, _, err = o.str("lease_id", true); err != nil {
		return nil, err
	}
	scope, _, err := o.str("scope", true)
	if err != nil {
		return nil, err
	}
	if !knownScope(scope) {
		return nil, Errorf(field(p, "scope"), "unknown scope; the scopes are model-identity, source-control-identity, project-environment, provider-environment, shared-directory, tool-endpoint, tool-request, platform-tunnel and provider-credential")
	}
	l.Scope = Scope(scope)
	if l.Consumer, _, err = o.str("consumer", true); err != nil {
		return nil, err
	}
	if l.Executable, _, err = o.str("executable", false); err != nil {
		return nil, err
	}
	if inh, ok, err := o.strArray("inherited_environment"); err != nil {
		return nil, err
	} else if ok {
		l.InheritedEnvironment = inh
	}
	if exp, ok, err := o.str("expires_at", false); err != nil {
		return nil, err
	} else if ok {
		t, err := time.Parse(time.RFC3339, exp)
		if err != nil {
			return nil, Errorf(field(p, "expires_at"), "must be an RFC 3339 timestamp such as 2006-01-02T15:04:05Z")
		}
		t = t.UTC()
		l.ExpiresAt = &t
	}
	uid, hasUID, err := o.uint("consumer_uid", false, MaxUID)
	if err != nil {
		return nil, err
	}
	if hasUID {
		if uid == 0 {
			return nil, Errorf(field(p, "consumer_uid"), "must be a non-root uid (1-%d)", MaxUID)
		}
		l.ConsumerUID = uint32(uid)
	}
	if l.EndpointLeaseID, _, err = o.str("endpoint_lease_id", false); err != nil {
		return nil, err
	}
	if l.RequestSpoolTarget, _, err = o.str("request_spool_target", false); err != nil {
		return nil, err
	}
	if l.ReplayPolicy, _, err = o.str("replay_policy", false); err != nil {
		return nil, err
	}
	mats, _, err := o.array("materializations")
	if err != nil {
		return nil, err
	}
	for j, mn := range mats {
		mp := index(field(p, "materializations"), j)
		mo, err := asObject(mn, mp)
		if err != nil {
			return nil, err
		}
		m := Materialization{Field: mp}
		if m.SourcePath, _, err = mo.str("source_path", true); err != nil {
			return nil, err
		}
		if m.TargetPath, _, err = mo.str("target_path", false); err != nil {
			return nil, err
		}
		if m.EnvironmentName, _, err = mo.str("environment_name", false); err != nil {
			return nil, err
		}
		if m.SHA256, _, err = mo.str("sha256", false); err != nil {
			return nil, err
		}
		if err := mo.unknown(); err != nil {
			return nil, err
		}
		l.Materializations = append(l.Materializations, m)
	}
	if err := o.unknown(); err != nil {
		return nil, err
	}
	return l, nil
}
