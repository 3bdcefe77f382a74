package backend_test

import (
	"strings"
	"testing"

	"agentbox/internal/backend"
)

// TestHostMountDevice: every valid mount name has its own device name
// of at most 63 characters (Incus's bound), recognised as a named
// mount's; a short name's is jailbee-mount-NAME.
func TestHostMountDevice(t *testing.T) {
	long := strings.Repeat("a", 64)
	names := []string{"d", "data.ro", strings.Repeat("b", 49), strings.Repeat("b", 50), long, long[:63] + "b", long[:50]}
	seen := map[string]string{}
	for _, n := range names {
		m := backend.HostMount{Name: n, Source: "/srv/x"}
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
		dev := m.Device()
		if len(dev) > 63 || !backend.IsHostMountDevice(dev) {
			t.Errorf("%q: device %q", n, dev)
		}
		if other, ok := seen[dev]; ok {
			t.Errorf("%q and %q share device %q", n, other, dev)
		}
		seen[dev] = n
	}
	if got := (backend.HostMount{Name: "data.ro"}).Device(); got != "jailbee-mount-data.ro" {
		t.Errorf("short name's device %q", got)
	}
	if got := (backend.HostMount{Name: "data.ro"}).Path(); got != "/mnt/jailbee/data.ro" {
		t.Errorf("path %q", got)
	}
	for _, dev := range []string{backend.SocketDeviceName, backend.ModelDeviceName, "jailbee-client"} {
		if backend.IsHostMountDevice(dev) {
			t.Errorf("%q taken for a named mount's", dev)
		}
	}
	for _, m := range []backend.HostMount{{Name: "../x", Source: "/srv"}, {Name: "x", Source: "srv"}, {Name: "x", Source: "/srv/../etc"}, {Name: "x", Source: "/"}} {
		if m.Validate() == nil {
			t.Errorf("%+v accepted", m)
		}
	}
}
