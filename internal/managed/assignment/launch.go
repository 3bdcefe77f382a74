package assignment

import "sort"

// RequireManagedLaunch applies the rule every managed Dev Containers launch
// checks before any CLI preflight: a version "3" assignment, a workspace
// consumer whose uid and gid both differ from the runtime's own, and
// preloaded service_images (non-empty here; CheckServiceImagesComplete
// compares them with the repository's runnable Compose services once the
// launch has read those). Version 1 and 2 assignments, and assignments
// without a consumer, are refused.
func (a *Assignment) RequireManagedLaunch(runtime Identity) error {
	if a.Version != Version3 {
		return Errorf("version", "a managed launch needs a version \"3\" assignment with a distinct workspace consumer")
	}
	c := a.WorkspaceConsumer
	if c == nil {
		return Errorf("workspace_consumer", "a managed launch needs a workspace consumer")
	}
	if c.UID == 0 || c.GID == 0 {
		return Errorf("workspace_consumer", "a managed launch needs a non-root workspace consumer")
	}
	if c.UID == runtime.UID {
		return Errorf("workspace_consumer.uid", "a managed launch needs a consumer uid distinct from the runtime's uid %d", runtime.UID)
	}
	if c.GID == runtime.GID {
		return Errorf("workspace_consumer.gid", "a managed launch needs a consumer gid distinct from the runtime's gid %d", runtime.GID)
	}
	if len(a.ServiceImages) == 0 {
		return Errorf("service_images", "a managed launch needs preloaded images for every runnable service")
	}
	return nil
}

// CheckServiceImagesComplete compares service_images with the runnable
// services the repository's Compose files declare (outer tunnel connectors
// already removed): every runnable service must be bound and no other name
// may be. Service names are repository data, not secrets, and are named in
// the message so the orchestrator can fix its assignment.
func CheckServiceImagesComplete(images map[string]string, runnable []string) error {
	want := map[string]bool{}
	for _, s := range runnable {
		want[s] = true
	}
	var missing, unknown []string
	for s := range want {
		if _, ok := images[s]; !ok {
			missing = append(missing, s)
		}
	}
	for s := range images {
		if !want[s] {
			unknown = append(unknown, s)
		}
	}
	sort.Strings(missing)
	sort.Strings(unknown)
	switch {
	case len(missing) > 0 && len(unknown) > 0:
		return Errorf("service_images", "runnable services without an image: %q; names that are not runnable services: %q", missing, unknown)
	case len(missing) > 0:
		return Errorf("service_images", "runnable services without an image: %q", missing)
	case len(unknown) > 0:
		return Errorf("service_images", "names that are not runnable services (unknown or disabled connectors): %q", unknown)
	}
	return nil
}
