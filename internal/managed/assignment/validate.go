package assignment

import (
	"path"
	"sort"
	"strings"
	"time"
)

// Options are the inputs of validation that do not come from the document.
type Options struct {
	// Now is the time expiries are compared with. Required.
	Now time.Time
	// ManagedRoot is the directory holding one directory per run; ""
	// means DefaultManagedRoot. It must be absolute and clean.
	ManagedRoot string
	// Runtime is the runtime's own effective uid and gid, when known. A
	// version 3 workspace consumer must differ from both.
	Runtime *Identity
}

// Parse decodes and validates an assignment: bytes in, a validated
// *Assignment or an *Error out.
func Parse(data []byte, opts Options) (*Assignment, error) {
	a, err := Decode(data)
	if err != nil {
		return nil, err
	}
	if err := a.Validate(opts); err != nil {
		return nil, err
	}
	return a, nil
}

// Validate applies every document rule of the version to a decoded
// assignment, fills RunDir, each lease's State and each materialization's
// Kind. It stops at the first broken rule.
func (a *Assignment) Validate(opts Options) error {
	if opts.Now.IsZero() {
		return Errorf("", "validation needs the current time")
	}
	root := opts.ManagedRoot
	if root == "" {
		root = DefaultManagedRoot
	}
	if !isAbsClean(root) || root == "/" {
		return Errorf("", "the managed root must be an absolute, clean path below /")
	}
	v := &validator{a: a, opts: opts}
	for _, step := range []func() error{
		func() error { return v.identity(root) },
		v.ports,
		v.images,
		v.workspaceConsumer,
		v.workspaceFolder,
		v.leases,
		v.toolRequests,
		v.consumers,
		v.overlaps,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

type validator struct {
	a    *Assignment
	opts Options
}

func (v *validator) managed() bool { return v.a.Version != Version1 }

func (v *validator) identity(root string) error {
	a := v.a
	for _, f := range []struct{ name, val string }{
		{"run_id", a.RunID}, {"lease_id", a.LeaseID}, {"outer_runtime_id", a.OuterRuntimeID},
	} {
		if r := opaqueIDReason(f.val); r != "" {
			return Errorf(f.name, "%s", r)
		}
	}
	a.RunDir = root + "/" + a.RunID
	if len(a.RunDir) > MaxPathBytes {
		return Errorf("run_id", "the run directory path is longer than %d bytes", MaxPathBytes)
	}
	if !isAbsClean(a.Workspace) {
		return Errorf("workspace", "must be an absolute, clean path")
	}
	if !isAbsClean(a.Repository.Path) {
		return Errorf("repository.path", "must be an absolute, clean path")
	}
	if !within(a.Repository.Path, a.Workspace) {
		return Errorf("repository.path", "must be the workspace or a path below it")
	}
	if r := revisionReason(a.Repository.Revision); r != "" {
		return Errorf("repository.revision", "%s", r)
	}
	if r := taskBranchReason(a.TaskBranch); r != "" {
		return Errorf("task_branch", "%s", r)
	}
	if a.TunnelPlacement != TunnelPlacementOuter {
		return Errorf("tunnel_placement", "must be \"outer\": tunnels stay outside the runtime")
	}
	return nil
}

func (v *validator) ports() error {
	hosts := map[uint16]bool{}
	runtimes := map[uint16]bool{}
	for i, p := range v.a.PublishedPorts {
		f := index("published_ports", i)
		if p.Host == 0 {
			return Errorf(field(f, "host"), "must be a port from 1 to 65535")
		}
		if p.Runtime == 0 {
			return Errorf(field(f, "runtime"), "must be a port from 1 to 65535")
		}
		if hosts[p.Host] {
			return Errorf(field(f, "host"), "host ports must be unique")
		}
		if runtimes[p.Runtime] {
			return Errorf(field(f, "runtime"), "runtime ports must be unique")
		}
		hosts[p.Host], runtimes[p.Runtime] = true, true
	}
	return nil
}

func (v *validator) images() error {
	a := v.a
	if len(a.ServiceImages) > 0 {
		if !v.managed() {
			return Errorf("service_images", "preloaded service images need version \"2\" or \"3\"")
		}
		names := make([]string, 0, len(a.ServiceImages))
		for name := range a.ServiceImages {
			names = append(names, name)
		}
		sort.Strings(names)
		for i, name := range names {
			if r := composeServiceNameReason(name, MaxServiceNameBytes); r != "" {
				return Errorf("service_images", "entry %d (in name order): %s", i+1, r)
			}
			if r := ImageReferenceReason(a.ServiceImages[name]); r != "" {
				// The name passed its syntax check; it is not a value.
				return Errorf("service_images."+name, "%s", r)
			}
		}
	}
	if len(a.ServiceImages) > 0 && len(a.PublishedPorts) > 0 && a.PortProxyImage == "" {
		return Errorf("port_proxy_image", "is required when preloaded service mode publishes ports")
	}
	if a.PortProxyImage != "" {
		if !v.managed() {
			return Errorf("port_proxy_image", "needs version \"2\" or \"3\"")
		}
		if r := ImageReferenceReason(a.PortProxyImage); r != "" {
			return Errorf("port_proxy_image", "%s", r)
		}
	}
	return nil
}

func (v *validator) workspaceConsumer() error {
	a := v.a
	c := a.WorkspaceConsumer
	if a.Version != Version3 {
		if c != nil {
			return Errorf("workspace_consumer", "needs version \"3\"")
		}
		return nil
	}
	if c == nil {
		return Errorf("workspace_consumer", "is required in version \"3\"")
	}
	if c.UID == 0 {
		return Errorf("workspace_consumer.uid", "must be a non-root uid (1-%d)", MaxUID)
	}
	if c.GID == 0 {
		return Errorf("workspace_consumer.gid", "must be a non-root gid (1-%d)", MaxUID)
	}
	if rt := v.opts.Runtime; rt != nil {
		if c.UID == rt.UID {
			return Errorf("workspace_consumer.uid", "must differ from the runtime's own uid %d", rt.UID)
		}
		if c.GID == rt.GID {
			return Errorf("workspace_consumer.gid", "must differ from the runtime's own gid %d", rt.GID)
		}
	}
	return nil
}

func (v *validator) workspaceFolder() error {
	a := v.a
	if a.WorkspaceFolder == "" {
		if a.OmittedServices != nil {
			return Errorf("omitted_services", "needs workspace_folder: the two come together")
		}
		return nil
	}
	if a.Version != Version3 || len(a.ServiceImages) == 0 {
		return Errorf("workspace_folder", "needs version \"3\" with preloaded service_images")
	}
	if a.OmittedServices == nil {
		return Errorf("omitted_services", "is required with workspace_folder (an empty list is allowed)")
	}
	if r := workspaceFolderReason(a.WorkspaceFolder); r != "" {
		return Errorf("workspace_folder", "%s", r)
	}
	if len(a.OmittedServices) > MaxOmittedServices {
		return Errorf("omitted_services", "holds more than %d names", MaxOmittedServices)
	}
	seen := map[string]bool{}
	for i, name := range a.OmittedServices {
		f := index("omitted_services", i)
		if r := composeServiceNameReason(name, MaxOmittedServiceBytes); r != "" {
			return Errorf(f, "%s", r)
		}
		if seen[name] {
			return Errorf(f, "names must be unique")
		}
		seen[name] = true
	}
	return nil
}

func workspaceFolderReason(folder string) string {
	if folder == ReservedWorkspaceFolder {
		return "is reserved for the main Git metadata mount"
	}
	if len(folder) > MaxWorkspaceFolderBytes {
		return "must be at most 200 bytes"
	}
	if !strictlyWithin(folder, WorkspacesRoot) || !isAbsClean(folder) {
		return "must be a clean path below /workspaces/"
	}
	segs := strings.Split(folder[len(WorkspacesRoot)+1:], "/")
	if len(segs) > MaxWorkspaceFolderSegments {
		return "must have 1-4 segments below /workspaces/"
	}
	for _, s := range segs {
		if composeServiceNameReason(s, MaxWorkspaceSegmentBytes) != "" {
			return "segments must be 1-64 characters, first a letter or digit, then A-Z, a-z, 0-9, '.', '_' or '-'"
		}
	}
	return ""
}

// requiresLiveExpiry reports whether a lease of the scope must carry an
// expiry in the future (reference: live managed bindings).
func (v *validator) requiresLiveExpiry(s Scope) bool {
	switch s {
	case ScopeModelIdentity:
		return v.managed()
	case ScopeProviderEnvironment, ScopeProviderCredential, ScopeSharedDirectory,
		ScopeToolEndpoint, ScopeToolRequest:
		return true
	}
	return false
}

func (v *validator) leases() error {
	a := v.a
	ids := map[string]bool{}
	modelConsumers := map[string]bool{}
	executables := map[string]bool{}
	envTargets := map[[2]string]bool{} // (consumer, name)
	providerBindings := 0
	projectEnv := false
	for i := range a.Leases {
		l := &a.Leases[i]
		lf := LeaseField(i)
		if r := opaqueIDReason(l.LeaseID); r != "" {
			return Errorf(field(lf, "lease_id"), "%s", r)
		}
		if ids[l.LeaseID] {
			return Errorf(field(lf, "lease_id"), "lease ids must be unique")
		}
		ids[l.LeaseID] = true
		if r := labelReason(l.Consumer); r != "" {
			return Errorf(field(lf, "consumer"), "%s", r)
		}
		if !v.managed() {
			switch l.Scope {
			case ScopeProviderEnvironment, ScopeSharedDirectory, ScopeToolEndpoint, ScopeToolRequest:
				return Errorf(field(lf, "scope"), "scope %s needs version \"2\" or \"3\"", l.Scope)
			}
			if l.Executable != "" {
				return Errorf(field(lf, "executable"), "needs version \"2\" or \"3\" (version 1 keeps its fixed provider allowlist)")
			}
			if len(l.InheritedEnvironment) > 0 {
				return Errorf(field(lf, "inherited_environment"), "needs version \"2\" or \"3\" (version 1 keeps its fixed provider allowlist)")
			}
		}
		if l.Scope != ScopeModelIdentity {
			if l.Executable != "" {
				return Errorf(field(lf, "executable"), "only model-identity leases name an executable")
			}
			if l.InheritedEnvironment != nil {
				return Errorf(field(lf, "inherited_environment"), "only model-identity leases inherit environment")
			}
		}
		if l.Scope != ScopeToolRequest {
			for _, f := range []struct {
				name string
				set  bool
			}{
				{"consumer_uid", l.ConsumerUID != 0},
				{"endpoint_lease_id", l.EndpointLeaseID != ""},
				{"request_spool_target", l.RequestSpoolTarget != ""},
				{"replay_policy", l.ReplayPolicy != ""},
			} {
				if f.set {
					return Errorf(field(lf, f.name), "only tool-request leases set this field")
				}
			}
		}
		if v.requiresLiveExpiry(l.Scope) {
			if l.ExpiresAt == nil {
				return Errorf(field(lf, "expires_at"), "is required for a %s lease", l.Scope)
			}
			if !l.Live(v.opts.Now) {
				return Errorf(field(lf, "expires_at"), "the lease has expired")
			}
		}

		switch l.Scope {
		case ScopeModelIdentity, ScopeSourceControlIdentity, ScopePlatformTunnel:
			if len(l.Materializations) > 0 {
				return Errorf(field(lf, "materializations"), "a %s lease stays outside: it has no materializations", l.Scope)
			}
		case ScopeProjectEnvironment:
			if projectEnv {
				return Errorf(field(lf, "scope"), "an assignment holds at most one project-environment lease")
			}
			projectEnv = true
			if len(l.Materializations) != 1 {
				return Errorf(field(lf, "materializations"), "a project-environment lease has exactly one materialization")
			}
		case ScopeProviderEnvironment:
			if len(l.Materializations) == 0 {
				return Errorf(field(lf, "materializations"), "a provider-environment lease has at least one materialization")
			}
			providerBindings += len(l.Materializations)
			if providerBindings > MaxProviderEnvironmentBindings {
				return Errorf(field(lf, "materializations"), "the assignment binds more than %d provider-environment values", MaxProviderEnvironmentBindings)
			}
		case ScopeProviderCredential, ScopeSharedDirectory, ScopeToolEndpoint, ScopeToolRequest:
			if len(l.Materializations) != 1 {
				return Errorf(field(lf, "materializations"), "a %s lease has exactly one materialization", l.Scope)
			}
		}

		if l.Scope == ScopeModelIdentity {
			if modelConsumers[l.Consumer] {
				return Errorf(field(lf, "consumer"), "a consumer has at most one model-identity lease")
			}
			modelConsumers[l.Consumer] = true
			if v.managed() {
				if l.Executable == "" {
					return Errorf(field(lf, "executable"), "is required for a model-identity lease in version \"2\" and \"3\"")
				}
				if r := executableReason(l.Executable); r != "" {
					return Errorf(field(lf, "executable"), "%s", r)
				}
				if executables[l.Executable] {
					return Errorf(field(lf, "executable"), "executables must be unique across model-identity leases")
				}
				executables[l.Executable] = true
			}
			if len(l.InheritedEnvironment) > MaxInheritedEnvironment {
				return Errorf(field(lf, "inherited_environment"), "holds more than %d names", MaxInheritedEnvironment)
			}
			for j, name := range l.InheritedEnvironment {
				f := index(field(lf, "inherited_environment"), j)
				if r := EnvironmentNameReason(name); r != "" {
					return Errorf(f, "%s", r)
				}
				if j > 0 && name <= l.InheritedEnvironment[j-1] {
					return Errorf(f, "names must be unique and in strictly ascending order")
				}
				// Whichever lease comes first: a provider-environment
				// value bound before this lease is caught here, one after
				// it in materialization.
				key := [2]string{l.Consumer, name}
				if envTargets[key] {
					return Errorf(f, "each environment name is bound at most once per consumer (inherited or provider-environment)")
				}
				envTargets[key] = true
			}
		}
		if l.Scope == ScopeToolRequest {
			if err := v.toolRequestFields(l, lf); err != nil {
				return err
			}
		}
		for j := range l.Materializations {
			if err := v.materialization(l, &l.Materializations[j], envTargets); err != nil {
				return err
			}
		}
		l.State = leaseState(l)
	}
	return nil
}

func leaseState(l *Lease) string {
	switch l.Scope {
	case ScopeProjectEnvironment:
		return StatePrimaryEnvFile
	case ScopeProviderEnvironment:
		return StateProviderEnv
	case ScopeSharedDirectory:
		return StatePrimaryReadOnlyDir
	case ScopeToolEndpoint:
		return StatePrimaryReadOnlyEndpoint // a trusted relay once linked
	case ScopeToolRequest:
		return StateConsumerRequestSpool
	}
	if len(l.Materializations) == 0 {
		return StateOuter
	}
	return StateMaterialized
}

func (v *validator) toolRequestFields(l *Lease, lf string) error {
	if l.ConsumerUID == 0 {
		return Errorf(field(lf, "consumer_uid"), "is required for a tool-request lease (a non-root uid)")
	}
	if wc := v.a.WorkspaceConsumer; wc != nil && l.ConsumerUID != wc.UID {
		return Errorf(field(lf, "consumer_uid"), "must equal workspace_consumer.uid")
	}
	if l.EndpointLeaseID == "" {
		return Errorf(field(lf, "endpoint_lease_id"), "is required for a tool-request lease")
	}
	if r := opaqueIDReason(l.EndpointLeaseID); r != "" {
		return Errorf(field(lf, "endpoint_lease_id"), "%s", r)
	}
	if l.RequestSpoolTarget == "" {
		return Errorf(field(lf, "request_spool_target"), "is required for a tool-request lease")
	}
	if !isAbsClean(l.RequestSpoolTarget) || !strictlyWithin(l.RequestSpoolTarget, ToolRequestTargetRoot) {
		return Errorf(field(lf, "request_spool_target"), "must be a clean path strictly below %s", ToolRequestTargetRoot)
	}
	if ambientReference(l.RequestSpoolTarget) {
		return Errorf(field(lf, "request_spool_target"), "must not name supervisor authority or an ambient secret path")
	}
	if l.ReplayPolicy != "" && l.ReplayPolicy != ReplayPolicyExactDigest {
		return Errorf(field(lf, "replay_policy"), "the only replay policy is %q", ReplayPolicyExactDigest)
	}
	return nil
}

func (v *validator) materialization(l *Lease, m *Materialization, envTargets map[[2]string]bool) error {
	mf := m.Field
	a := v.a
	if !isAbsClean(m.SourcePath) {
		return Errorf(field(mf, "source_path"), "must be an absolute, clean path")
	}
	if ambientReference(m.SourcePath) {
		return Errorf(field(mf, "source_path"), "must not name supervisor authority or an ambient secret path")
	}
	matDir := a.RunDir + "/" + MaterializationsDir
	if l.Scope.BindsRunSource() {
		if m.SHA256 != "" {
			return Errorf(field(mf, "sha256"), "a %s source is a live binding, not a digest-bound file", l.Scope)
		}
		if m.EnvironmentName != "" {
			return Errorf(field(mf, "environment_name"), "only provider-environment materializations bind a name")
		}
		if !strictlyWithin(m.SourcePath, a.RunDir) {
			return Errorf(field(mf, "source_path"), "must be strictly below the run directory of run_id")
		}
		if within(m.SourcePath, matDir) {
			return Errorf(field(mf, "source_path"), "must not be in the materializations directory, which holds file materializations")
		}
		root := SharedTargetRoot
		m.Kind = SourceSharedDirectory
		if l.Scope == ScopeToolEndpoint {
			root, m.Kind = ToolEndpointTargetRoot, SourceEndpoint
		}
		return targetIn(m, root)
	}

	// A file materialization.
	m.Kind = SourceFile
	if path.Dir(m.SourcePath) != matDir {
		return Errorf(field(mf, "source_path"), "must be a file directly in the run's materializations directory")
	}
	if m.SHA256 == "" {
		return Errorf(field(mf, "sha256"), "is required for a file materialization")
	}
	if !isSHA256Hex(m.SHA256) {
		return Errorf(field(mf, "sha256"), "must be 64 lowercase hexadecimal characters")
	}
	switch l.Scope {
	case ScopeProviderEnvironment:
		if m.TargetPath != "" {
			return Errorf(field(mf, "target_path"), "a provider-environment value is never mounted: it binds an environment_name")
		}
		if m.EnvironmentName == "" {
			return Errorf(field(mf, "environment_name"), "is required for a provider-environment materialization")
		}
		if r := EnvironmentNameReason(m.EnvironmentName); r != "" {
			return Errorf(field(mf, "environment_name"), "%s", r)
		}
		key := [2]string{l.Consumer, m.EnvironmentName}
		if envTargets[key] {
			return Errorf(field(mf, "environment_name"), "each environment name is bound at most once per consumer (inherited or provider-environment)")
		}
		envTargets[key] = true
		return nil
	case ScopeProjectEnvironment:
		if m.TargetPath != ProjectEnvironmentTarget {
			return Errorf(field(mf, "target_path"), "must be %s", ProjectEnvironmentTarget)
		}
	case ScopeToolRequest:
		if m.TargetPath != l.RequestSpoolTarget+"/"+CapabilityFile {
			return Errorf(field(mf, "target_path"), "must be %s below the lease's request_spool_target", CapabilityFile)
		}
	case ScopeProviderCredential:
		if m.TargetPath == "" {
			return Errorf(field(mf, "target_path"), "is required for a provider-credential materialization")
		}
		if !isAbsClean(m.TargetPath) || path.Dir(m.TargetPath) == "/" || m.TargetPath == "/" {
			return Errorf(field(mf, "target_path"), "must be an absolute, clean file path not directly below /")
		}
		if within(m.TargetPath, LeaseTargetRoot) {
			return Errorf(field(mf, "target_path"), "a provider credential is placed where its provider reads it, outside %s", LeaseTargetRoot)
		}
		if ambientReference(m.TargetPath) {
			return Errorf(field(mf, "target_path"), "must not name supervisor authority or an ambient secret path")
		}
	}
	if m.EnvironmentName != "" {
		return Errorf(field(mf, "environment_name"), "only provider-environment materializations bind a name")
	}
	return nil
}

// targetIn checks a bind target strictly below the scope's namespace.
func targetIn(m *Materialization, root string) error {
	f := field(m.Field, "target_path")
	if m.TargetPath == "" {
		return Errorf(f, "is required: a clean path strictly below %s", root)
	}
	if !isAbsClean(m.TargetPath) || !strictlyWithin(m.TargetPath, root) {
		return Errorf(f, "must be a clean path strictly below %s", root)
	}
	if ambientReference(m.TargetPath) {
		return Errorf(f, "must not name supervisor authority or an ambient secret path")
	}
	return nil
}

// toolRequests applies the cross-lease rules of tool-request leases: each
// names a tool-endpoint lease of the same consumer that lives at least as
// long, and one endpoint backs one spool. The linked endpoint's source must
// then be a socket and the endpoint becomes a trusted relay, never mounted.
func (v *validator) toolRequests() error {
	a := v.a
	linked := map[string]bool{}
	for i := range a.Leases {
		l := &a.Leases[i]
		if l.Scope != ScopeToolRequest {
			continue
		}
		f := field(LeaseField(i), "endpoint_lease_id")
		ep := a.LeaseByID(l.EndpointLeaseID)
		if ep == nil {
			return Errorf(f, "names no lease of this assignment")
		}
		if ep.Scope != ScopeToolEndpoint {
			return Errorf(f, "must name a tool-endpoint lease")
		}
		if ep.Consumer != l.Consumer {
			return Errorf(f, "the endpoint lease must have the same consumer")
		}
		if ep.ExpiresAt.Before(*l.ExpiresAt) {
			return Errorf(f, "the endpoint lease must not expire before this lease")
		}
		if linked[ep.LeaseID] {
			return Errorf(f, "a tool endpoint backs at most one request spool")
		}
		linked[ep.LeaseID] = true
		ep.State = StateTrustedRelayEndpoint
		ep.Materializations[0].Kind = SourceSocket
	}
	return nil
}

// consumers: a provider-environment consumer must hold a model identity,
// since values are selected for exactly that identity's consumer. (The
// spec's tool-request example has no model identity, so tool-request
// consumers are not held to this; the newer reference is.)
func (v *validator) consumers() error {
	model := map[string]bool{}
	for _, l := range v.a.Leases {
		if l.Scope == ScopeModelIdentity {
			model[l.Consumer] = true
		}
	}
	for i, l := range v.a.Leases {
		if l.Scope == ScopeProviderEnvironment && !model[l.Consumer] {
			return Errorf(field(LeaseField(i), "consumer"), "a provider-environment consumer must also hold a model-identity lease")
		}
	}
	return nil
}

// overlaps: sources unique and non-overlapping; bind targets unique and
// not nested in one another (a nested bind would shadow or expose another).
func (v *validator) overlaps() error {
	type entry struct{ path, field string }
	var sources, targets []entry
	for i := range v.a.Leases {
		l := &v.a.Leases[i]
		if l.Scope == ScopeToolRequest {
			targets = append(targets, entry{l.RequestSpoolTarget, field(LeaseField(i), "request_spool_target")})
		}
		for _, m := range l.Materializations {
			sources = append(sources, entry{m.SourcePath, field(m.Field, "source_path")})
			if m.TargetPath != "" && l.Scope != ScopeToolRequest {
				targets = append(targets, entry{m.TargetPath, field(m.Field, "target_path")})
			}
		}
	}
	for _, set := range []struct {
		list []entry
		what string
	}{{sources, "sources"}, {targets, "targets"}} {
		for j := range set.list {
			for k := 0; k < j; k++ {
				if overlaps(set.list[j].path, set.list[k].path) {
					return Errorf(set.list[j].field, "overlaps %s: %s must be unique and not nested", set.list[k].field, set.what)
				}
			}
		}
	}
	return nil
}
