package config

import (
	"errors"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"agentbox/internal/grant"
)

const fullBrokerConfig = `
limits:
  pids: 2048
  memory: 8GiB
  cpu_weight: 200
  disk: 40GiB
inbox:
  max_unread_items: 500
  max_unread_bytes: 16MiB
  read_retention_days: 2
tree:
  max_children: 10
  max_queued_spawns: 5
  max_spawns_per_hour: 40
  max_unread_items: 300
  max_unread_bytes: 20MiB
  max_connections: 200
sandbox_uids:
  first: 200000
  count: 65536
model:
  upstream: http://127.0.0.1:9000
  api_key_file: /etc/jailbee/anthropic-key
  max_output_tokens_per_hour: 100000
  provider_tools: true
forge:
  api_url: http://127.0.0.1:8080/api
  git_url: file:///srv/git/{owner}/{name}.git
  token_env: GITHUB_TOKEN
publish:
  actions_per_hour: 12
  bytes_per_hour: 2GiB
`

func TestParseBrokerFull(t *testing.T) {
	b, err := ParseBroker([]byte(fullBrokerConfig))
	if err != nil {
		t.Fatal(err)
	}
	want := &Broker{
		Limits:      Limits{Pids: 2048, MemoryBytes: 8 << 30, CPUWeight: 200, DiskBytes: 40 << 30},
		Inbox:       InboxQuota{MaxUnreadItems: 500, MaxUnreadBytes: 16 << 20, ReadRetentionDays: 2},
		Tree:        Tree{MaxChildren: 10, MaxQueuedSpawns: 5, MaxSpawnsPerHour: 40, MaxUnreadItems: 300, MaxUnreadBytes: 20 << 20, MaxConnections: 200},
		SandboxUIDs: UIDRange{First: 200000, Count: 65536},
		Model:       Model{Upstream: "http://127.0.0.1:9000", APIKeyFile: "/etc/jailbee/anthropic-key", MaxOutputTokensPerHour: 100000, ProviderTools: true},
		Forge:       Forge{APIURL: "http://127.0.0.1:8080/api/", GitURL: "file:///srv/git/{owner}/{name}.git", TokenEnv: "GITHUB_TOKEN"},
		Publish:     Publish{ActionsPerHour: 12, BytesPerHour: 2 << 30},
	}
	if !reflect.DeepEqual(b, want) {
		t.Fatalf("\n got: %+v\nwant: %+v", b, want)
	}
}

func TestDefaultBroker(t *testing.T) {
	want := &Broker{
		Limits:      Limits{Pids: 1024, MemoryBytes: 4 << 30, CPUWeight: 100, DiskBytes: 16 << 30},
		Inbox:       InboxQuota{MaxUnreadItems: 1000, MaxUnreadBytes: 32 << 20, ReadRetentionDays: 7},
		Tree:        Tree{MaxChildren: 64, MaxQueuedSpawns: 32, MaxSpawnsPerHour: 256, MaxUnreadItems: 2000, MaxUnreadBytes: 64 << 20, MaxConnections: 1024},
		SandboxUIDs: UIDRange{First: 1073741824, Count: 1048576},
		Model:       Model{Upstream: DefaultModelUpstream},
		Forge:       Forge{APIURL: "https://api.github.com/", GitURL: "https://github.com/{owner}/{name}.git"},
		Publish:     Publish{ActionsPerHour: 30, BytesPerHour: 4 << 30},
	}
	if got := DefaultBroker(); !reflect.DeepEqual(got, want) {
		t.Fatalf("DefaultBroker() = %+v, want %+v", got, want)
	}
	if err := DefaultBroker().Validate(); err != nil {
		t.Fatalf("the default is invalid: %v", err)
	}
	for _, in := range []string{
		"", "\n", "# only a comment\n", "# a\n\n# b\n", "~\n", "---\n", "--- # c\n",
		"limits:\n", "limits: {}\n", "inbox: ~\n", "sandbox_uids: null\n",
		"limits: {pids: ~, memory: null, cpu_weight: , disk: ~}\n",
	} {
		t.Run(in, func(t *testing.T) {
			b, err := ParseBroker([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(b, DefaultBroker()) {
				t.Fatalf("ParseBroker(%q) = %+v, want DefaultBroker()", in, b)
			}
		})
	}
}

func TestParseBrokerMissingKeysTakeDefaults(t *testing.T) {
	tests := []struct {
		name, yaml string
		edit       func(*Broker)
	}{
		{"pids only", "limits: {pids: 64}\n", func(b *Broker) { b.Limits.Pids = 64 }},
		{"memory only", "limits: {memory: 1GiB}\n", func(b *Broker) { b.Limits.MemoryBytes = 1 << 30 }},
		{"cpu_weight only", "limits: {cpu_weight: 50}\n", func(b *Broker) { b.Limits.CPUWeight = 50 }},
		{"disk only", "limits: {disk: 2GiB}\n", func(b *Broker) { b.Limits.DiskBytes = 2 << 30 }},
		{"items only", "inbox: {max_unread_items: 10}\n", func(b *Broker) { b.Inbox.MaxUnreadItems = 10 }},
		{"bytes only", "inbox: {max_unread_bytes: 1MiB}\n", func(b *Broker) { b.Inbox.MaxUnreadBytes = 1 << 20 }},
		{"first only", "sandbox_uids: {first: 300000}\n", func(b *Broker) { b.SandboxUIDs.First = 300000 }},
		{"count only", "sandbox_uids: {count: 10}\n", func(b *Broker) { b.SandboxUIDs.Count = 10 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBroker([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			want := DefaultBroker()
			tt.edit(want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("\n got: %+v\nwant: %+v", got, want)
			}
		})
	}
}

func TestParseBrokerSizes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"memory: 33554432", 32 << 20},
		{"memory: 33554432B", 32 << 20},
		{"memory: 32768KiB", 32 << 20},
		{"memory: 32MiB", 32 << 20},
		{"memory: 1536MiB", 1536 << 20},
		{"memory: 4GiB", 4 << 30},
		{"memory: 1TiB", 1 << 40},
		{`memory: "4GiB"`, 4 << 30},
		{"memory: '4GiB'", 4 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			b, err := ParseBroker([]byte("limits: {" + tt.in + "}\n"))
			if err != nil {
				t.Fatal(err)
			}
			if b.Limits.MemoryBytes != tt.want {
				t.Fatalf("memory = %d, want %d", b.Limits.MemoryBytes, tt.want)
			}
		})
	}
}

// brokerError returns ParseBroker's error text for in ("" when it parses),
// failing the test when the error is not an *Error.
func brokerError(t *testing.T, in string) string {
	t.Helper()
	_, err := ParseBroker([]byte(in))
	if err == nil {
		return ""
	}
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("got %v (%T), want an *Error", err, err)
	}
	return err.Error()
}

func TestParseBrokerBounds(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"pids at min", "limits: {pids: 16}\n", ""},
		{"pids below min", "limits: {pids: 15}\n", "limits.pids: must be 16 to 4194304 (line 1)"},
		{"pids at max", "limits: {pids: 4194304}\n", ""},
		{"pids past max", "limits: {pids: 4194305}\n", "limits.pids: must be 16 to 4194304 (line 1)"},
		{"pids negative", "limits: {pids: -1}\n", "limits.pids: must be 16 to 4194304 (line 1)"},
		{"pids past int64", "limits: {pids: 9223372036854775808}\n", "limits.pids: must be 16 to 4194304 (line 1)"},
		{"pids past uint64", "limits: {pids: 99999999999999999999}\n", "limits.pids: must be 16 to 4194304 (line 1)"},

		{"memory at min", "limits: {memory: 32MiB}\n", ""},
		{"memory below min", "limits: {memory: 33554431}\n", "limits.memory: must be 32MiB to 1TiB (line 1)"},
		{"memory at max", "limits: {memory: 1099511627776}\n", ""},
		{"memory past max", "limits: {memory: 1099511627777}\n", "limits.memory: must be 32MiB to 1TiB (line 1)"},
		{"memory past max in units", "limits: {memory: 1025GiB}\n", "limits.memory: must be 32MiB to 1TiB (line 1)"},
		{"memory zero", "limits: {memory: 0}\n", "limits.memory: must be 32MiB to 1TiB (line 1)"},

		{"cpu_weight at min", "limits: {cpu_weight: 1}\n", ""},
		{"cpu_weight below min", "limits: {cpu_weight: 0}\n", "limits.cpu_weight: must be 1 to 10000 (line 1)"},
		{"cpu_weight at max", "limits: {cpu_weight: 10000}\n", ""},
		{"cpu_weight past max", "limits: {cpu_weight: 10001}\n", "limits.cpu_weight: must be 1 to 10000 (line 1)"},

		{"disk at min", "limits: {disk: 512MiB}\n", ""},
		{"disk below min", "limits: {disk: 536870911}\n", "limits.disk: must be 512MiB to 16TiB (line 1)"},
		{"disk at max", "limits: {disk: 16TiB}\n", ""},
		{"disk past max", "limits: {disk: 17592186044417}\n", "limits.disk: must be 512MiB to 16TiB (line 1)"},
		{"disk zero", "limits: {disk: 0}\n", "limits.disk: must be 512MiB to 16TiB (line 1)"},
		{"disk in decimal units", "limits: {disk: 20GB}\n", "limits.disk: unit `GB` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB) (line 1)"},

		{"items at min", "inbox: {max_unread_items: 1}\n", ""},
		{"items below min", "inbox: {max_unread_items: 0}\n", "inbox.max_unread_items: must be 1 to 1000000 (line 1)"},
		{"items at max", "inbox: {max_unread_items: 1000000}\n", ""},
		{"items past max", "inbox: {max_unread_items: 1000001}\n", "inbox.max_unread_items: must be 1 to 1000000 (line 1)"},

		{"bytes at min", "inbox: {max_unread_bytes: 64KiB}\n", ""},
		{"bytes below min", "inbox: {max_unread_bytes: 65535}\n", "inbox.max_unread_bytes: must be 64KiB to 1GiB (line 1)"},
		{"bytes at max", "inbox: {max_unread_bytes: 1073741824}\n", ""},
		{"bytes past max", "inbox: {max_unread_bytes: 1073741825}\n", "inbox.max_unread_bytes: must be 64KiB to 1GiB (line 1)"},

		{"retention at min", "inbox: {read_retention_days: 1}\n", ""},
		{"retention below min", "inbox: {read_retention_days: 0}\n", "inbox.read_retention_days: must be 1 to 3650 (line 1)"},
		{"retention at max", "inbox: {read_retention_days: 3650}\n", ""},
		{"retention past max", "inbox: {read_retention_days: 3651}\n", "inbox.read_retention_days: must be 1 to 3650 (line 1)"},

		{"children at min", "tree: {max_children: 1}\n", ""},
		{"children below min", "tree: {max_children: 0}\n", "tree.max_children: must be 1 to 10000 (line 1)"},
		{"children at max", "tree: {max_children: 10000}\n", ""},
		{"children past max", "tree: {max_children: 10001}\n", "tree.max_children: must be 1 to 10000 (line 1)"},
		{"queued at max", "tree: {max_queued_spawns: 10000}\n", ""},
		{"queued past max", "tree: {max_queued_spawns: 10001}\n", "tree.max_queued_spawns: must be 1 to 10000 (line 1)"},
		{"spawns an hour at min", "tree: {max_spawns_per_hour: 1}\n", ""},
		{"spawns an hour below min", "tree: {max_spawns_per_hour: 0}\n", "tree.max_spawns_per_hour: must be 1 to 1000000 (line 1)"},
		{"spawns an hour at max", "tree: {max_spawns_per_hour: 1000000}\n", ""},
		{"spawns an hour past max", "tree: {max_spawns_per_hour: 1000001}\n", "tree.max_spawns_per_hour: must be 1 to 1000000 (line 1)"},
		{"connections at min", "tree: {max_connections: 16}\n", ""},
		{"connections below min", "tree: {max_connections: 15}\n", "tree.max_connections: must be 16 to 1000000 (line 1)"},
		{"connections at max", "tree: {max_connections: 1000000}\n", ""},
		{"connections past max", "tree: {max_connections: 1000001}\n", "tree.max_connections: must be 16 to 1000000 (line 1)"},
		{"tree items past max", "tree: {max_unread_items: 1000001}\n", "tree.max_unread_items: must be 1 to 1000000 (line 1)"},
		{"tree bytes below min", "tree: {max_unread_bytes: 65535}\n", "tree.max_unread_bytes: must be 64KiB to 1GiB (line 1)"},

		{"first at min", "sandbox_uids: {first: 100000}\n", ""},
		{"first below min", "sandbox_uids: {first: 99999}\n", "sandbox_uids.first: must be 100000 to 2147483646 (line 1)"},
		{"first at max", "sandbox_uids: {first: 2147483646, count: 1}\n", ""},
		{"first past max", "sandbox_uids: {first: 2147483647, count: 1}\n", "sandbox_uids.first: must be 100000 to 2147483646 (line 1)"},
		{"first nobody", "sandbox_uids: {first: 65534, count: 1}\n", "sandbox_uids.first: must be 100000 to 2147483646 (line 1)"},
		{"first past uint32", "sandbox_uids: {first: 4294967296, count: 1}\n", "sandbox_uids.first: must be 100000 to 2147483646 (line 1)"},

		{"count at min", "sandbox_uids: {count: 1}\n", ""},
		{"count below min", "sandbox_uids: {count: 0}\n", "sandbox_uids.count: must be 1 to 2147383647 (line 1)"},
		{"count at max", "sandbox_uids: {first: 100000, count: 2147383647}\n", ""},
		{"count past max", "sandbox_uids: {first: 100000, count: 2147383648}\n", "sandbox_uids.count: must be 1 to 2147383647 (line 1)"},

		{"range end at max", "sandbox_uids: {first: 2146435071, count: 1048576}\n", ""},
		{"range end past max", "sandbox_uids: {first: 2146435072, count: 1048576}\n",
			"sandbox_uids: first + count - 1 must be at most 2147483646 (this range ends at 2147483647) (line 1)"},
		{"range end past max by first", "sandbox_uids:\n  first: 2147483000\n",
			"sandbox_uids: first + count - 1 must be at most 2147483646 (this range ends at 2148531575) (line 1)"},
		{"range end past max, key line", "limits: {}\n\nsandbox_uids:\n  first: 2147483646\n  count: 2\n",
			"sandbox_uids: first + count - 1 must be at most 2147483646 (this range ends at 2147483647) (line 3)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := brokerError(t, tt.yaml); got != tt.want {
				t.Fatalf("\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

func TestParseBrokerRefusals(t *testing.T) {
	const sizeMsg = "must be an integer number of bytes, or an integer with a unit B, KiB, MiB, GiB or TiB, such as 4GiB"
	tests := []struct{ name, yaml, want string }{
		{"unknown top key", "limit: {}\n", "limit: unknown key (line 1)"},
		{"unknown limits key", "limits:\n  pids: 64\n  memroy: 1GiB\n", "limits.memroy: unknown key (line 3)"},
		{"unknown inbox key", "inbox:\n  max_items: 5\n", "inbox.max_items: unknown key (line 2)"},
		{"unknown uid key", "sandbox_uids: {last: 5}\n", "sandbox_uids.last: unknown key (line 1)"},
		{"merge key", "limits:\n  <<: {pids: 64}\n", "limits.<<: unknown key (line 2)"},
		{"duplicate top key", "limits: {}\nlimits: {}\n", "limits: duplicate key (line 2)"},
		{"duplicate nested key", "limits:\n  pids: 64\n  pids: 128\n", "limits.pids: duplicate key (line 3)"},
		{"non-string key", "limits:\n  [a]: 1\n", "limits: keys must be plain strings (line 2)"},
		{"root not a mapping", "- limits\n", "must be a mapping (line 1)"},
		{"root scalar", "limits\n", "must be a mapping (line 1)"},
		{"section not a mapping", "limits: [pids]\n", "limits: must be a mapping (line 1)"},
		{"section scalar", "inbox: 5\n", "inbox: must be a mapping (line 1)"},
		{"alias section", "limits: &l {pids: 64}\ninbox: *l\n", "inbox: YAML aliases are not supported (line 2)"},
		{"alias value", "limits:\n  pids: &p 64\n  cpu_weight: *p\n", "limits.cpu_weight: YAML aliases are not supported (line 3)"},
		{"two documents", "limits: {}\n---\nlimits: {}\n", "more than one YAML document"},
		{"invalid yaml", "limits: [\n", "invalid YAML: yaml: line 1: did not find expected node content"},

		{"unknown agent", "agents: {codex: {version: 1.0.0}}\n", "agents.codex: unknown agent (known: claude) (line 1)"},
		{"agent version range", "agents: {claude: {version: ^2.1.0}}\n", `agents.claude.version: must be a release number such as "2.1.332" (no range or tag) (line 1)`},
		{"agent version tag", "agents: {claude: {version: latest}}\n", `agents.claude.version: must be a release number such as "2.1.332" (no range or tag) (line 1)`},
		{"agent version path", "agents: {claude: {version: ../x}}\n", `agents.claude.version: must be a release number such as "2.1.332" (no range or tag) (line 1)`},
		{"agent version list", "agents: {claude: {version: [2]}}\n", `agents.claude.version: must be a release number such as "2.1.332" (no range or tag) (line 1)`},
		{"agent unknown key", "agents: {claude: {channel: stable}}\n", "agents.claude.channel: unknown key (line 1)"},
		{"agents not a mapping", "agents: [claude]\n", "agents: must be a mapping (line 1)"},
		{"int quoted", `limits: {pids: "64"}` + "\n", "limits.pids: must be an integer (line 1)"},
		{"int bool", "limits: {pids: true}\n", "limits.pids: must be an integer (line 1)"},
		{"int float", "limits: {cpu_weight: 1.5}\n", "limits.cpu_weight: must be an integer (line 1)"},
		{"int exponent", "inbox: {max_unread_items: 1e3}\n", "inbox.max_unread_items: must be an integer (line 1)"},
		{"int list", "limits: {pids: [64]}\n", "limits.pids: must be an integer (line 1)"},
		{"int with unit", "limits: {pids: 1KiB}\n", "limits.pids: must be an integer (line 1)"},
		{"int hex", "limits: {pids: 0x40}\n", "limits.pids: must be a plain decimal integer (no sign but -, no 0x, 0o, 0b, _ or leading zeros) (line 1)"},
		{"int octal", "limits: {pids: 0o100}\n", "limits.pids: must be a plain decimal integer (no sign but -, no 0x, 0o, 0b, _ or leading zeros) (line 1)"},
		{"int leading zero", "limits: {pids: 0100}\n", "limits.pids: must be a plain decimal integer (no sign but -, no 0x, 0o, 0b, _ or leading zeros) (line 1)"},
		{"int underscore", "sandbox_uids: {first: 1_000_000}\n", "sandbox_uids.first: must be a plain decimal integer (no sign but -, no 0x, 0o, 0b, _ or leading zeros) (line 1)"},
		{"int plus", "limits: {pids: +64}\n", "limits.pids: must be a plain decimal integer (no sign but -, no 0x, 0o, 0b, _ or leading zeros) (line 1)"},
		{"int explicit tag", "limits: {pids: !!int 0b1000000}\n", "limits.pids: must be a plain decimal integer (no sign but -, no 0x, 0o, 0b, _ or leading zeros) (line 1)"},

		{"size KB", "limits: {memory: 4096KB}\n", "limits.memory: unit `KB` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB) (line 1)"},
		{"size MB", "inbox: {max_unread_bytes: 32MB}\n", "inbox.max_unread_bytes: unit `MB` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB) (line 1)"},
		{"size GB", "limits: {memory: 4GB}\n", "limits.memory: unit `GB` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB) (line 1)"},
		{"size G", "limits: {memory: 4G}\n", "limits.memory: unit `G` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB) (line 1)"},
		{"size lowercase", "limits: {memory: 4gib}\n", "limits.memory: unknown unit `gib` (use B, KiB, MiB, GiB or TiB) (line 1)"},
		{"size PiB", "limits: {memory: 1PiB}\n", "limits.memory: unknown unit `PiB` (use B, KiB, MiB, GiB or TiB) (line 1)"},
		{"size fraction", "limits: {memory: 1.5GiB}\n", "limits.memory: must be a whole number: use a smaller unit instead of a fraction (1536MiB, not 1.5GiB) (line 1)"},
		{"size plain fraction", "limits: {memory: 33554432.5}\n", "limits.memory: must be a whole number: use a smaller unit instead of a fraction (1536MiB, not 1.5GiB) (line 1)"},
		{"size negative", "limits: {memory: -4GiB}\n", "limits.memory: must not be negative (line 1)"},
		{"size negative plain", "limits: {memory: -1}\n", "limits.memory: must not be negative (line 1)"},
		{"size space", "limits: {memory: 4 GiB}\n", "limits.memory: must be written without spaces, such as 4GiB (line 1)"},
		{"size leading zero", "limits: {memory: 04GiB}\n", "limits.memory: must not have leading zeros (line 1)"},
		{"size hex", "limits: {memory: 0x2000000}\n", "limits.memory: " + sizeMsg + " (line 1)"},
		{"size unit only", "limits: {memory: GiB}\n", "limits.memory: " + sizeMsg + " (line 1)"},
		{"size empty string", `limits: {memory: ""}` + "\n", "limits.memory: " + sizeMsg + " (line 1)"},
		{"size bool", "limits: {memory: true}\n", "limits.memory: " + sizeMsg + " (line 1)"},
		{"size list", "inbox: {max_unread_bytes: [1]}\n", "inbox.max_unread_bytes: " + sizeMsg + " (line 1)"},
		{"size overflow plain", "limits: {memory: 9223372036854775808}\n", "limits.memory: is too large (at most 9223372036854775807 bytes) (line 1)"},
		{"size overflow unit", "limits: {memory: 8589934592GiB}\n", "limits.memory: is too large (at most 9223372036854775807 bytes) (line 1)"},
		{"size just below overflow", "limits: {memory: 8589934591GiB}\n", "limits.memory: must be 32MiB to 1TiB (line 1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := brokerError(t, tt.yaml); got != tt.want {
				t.Fatalf("\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

// TestParseBrokerAgents: `agents` pins an agent's release; absent or
// null, the built-in default stays (no pin).
func TestParseBrokerAgents(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want string
	}{
		{"agents: {claude: {version: 2.1.330}}\n", "2.1.330"},
		{"agents: {claude: {version: \"2.1.330\"}}\n", "2.1.330"},
		{"agents: {claude: null}\n", ""},
		{"agents: null\n", ""},
		{"limits: {}\n", ""},
	} {
		b, err := ParseBroker([]byte(tc.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if got := b.AgentVersions["claude"]; got != tc.want {
			t.Errorf("%q: claude pinned to %q, want %q", tc.yaml, got, tc.want)
		}
	}
}

func TestParseBrokerFileSize(t *testing.T) {
	pad := "# " + strings.Repeat("x", MaxBrokerConfigBytes-3) + "\n"
	if len(pad) != MaxBrokerConfigBytes {
		t.Fatalf("pad is %d bytes", len(pad))
	}
	tests := []struct{ name, in, want string }{
		{"at the limit", pad, ""},
		{"past the limit", pad + "#", "broker config exceeds 65536 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := brokerError(t, tt.in); got != tt.want {
				t.Fatalf("\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

func TestBrokerValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Broker)
		want string
	}{
		{"default", func(*Broker) {}, ""},
		{"pids", func(b *Broker) { b.Limits.Pids = MinPids - 1 }, "limits.pids: must be 16 to 4194304"},
		{"memory", func(b *Broker) { b.Limits.MemoryBytes = MaxMemoryBytes + 1 }, "limits.memory: must be 32MiB to 1TiB"},
		{"cpu_weight", func(b *Broker) { b.Limits.CPUWeight = 0 }, "limits.cpu_weight: must be 1 to 10000"},
		{"disk", func(b *Broker) { b.Limits.DiskBytes = MinDiskBytes - 1 }, "limits.disk: must be 512MiB to 16TiB"},
		{"items", func(b *Broker) { b.Inbox.MaxUnreadItems = MaxInboxUnreadItems + 1 }, "inbox.max_unread_items: must be 1 to 1000000"},
		{"bytes", func(b *Broker) { b.Inbox.MaxUnreadBytes = MinInboxUnreadBytes - 1 }, "inbox.max_unread_bytes: must be 64KiB to 1GiB"},
		{"first", func(b *Broker) { b.SandboxUIDs.First = MinSandboxUID - 1 }, "sandbox_uids.first: must be 100000 to 2147483646"},
		{"count", func(b *Broker) { b.SandboxUIDs.Count = 0 }, "sandbox_uids.count: must be 1 to 2147383647"},
		{"range end", func(b *Broker) { b.SandboxUIDs = UIDRange{First: MaxSandboxUID, Count: 2} },
			"sandbox_uids: first + count - 1 must be at most 2147483646 (this range ends at 2147483647)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := DefaultBroker()
			tt.edit(b)
			got := ""
			if err := b.Validate(); err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Fatalf("\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

func TestUIDRange(t *testing.T) {
	r := UIDRange{First: 100000, Count: 3}
	tests := []struct {
		uid  uint32
		want bool
	}{
		{99999, false}, {100000, true}, {100002, true}, {100003, false}, {0, false},
	}
	for _, tt := range tests {
		if got := r.Contains(tt.uid); got != tt.want {
			t.Errorf("Contains(%d) = %v, want %v", tt.uid, got, tt.want)
		}
	}
	if r.Last() != 100002 {
		t.Errorf("Last() = %d", r.Last())
	}
	if (UIDRange{First: 5}).Contains(5) {
		t.Error("an empty range contains nothing")
	}
	top := UIDRange{First: 1<<32 - 2, Count: 2}
	if !top.Contains(1<<32-1) || top.Contains(0) {
		t.Error("Contains must not wrap past 2^32-1")
	}
	// nobody and the 16-bit "no uid" are refused even though first >=
	// 100000 already keeps them out of a parsed range.
	for _, r := range []UIDRange{{First: 65534, Count: 1}, {First: 65535, Count: 1}, {First: 60000, Count: 10000}} {
		if got := r.rangeProblem(); got != `the range must not contain 65534 or 65535 (nobody and the 16-bit "no uid")` {
			t.Errorf("%+v: rangeProblem() = %q", r, got)
		}
	}
	if got := (UIDRange{First: 65536, Count: 1}).rangeProblem(); got != "" {
		t.Errorf("65536: rangeProblem() = %q", got)
	}
}

func TestLimitsOverride(t *testing.T) {
	base := DefaultBroker().Limits
	p, m, c, d := int64(64), int64(1<<30), 500, int64(2<<30)
	tests := []struct {
		name string
		o    LimitsOverride
		want Limits
	}{
		{"none", LimitsOverride{}, base},
		{"pids", LimitsOverride{Pids: &p}, Limits{Pids: 64, MemoryBytes: base.MemoryBytes, CPUWeight: base.CPUWeight, DiskBytes: base.DiskBytes}},
		{"memory", LimitsOverride{MemoryBytes: &m}, Limits{Pids: base.Pids, MemoryBytes: 1 << 30, CPUWeight: base.CPUWeight, DiskBytes: base.DiskBytes}},
		{"cpu_weight", LimitsOverride{CPUWeight: &c}, Limits{Pids: base.Pids, MemoryBytes: base.MemoryBytes, CPUWeight: 500, DiskBytes: base.DiskBytes}},
		{"disk", LimitsOverride{DiskBytes: &d}, Limits{Pids: base.Pids, MemoryBytes: base.MemoryBytes, CPUWeight: base.CPUWeight, DiskBytes: 2 << 30}},
		{"all", LimitsOverride{Pids: &p, MemoryBytes: &m, CPUWeight: &c, DiskBytes: &d}, Limits{Pids: 64, MemoryBytes: 1 << 30, CPUWeight: 500, DiskBytes: 2 << 30}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := base.Override(tt.o); got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if base != DefaultBroker().Limits {
		t.Error("Override must not modify its receiver")
	}
}

func TestLimitsOverrideValidate(t *testing.T) {
	low, high, zero, small := int64(MinPids-1), int64(MaxMemoryBytes+1), 0, int64(MinDiskBytes-1)
	ok := int64(MinPids)
	tests := []struct {
		name string
		o    LimitsOverride
		want string
	}{
		{"none", LimitsOverride{}, ""},
		{"pids at min", LimitsOverride{Pids: &ok}, ""},
		{"pids", LimitsOverride{Pids: &low}, "limits.pids: must be 16 to 4194304"},
		{"memory", LimitsOverride{MemoryBytes: &high}, "limits.memory: must be 32MiB to 1TiB"},
		{"cpu_weight", LimitsOverride{CPUWeight: &zero}, "limits.cpu_weight: must be 1 to 10000"},
		{"disk", LimitsOverride{DiskBytes: &small}, "limits.disk: must be 512MiB to 16TiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if err := tt.o.Validate(); err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Fatalf("\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  string
	}{
		{"0", 0, ""},
		{"1", 1, ""},
		{"1B", 1, ""},
		{"1KiB", 1 << 10, ""},
		{"1MiB", 1 << 20, ""},
		{"1GiB", 1 << 30, ""},
		{"1TiB", 1 << 40, ""},
		{"0GiB", 0, ""},
		{"9223372036854775807", 1<<63 - 1, ""},
		{"9223372036854775807B", 1<<63 - 1, ""},
		{"8388607TiB", 8388607 << 40, ""},
		{"9223372036854775808", 0, "is too large (at most 9223372036854775807 bytes)"},
		{"8388608TiB", 0, "is too large (at most 9223372036854775807 bytes)"},
		{"99999999999999999999999", 0, "is too large (at most 9223372036854775807 bytes)"},
		{"", 0, "must be " + sizeSyntax},
		{"GiB", 0, "must be " + sizeSyntax},
		{"-", 0, "must be " + sizeSyntax},
		{"+1GiB", 0, "must be " + sizeSyntax},
		{"0x10", 0, "must be " + sizeSyntax},
		{"1_000", 0, "must be " + sizeSyntax},
		{"1GiB!", 0, "must be " + sizeSyntax},
		{"1Gigabytes", 0, "must be " + sizeSyntax},
		{"1e9", 0, "must be " + sizeSyntax},
		{"1x", 0, "unknown unit `x` (use B, KiB, MiB, GiB or TiB)"},
		{"1GiBB", 0, "unknown unit `GiBB` (use B, KiB, MiB, GiB or TiB)"},
		{"1KIB", 0, "unknown unit `KIB` (use B, KiB, MiB, GiB or TiB)"},
		{"1kB", 0, "unit `kB` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB)"},
		{"1TB", 0, "unit `TB` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB)"},
		{"1m", 0, "unit `m` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB)"},
		{"1.5GiB", 0, "must be a whole number: use a smaller unit instead of a fraction (1536MiB, not 1.5GiB)"},
		{"1,5GiB", 0, "must be a whole number: use a smaller unit instead of a fraction (1536MiB, not 1.5GiB)"},
		{"1.", 0, "must be a whole number: use a smaller unit instead of a fraction (1536MiB, not 1.5GiB)"},
		{"-1", 0, "must not be negative"},
		{"-0GiB", 0, "must not be negative"},
		{"1 GiB", 0, "must be written without spaces, such as 4GiB"},
		{" 1GiB", 0, "must be written without spaces, such as 4GiB"},
		{"00", 0, "must not have leading zeros"},
		{"010MiB", 0, "must not have leading zeros"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			if got != tt.want || msg != tt.err {
				t.Fatalf("ParseSize(%q) = %d, %q; want %d, %q", tt.in, got, msg, tt.want, tt.err)
			}
		})
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1000, "1000B"},
		{1 << 10, "1KiB"},
		{1536 << 20, "1536MiB"},
		{32 << 20, "32MiB"},
		{4 << 30, "4GiB"},
		{1 << 40, "1TiB"},
		{2048 << 40, "2048TiB"},
		{1<<40 + 1, "1099511627777B"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			got := FormatSize(tt.n)
			if got != tt.want {
				t.Fatalf("FormatSize(%d) = %q, want %q", tt.n, got, tt.want)
			}
			if back, err := ParseSize(got); err != nil || back != tt.n {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", got, back, err, tt.n)
			}
		})
	}
}

func FuzzParseBroker(f *testing.F) {
	f.Add([]byte(fullBrokerConfig))
	f.Add([]byte("limits: {memory: 4GiB, pids: 16}\n"))
	f.Add([]byte("sandbox_uids: {first: 2146435071, count: 1048576}\n"))
	f.Add([]byte("inbox: {max_unread_bytes: 1.5GiB}\n"))
	f.Add([]byte("limits: &l {pids: 64}\ninbox: *l\n"))
	f.Add([]byte("limits: {memory: 8589934592GiB}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := ParseBroker(data)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || err.Error() == "" {
				t.Fatalf("error %v (%T) is not an *Error with text", err, err)
			}
			if b != nil {
				t.Fatal("a refused config must come back nil")
			}
			return
		}
		if err := b.Validate(); err != nil {
			t.Fatalf("accepted config does not validate: %v", err)
		}
		if r := b.SandboxUIDs; r.Contains(nobodyUID) || r.Contains(noUID16) || uint64(r.First)+uint64(r.Count)-1 > MaxSandboxUID {
			t.Fatalf("accepted uid range %+v", r)
		}
	})
}

// yamlBlocks returns the ```yaml blocks of a doc page.
func yamlBlocks(t *testing.T, path string) []string {
	t.Helper()
	return codeBlocks(t, path, "yaml")
}

// codeBlocks returns the fenced blocks of a doc page in language lang.
func codeBlocks(t *testing.T, path, lang string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllStringSubmatch(string(data), -1) {
		out = append(out, m[1])
	}
	if len(out) == 0 {
		t.Fatalf("%s has no %s blocks", path, lang)
	}
	return out
}

// TestDocExamples keeps the doc pages' examples valid: every block of
// docs/broker-config.md parses as broker.yaml (its complete example is the
// default config), and docs/config.md's complete example and `limits`
// examples parse as a repository config (its other blocks are fragments
// that name agents and services defined elsewhere).
func TestDocExamples(t *testing.T) {
	for i, block := range yamlBlocks(t, "../../docs/broker-config.md") {
		b, err := ParseBroker([]byte(block))
		if err != nil {
			t.Errorf("broker-config.md block %d: %v\n%s", i, err, block)
			continue
		}
		if i == 0 && !reflect.DeepEqual(b, DefaultBroker()) {
			t.Errorf("broker-config.md's complete example is not the default: %+v", b)
		}
	}
	for i, block := range yamlBlocks(t, "../../docs/config.md") {
		if i != 0 && !strings.HasPrefix(block, "limits:") {
			continue
		}
		if _, err := Parse([]byte(block)); err != nil {
			t.Errorf("config.md block %d: %v\n%s", i, err, block)
		}
	}
}

// TestGrantDocExamples keeps docs/grants.md honest: its first JSON block is
// grant.Default() and every block is a valid grant document.
func TestGrantDocExamples(t *testing.T) {
	for i, block := range codeBlocks(t, "../../docs/grants.md", "json") {
		g, err := grant.Parse([]byte(block))
		if err != nil {
			t.Errorf("grants.md block %d: %v\n%s", i, err, block)
			continue
		}
		if i == 0 && !reflect.DeepEqual(g, grant.Default()) {
			t.Errorf("grants.md's default grant is not grant.Default(): %+v", g)
		}
	}
}
