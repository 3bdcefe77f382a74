package assignment_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentbox/internal/managed/assignment"
	mt "agentbox/internal/managed/managedtest"
)

var now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func opts() assignment.Options {
	return assignment.Options{Now: now, Runtime: &assignment.Identity{UID: 10001, GID: 10001}}
}

// set walks a dotted path ("leases.3.materializations.0.sha256") and sets
// the leaf; the value del removes it.
type deletion struct{}

var del = deletion{}

func set(doc map[string]any, p string, v any) {
	parts := strings.Split(p, ".")
	var cur any = doc
	for i, k := range parts {
		last := i == len(parts)-1
		switch c := cur.(type) {
		case map[string]any:
			if last {
				if _, ok := v.(deletion); ok {
					delete(c, k)
				} else {
					c[k] = v
				}
				return
			}
			if _, ok := c[k]; !ok {
				c[k] = map[string]any{}
			}
			cur = c[k]
		case []any:
			n, err := strconv.Atoi(k)
			if err != nil {
				panic(p)
			}
			if last {
				c[n] = v
				return
			}
			cur = c[n]
		default:
			panic(p)
		}
	}
}

// secretish are values the refusal cases plant; no message may echo them.
var secretish = []string{mt.Secret, "hunter2-token", "sk-live", "ghp_"}

type refusal struct {
	name   string
	mutate func(d map[string]any)
	raw    string // used instead of the base document when set
	field  string // exact Field of the *Error
	reason string // substring of the Reason
}

func with(p string, v any) func(map[string]any) {
	return func(d map[string]any) { set(d, p, v) }
}

func all(fs ...func(map[string]any)) func(map[string]any) {
	return func(d map[string]any) {
		for _, f := range fs {
			f(d)
		}
	}
}

func v3(d map[string]any) {
	d["version"] = "3"
	d["workspace_consumer"] = map[string]any{"uid": 1000, "gid": 1000}
}

func v1(d map[string]any) {
	d["version"] = "1"
	delete(d, "service_images")
	delete(d, "port_proxy_image")
	d["leases"] = []any{
		map[string]any{"lease_id": "model", "scope": "model-identity", "consumer": "codex"},
		map[string]any{"lease_id": "git", "scope": "source-control-identity", "consumer": "git-helper"},
	}
}

// swapLeases swaps leases i and j.
func swapLeases(i, j int) func(map[string]any) {
	return func(doc map[string]any) {
		ls := doc["leases"].([]any)
		ls[i], ls[j] = ls[j], ls[i]
	}
}

func leaseWith(i int, kv ...any) func(map[string]any) {
	return func(d map[string]any) {
		l := mt.Lease(d, i)
		for k := 0; k < len(kv); k += 2 {
			if _, ok := kv[k+1].(deletion); ok {
				delete(l, kv[k].(string))
			} else {
				l[kv[k].(string)] = kv[k+1]
			}
		}
	}
}

func addLease(l map[string]any) func(map[string]any) {
	return func(d map[string]any) { d["leases"] = append(d["leases"].([]any), l) }
}

const run = "/run/branchbox/managed/run-1"

func image(ref string) func(map[string]any) { return with("service_images.app", ref) }

var refusals = []refusal{
	// Decoding.
	{name: "empty document", raw: "", reason: "document is empty"},
	{name: "not an object", raw: `["version"]`, reason: "must be a JSON object"},
	{name: "malformed", raw: `{"version": "2",}`, reason: "malformed JSON"},
	{name: "trailing data", raw: `{"version":"2"} {}`, reason: "data after the JSON document"},
	{name: "trailing garbage", raw: `{"version":"2"}x`, reason: "data after the JSON document"},
	{name: "invalid UTF-8", raw: "{\"version\":\"2\",\"run_id\":\"\xff\"}", reason: "not valid UTF-8"},
	{name: "duplicate top-level key", raw: `{"version":"2","version":"2"}`, reason: "duplicate key (member 2)"},
	{name: "duplicate key hidden by an escape", raw: `{"version":"2","run_id":"a","run\u005fid":"b"}`, reason: "duplicate key (member 3)"},
	{name: "duplicate lease key", mutate: nil, raw: strings.Replace(string(mt.Marshal(mt.Base())), `"lease_id":"model",`, `"lease_id":"model","lease_id":"model2",`, 1), field: "leases[0]", reason: "duplicate key"},
	{name: "duplicate service image", raw: strings.Replace(string(mt.Marshal(mt.Base())), `"service_images":{`, `"service_images":{"app":"x",`, 1), field: "service_images", reason: "duplicate key"},
	{name: "duplicate materialization key", raw: strings.Replace(string(mt.Marshal(mt.Base())), `"environment_name":"SOURCE_DELIVERY_TOKEN",`, `"environment_name":"SOURCE_DELIVERY_TOKEN","environment_name":"OTHER",`, 1), field: "leases[1].materializations[0]", reason: "duplicate key"},
	{name: "unknown top-level field", mutate: with("api_token", "hunter2-token"), field: "", reason: "unknown field"},
	{name: "unknown field named like a secret", mutate: with("sk-live-0123", "x"), field: "", reason: "unknown field"},
	{name: "unknown repository field", mutate: with("repository.branch", "main"), field: "repository", reason: "unknown field"},
	{name: "unknown lease field", mutate: leaseWith(0, "secret", "hunter2-token"), field: "leases[0]", reason: "unknown field"},
	{name: "unknown materialization field", mutate: with("leases.1.materializations.0.value", "hunter2-token"), field: "leases[1].materializations[0]", reason: "unknown field"},
	{name: "unknown consumer field", mutate: all(v3, with("workspace_consumer.name", "x")), field: "workspace_consumer", reason: "unknown field"},
	{name: "unknown port field", mutate: with("published_ports.0.proto", "tcp"), field: "published_ports[0]", reason: "unknown field"},
	{name: "version as number", mutate: with("version", 2), field: "version", reason: "must be a string, not a number"},
	{name: "unsupported version", mutate: with("version", "4"), field: "version", reason: "unsupported version"},
	{name: "version with prefix", mutate: with("version", "v2"), field: "version", reason: "unsupported version"},
	{name: "missing version", mutate: with("version", del), field: "version", reason: "is required"},
	{name: "null required field", mutate: with("run_id", nil), field: "run_id", reason: "must be a string, not null"},
	{name: "missing run_id", mutate: with("run_id", del), field: "run_id", reason: "is required"},
	{name: "missing lease_id", mutate: with("lease_id", del), field: "lease_id", reason: "is required"},
	{name: "missing outer_runtime_id", mutate: with("outer_runtime_id", del), field: "outer_runtime_id", reason: "is required"},
	{name: "missing workspace", mutate: with("workspace", del), field: "workspace", reason: "is required"},
	{name: "missing repository", mutate: with("repository", del), field: "repository", reason: "is required"},
	{name: "missing revision", mutate: with("repository.revision", del), field: "repository.revision", reason: "is required"},
	{name: "missing task_branch", mutate: with("task_branch", del), field: "task_branch", reason: "is required"},
	{name: "missing tunnel_placement", mutate: with("tunnel_placement", del), field: "tunnel_placement", reason: "is required"},
	{name: "leases not an array", mutate: with("leases", map[string]any{}), field: "leases", reason: "must be an array"},
	{name: "lease not an object", mutate: with("leases", []any{"x"}), field: "leases[0]", reason: "must be an object"},
	{name: "empty optional string", mutate: with("port_proxy_image", ""), field: "port_proxy_image", reason: "must not be empty"},
	{name: "expires_at not RFC 3339", mutate: leaseWith(0, "expires_at", "2099-01-01"), field: "leases[0].expires_at", reason: "RFC 3339"},
	{name: "consumer_uid negative", mutate: leaseWith(5, "consumer_uid", -1), field: "leases[5].consumer_uid", reason: "non-negative integer"},
	{name: "consumer_uid fraction", mutate: leaseWith(5, "consumer_uid", 1000.5), field: "leases[5].consumer_uid", reason: "non-negative integer"},
	{name: "consumer_uid exponent", raw: strings.Replace(string(mt.Marshal(mt.Base())), `"consumer_uid":1000`, `"consumer_uid":1e3`, 1), field: "leases[5].consumer_uid", reason: "non-negative integer"},
	{name: "consumer_uid as string", mutate: leaseWith(5, "consumer_uid", "1000"), field: "leases[5].consumer_uid", reason: "must be an integer"},
	{name: "consumer_uid zero", mutate: leaseWith(5, "consumer_uid", 0), field: "leases[5].consumer_uid", reason: "non-root"},
	{name: "consumer_uid too large", mutate: leaseWith(5, "consumer_uid", 2147483648), field: "leases[5].consumer_uid", reason: "at most 2147483647"},
	{name: "port above 65535", mutate: with("published_ports.0.host", 65536), field: "published_ports[0].host", reason: "at most 65535"},

	// Identity fields.
	{name: "run_id with a slash", mutate: with("run_id", "run/1"), field: "run_id", reason: "must use only"},
	{name: "run_id dot-dot", mutate: with("run_id", ".."), field: "run_id", reason: "must not be"},
	{name: "run_id empty", mutate: with("run_id", ""), field: "run_id", reason: "1-128"},
	{name: "run_id too long", mutate: with("run_id", strings.Repeat("r", 129)), field: "run_id", reason: "1-128"},
	{name: "lease_id with space", mutate: with("lease_id", "a b"), field: "lease_id", reason: "must use only"},
	{name: "outer_runtime_id URL", mutate: with("outer_runtime_id", "https://x"), field: "outer_runtime_id", reason: "must use only"},
	{name: "relative workspace", mutate: with("workspace", "workspaces"), field: "workspace", reason: "absolute, clean"},
	{name: "unclean workspace", mutate: with("workspace", "/workspaces/../etc"), field: "workspace", reason: "absolute, clean"},
	{name: "repository outside workspace", mutate: with("repository.path", "/srv/repo"), field: "repository.path", reason: "below it"},
	{name: "short revision", mutate: with("repository.revision", "0123abc"), field: "repository.revision", reason: "40 or 64"},
	{name: "non-hex revision", mutate: with("repository.revision", strings.Repeat("g", 40)), field: "repository.revision", reason: "40 or 64"},
	{name: "branch with dot-dot", mutate: with("task_branch", "a..b"), field: "task_branch", reason: "Git branch name"},
	{name: "branch as option", mutate: with("task_branch", "-x"), field: "task_branch", reason: "Git branch name"},
	{name: "branch with space", mutate: with("task_branch", "a b"), field: "task_branch", reason: "Git branch name"},
	{name: "branch lock", mutate: with("task_branch", "a.lock/b"), field: "task_branch", reason: "Git branch name"},
	{name: "branch too long", mutate: with("task_branch", strings.Repeat("b", 256)), field: "task_branch", reason: "1-255"},
	{name: "tunnel placement inner", mutate: with("tunnel_placement", "inner"), field: "tunnel_placement", reason: "must be \"outer\""},

	// Published ports.
	{name: "host port zero", mutate: with("published_ports.0.host", 0), field: "published_ports[0].host", reason: "1 to 65535"},
	{name: "runtime port zero", mutate: with("published_ports.0.runtime", 0), field: "published_ports[0].runtime", reason: "1 to 65535"},
	{name: "duplicate host port", mutate: with("published_ports", []any{map[string]any{"host": 1, "runtime": 2}, map[string]any{"host": 1, "runtime": 3}}), field: "published_ports[1].host", reason: "unique"},
	{name: "duplicate runtime port", mutate: with("published_ports", []any{map[string]any{"host": 1, "runtime": 2}, map[string]any{"host": 3, "runtime": 2}}), field: "published_ports[1].runtime", reason: "unique"},
	{name: "missing runtime port", mutate: with("published_ports.0.runtime", del), field: "published_ports[0].runtime", reason: "is required"},

	// Service images and the port proxy image.
	{name: "service images in version 1", mutate: all(v1, with("service_images", map[string]any{"app": mt.Image})), field: "service_images", reason: "version \"2\" or \"3\""},
	{name: "bad service name", mutate: with("service_images", map[string]any{"-app": mt.Image}), field: "service_images", reason: "start with a letter or digit"},
	{name: "interpolated image", mutate: image("registry.example/team/${APP}@sha256:" + mt.Digest), field: "service_images.app", reason: "interpolation"},
	{name: "URL-shaped image", mutate: image("https://registry.example/team/app@sha256:" + mt.Digest), field: "service_images.app", reason: "URL-shaped"},
	{name: "tag-only image", mutate: image("registry.example/team/app:latest"), field: "service_images.app", reason: "tag-only"},
	{name: "uppercase image", mutate: image("registry.example/Team/app@sha256:" + mt.Digest), field: "service_images.app", reason: "lowercase"},
	{name: "uppercase digest", mutate: image("registry.example/team/app@sha256:" + strings.ToUpper(mt.Digest)), field: "service_images.app", reason: "lowercase"},
	{name: "sha512 image", mutate: image("registry.example/team/app@sha512:" + mt.Digest + mt.Digest), field: "service_images.app", reason: "must be sha256"},
	{name: "short digest", mutate: image("registry.example/team/app@sha256:abc"), field: "service_images.app", reason: "64 lowercase"},
	{name: "no registry", mutate: image("app@sha256:" + mt.Digest), field: "service_images.app", reason: "registry and a repository"},
	{name: "docker.io namespace as registry", mutate: image("myorg/app@sha256:" + mt.Digest), field: "service_images.app", reason: "must name a registry host"},
	{name: "proxy image docker.io namespace", mutate: with("port_proxy_image", "myorg/proxy@sha256:"+mt.Digest), field: "port_proxy_image", reason: "must name a registry host"},
	{name: "two @", mutate: image("registry.example/a@b@sha256:" + mt.Digest), field: "service_images.app", reason: "exactly one"},
	{name: "whitespace in image", mutate: image("registry.example/team/app @sha256:" + mt.Digest), field: "service_images.app", reason: "whitespace"},
	{name: "bad registry port", mutate: image("registry.example:0/team/app@sha256:" + mt.Digest), field: "service_images.app", reason: "port"},
	{name: "bad tag", mutate: image("registry.example/team/app:.x@sha256:" + mt.Digest), field: "service_images.app", reason: "tag"},
	{name: "bad path component", mutate: image("registry.example/team/-app@sha256:" + mt.Digest), field: "service_images.app", reason: "path components"},
	{name: "bad local digest", mutate: image("sha256:xyz"), field: "service_images.app", reason: "local content digest"},
	{name: "image not a string", mutate: with("service_images.app", 1), field: "service_images", reason: "must be a string"},
	{name: "proxy image required with ports", mutate: with("port_proxy_image", del), field: "port_proxy_image", reason: "is required"},
	{name: "proxy image in version 1", mutate: all(v1, with("port_proxy_image", mt.Image)), field: "port_proxy_image", reason: "version \"2\" or \"3\""},
	{name: "proxy image tag-only", mutate: with("port_proxy_image", "registry.example/proxy:1"), field: "port_proxy_image", reason: "tag-only"},

	// Workspace consumer.
	{name: "version 3 without consumer", mutate: with("version", "3"), field: "workspace_consumer", reason: "required in version \"3\""},
	{name: "consumer in version 2", mutate: with("workspace_consumer", map[string]any{"uid": 1000, "gid": 1000}), field: "workspace_consumer", reason: "needs version \"3\""},
	{name: "root consumer uid", mutate: all(v3, with("workspace_consumer.uid", 0)), field: "workspace_consumer.uid", reason: "non-root"},
	{name: "root consumer gid", mutate: all(v3, with("workspace_consumer.gid", 0)), field: "workspace_consumer.gid", reason: "non-root"},
	{name: "consumer uid is the runtime's", mutate: all(v3, with("workspace_consumer.uid", 10001), leaseWith(5, "consumer_uid", 10001)), field: "workspace_consumer.uid", reason: "runtime's own uid"},
	{name: "consumer gid is the runtime's", mutate: all(v3, with("workspace_consumer.gid", 10001)), field: "workspace_consumer.gid", reason: "runtime's own gid"},
	{name: "consumer missing gid", mutate: all(v3, with("workspace_consumer.gid", del)), field: "workspace_consumer.gid", reason: "is required"},
	{name: "tool-request uid differs from consumer", mutate: all(v3, with("workspace_consumer.uid", 1001)), field: "leases[5].consumer_uid", reason: "workspace_consumer.uid"},

	// Workspace folder and omitted services.
	{name: "folder in version 2", mutate: all(with("workspace_folder", "/workspaces/task"), with("omitted_services", []any{})), field: "workspace_folder", reason: "version \"3\""},
	{name: "folder without service images", mutate: all(v3, with("service_images", del), with("port_proxy_image", del), with("workspace_folder", "/workspaces/task"), with("omitted_services", []any{})), field: "workspace_folder", reason: "preloaded service_images"},
	{name: "folder without omitted", mutate: all(v3, with("workspace_folder", "/workspaces/task")), field: "omitted_services", reason: "is required"},
	{name: "omitted without folder", mutate: all(v3, with("omitted_services", []any{})), field: "omitted_services", reason: "needs workspace_folder"},
	{name: "folder reserved main", mutate: all(v3, with("workspace_folder", "/workspaces/main"), with("omitted_services", []any{})), field: "workspace_folder", reason: "reserved"},
	{name: "folder outside workspaces", mutate: all(v3, with("workspace_folder", "/srv/task"), with("omitted_services", []any{})), field: "workspace_folder", reason: "below /workspaces/"},
	{name: "folder too deep", mutate: all(v3, with("workspace_folder", "/workspaces/a/b/c/d/e"), with("omitted_services", []any{})), field: "workspace_folder", reason: "1-4 segments"},
	{name: "folder bad segment", mutate: all(v3, with("workspace_folder", "/workspaces/.hidden"), with("omitted_services", []any{})), field: "workspace_folder", reason: "segments must be"},
	{name: "omitted duplicate", mutate: all(v3, with("workspace_folder", "/workspaces/task"), with("omitted_services", []any{"db", "db"})), field: "omitted_services[1]", reason: "unique"},
	{name: "omitted bad name", mutate: all(v3, with("workspace_folder", "/workspaces/task"), with("omitted_services", []any{"db!"})), field: "omitted_services[0]", reason: "may only use"},

	// Lease identities.
	{name: "duplicate lease id", mutate: leaseWith(1, "lease_id", "model"), field: "leases[1].lease_id", reason: "unique"},
	{name: "bad lease id", mutate: leaseWith(1, "lease_id", "a/b"), field: "leases[1].lease_id", reason: "must use only"},
	{name: "unknown scope", mutate: leaseWith(6, "scope", "root-access"), field: "leases[6].scope", reason: "unknown scope"},
	{name: "consumer with equals", mutate: leaseWith(6, "consumer", "TOKEN=hunter2-token"), field: "leases[6].consumer", reason: "NAME=value"},
	{name: "consumer URL", mutate: leaseWith(6, "consumer", "https://x"), field: "leases[6].consumer", reason: "URL"},
	{name: "consumer whitespace", mutate: leaseWith(6, "consumer", "a b"), field: "leases[6].consumer", reason: "whitespace"},
	{name: "consumer control", mutate: leaseWith(6, "consumer", "a\u0085b"), field: "leases[6].consumer", reason: "control"},
	{name: "consumer empty", mutate: leaseWith(6, "consumer", ""), field: "leases[6].consumer", reason: "1-128"},
	{name: "missing scope", mutate: leaseWith(6, "scope", del), field: "leases[6].scope", reason: "is required"},
	{name: "missing consumer", mutate: leaseWith(6, "consumer", del), field: "leases[6].consumer", reason: "is required"},

	// Version 1.
	{name: "v1 provider-environment", mutate: all(v1, addLease(mt.Lease(mt.Base(), 1))), field: "leases[2].scope", reason: "needs version"},
	{name: "v1 shared-directory", mutate: all(v1, addLease(mt.Lease(mt.Base(), 3))), field: "leases[2].scope", reason: "needs version"},
	{name: "v1 tool-endpoint", mutate: all(v1, addLease(mt.Lease(mt.Base(), 4))), field: "leases[2].scope", reason: "needs version"},
	{name: "v1 tool-request", mutate: all(v1, addLease(mt.Lease(mt.Base(), 5))), field: "leases[2].scope", reason: "needs version"},
	{name: "v1 executable", mutate: all(v1, leaseWith(0, "executable", "codex")), field: "leases[0].executable", reason: "fixed provider allowlist"},
	{name: "v1 inherited", mutate: all(v1, leaseWith(0, "inherited_environment", []any{"OPENAI_API_KEY"})), field: "leases[0].inherited_environment", reason: "fixed provider allowlist"},

	// Scope-specific fields.
	{name: "executable on outer lease", mutate: leaseWith(6, "executable", "git"), field: "leases[6].executable", reason: "only model-identity"},
	{name: "inherited on outer lease", mutate: leaseWith(6, "inherited_environment", []any{}), field: "leases[6].inherited_environment", reason: "only model-identity"},
	{name: "consumer_uid on model", mutate: leaseWith(0, "consumer_uid", 1000), field: "leases[0].consumer_uid", reason: "only tool-request"},
	{name: "endpoint on shared", mutate: leaseWith(3, "endpoint_lease_id", "delivery_endpoint"), field: "leases[3].endpoint_lease_id", reason: "only tool-request"},
	{name: "spool on endpoint", mutate: leaseWith(4, "request_spool_target", "/run/branchbox/leases/tool-requests/x"), field: "leases[4].request_spool_target", reason: "only tool-request"},
	{name: "replay policy on provider env", mutate: leaseWith(1, "replay_policy", "exact-digest-replay-v1"), field: "leases[1].replay_policy", reason: "only tool-request"},

	// Expiry.
	{name: "model identity without expiry", mutate: leaseWith(0, "expires_at", del), field: "leases[0].expires_at", reason: "is required for a model-identity"},
	{name: "model identity expired", mutate: leaseWith(0, "expires_at", "2001-01-01T00:00:00Z"), field: "leases[0].expires_at", reason: "expired"},
	{name: "model identity expiring now", mutate: leaseWith(0, "expires_at", "2030-01-01T00:00:00Z"), field: "leases[0].expires_at", reason: "expired"},
	{name: "provider env without expiry", mutate: leaseWith(1, "expires_at", del), field: "leases[1].expires_at", reason: "is required"},
	{name: "shared dir expired", mutate: leaseWith(3, "expires_at", "2001-01-01T00:00:00Z"), field: "leases[3].expires_at", reason: "expired"},
	{name: "endpoint without expiry", mutate: leaseWith(4, "expires_at", del), field: "leases[4].expires_at", reason: "is required"},
	{name: "tool request expired", mutate: leaseWith(5, "expires_at", "2001-01-01T00:00:00+02:00"), field: "leases[5].expires_at", reason: "expired"},
	{name: "credential without expiry", mutate: leaseWith(8, "expires_at", del), field: "leases[8].expires_at", reason: "is required"},

	// Materialization counts per scope.
	{name: "model identity materialized", mutate: with("leases.0.materializations", mt.Lease(mt.Base(), 1)["materializations"]), field: "leases[0].materializations", reason: "stays outside"},
	{name: "source control materialized", mutate: with("leases.6.materializations", mt.Lease(mt.Base(), 1)["materializations"]), field: "leases[6].materializations", reason: "stays outside"},
	{name: "tunnel materialized", mutate: with("leases.7.materializations", mt.Lease(mt.Base(), 1)["materializations"]), field: "leases[7].materializations", reason: "stays outside"},
	{name: "two project environments", mutate: addLease(map[string]any{"lease_id": "project2", "scope": "project-environment", "consumer": "p", "materializations": []any{}}), field: "leases[10].scope", reason: "at most one project-environment"},
	{name: "project environment without file", mutate: with("leases.2.materializations", []any{}), field: "leases[2].materializations", reason: "exactly one"},
	{name: "provider environment empty", mutate: with("leases.1.materializations", []any{}), field: "leases[1].materializations", reason: "at least one"},
	{name: "shared directory twice", mutate: with("leases.3.materializations", []any{mt.Mat(mt.Base(), 3, 0), mt.Mat(mt.Base(), 3, 0)}), field: "leases[3].materializations", reason: "exactly one"},
	{name: "credential empty", mutate: with("leases.8.materializations", []any{}), field: "leases[8].materializations", reason: "exactly one"},
	{name: "tool request empty", mutate: with("leases.5.materializations", []any{}), field: "leases[5].materializations", reason: "exactly one"},

	// Model identities.
	{name: "two model identities for a consumer", mutate: addLease(map[string]any{"lease_id": "model2", "scope": "model-identity", "consumer": "coding-agent", "executable": "other", "expires_at": "2099-01-01T00:00:00Z"}), field: "leases[10].consumer", reason: "at most one model-identity"},
	{name: "model identity without executable", mutate: leaseWith(0, "executable", del), field: "leases[0].executable", reason: "is required"},
	{name: "relative executable path", mutate: leaseWith(0, "executable", "bin/provider"), field: "leases[0].executable", reason: "bare command name"},
	{name: "executable with equals", mutate: leaseWith(0, "executable", "A=hunter2-token"), field: "leases[0].executable", reason: "NAME=value"},
	{name: "duplicate executable", mutate: addLease(map[string]any{"lease_id": "model2", "scope": "model-identity", "consumer": "other", "executable": "provider-cli", "expires_at": "2099-01-01T00:00:00Z"}), field: "leases[10].executable", reason: "unique"},
	{name: "inherited unsorted", mutate: leaseWith(0, "inherited_environment", []any{"B_TOKEN", "A_TOKEN"}), field: "leases[0].inherited_environment[1]", reason: "strictly ascending"},
	{name: "inherited duplicate", mutate: leaseWith(0, "inherited_environment", []any{"A_TOKEN", "A_TOKEN"}), field: "leases[0].inherited_environment[1]", reason: "strictly ascending"},
	{name: "inherited lowercase", mutate: leaseWith(0, "inherited_environment", []any{"token"}), field: "leases[0].inherited_environment[0]", reason: "[A-Z_]"},
	{name: "inherited PATH", mutate: leaseWith(0, "inherited_environment", []any{"PATH"}), field: "leases[0].inherited_environment[0]", reason: "shell variable"},
	{name: "inherited BASH_ENV", mutate: leaseWith(0, "inherited_environment", []any{"BASH_ENV"}), field: "leases[0].inherited_environment[0]", reason: "shell variable"},
	{name: "inherited LD_PRELOAD", mutate: leaseWith(0, "inherited_environment", []any{"LD_PRELOAD"}), field: "leases[0].inherited_environment[0]", reason: "loader variable"},
	{name: "inherited NODE_OPTIONS", mutate: leaseWith(0, "inherited_environment", []any{"NODE_OPTIONS"}), field: "leases[0].inherited_environment[0]", reason: "loader variable"},
	{name: "inherited GIT_SSH_COMMAND", mutate: leaseWith(0, "inherited_environment", []any{"GIT_SSH_COMMAND"}), field: "leases[0].inherited_environment[0]", reason: "git-control variable"},
	{name: "inherited DOCKER_HOST", mutate: leaseWith(0, "inherited_environment", []any{"DOCKER_HOST"}), field: "leases[0].inherited_environment[0]", reason: "container-supervisor variable"},
	{name: "inherited SSH_AUTH_SOCK", mutate: leaseWith(0, "inherited_environment", []any{"SSH_AUTH_SOCK"}), field: "leases[0].inherited_environment[0]", reason: "container-supervisor variable"},
	{name: "inherited BRANCHBOX control", mutate: leaseWith(0, "inherited_environment", []any{"BRANCHBOX_MANAGED_ROOT"}), field: "leases[0].inherited_environment[0]", reason: "branchbox-control variable"},
	{name: "inherited name too long", mutate: leaseWith(0, "inherited_environment", []any{strings.Repeat("A", 129)}), field: "leases[0].inherited_environment[0]", reason: "1-128"},
	{name: "inherited not a string", mutate: leaseWith(0, "inherited_environment", []any{1}), field: "leases[0].inherited_environment[0]", reason: "must be a string"},

	// Materialization sources and targets.
	{name: "relative source", mutate: with("leases.1.materializations.0.source_path", "materializations/x"), field: "leases[1].materializations[0].source_path", reason: "absolute, clean"},
	{name: "unclean source", mutate: with("leases.1.materializations.0.source_path", run+"/materializations/../x"), field: "leases[1].materializations[0].source_path", reason: "absolute, clean"},
	{name: "ambient source", mutate: with("leases.3.materializations.0.source_path", run+"/shared/docker.sock"), field: "leases[3].materializations[0].source_path", reason: "supervisor authority"},
	{name: "secret-path source", mutate: with("leases.3.materializations.0.source_path", run+"/shared/.ssh"), field: "leases[3].materializations[0].source_path", reason: "ambient secret"},
	{name: "file source outside materializations", mutate: with("leases.1.materializations.0.source_path", run+"/token"), field: "leases[1].materializations[0].source_path", reason: "directly in the run's materializations"},
	{name: "file source nested in materializations", mutate: with("leases.1.materializations.0.source_path", run+"/materializations/a/token"), field: "leases[1].materializations[0].source_path", reason: "directly in"},
	{name: "file source of another run", mutate: with("leases.1.materializations.0.source_path", "/run/branchbox/managed/run-2/materializations/token"), field: "leases[1].materializations[0].source_path", reason: "directly in"},
	{name: "shared source outside run", mutate: with("leases.3.materializations.0.source_path", "/run/branchbox/managed/run-2/shared"), field: "leases[3].materializations[0].source_path", reason: "strictly below the run directory"},
	{name: "shared source is the run", mutate: with("leases.3.materializations.0.source_path", run), field: "leases[3].materializations[0].source_path", reason: "strictly below the run directory"},
	{name: "shared source in materializations", mutate: with("leases.3.materializations.0.source_path", run+"/materializations/dir"), field: "leases[3].materializations[0].source_path", reason: "materializations directory"},
	{name: "shared with digest", mutate: with("leases.3.materializations.0.sha256", mt.Digest), field: "leases[3].materializations[0].sha256", reason: "live binding"},
	{name: "shared with name", mutate: with("leases.3.materializations.0.environment_name", "X_TOKEN"), field: "leases[3].materializations[0].environment_name", reason: "only provider-environment"},
	{name: "shared without target", mutate: with("leases.3.materializations.0.target_path", del), field: "leases[3].materializations[0].target_path", reason: "is required"},
	{name: "shared target in endpoint namespace", mutate: with("leases.3.materializations.0.target_path", "/run/branchbox/leases/tool-endpoints/x"), field: "leases[3].materializations[0].target_path", reason: "strictly below /run/branchbox/leases/shared"},
	{name: "shared target is the namespace", mutate: with("leases.3.materializations.0.target_path", "/run/branchbox/leases/shared"), field: "leases[3].materializations[0].target_path", reason: "strictly below"},
	{name: "shared target escapes", mutate: with("leases.3.materializations.0.target_path", "/run/branchbox/leases/shared/../../x"), field: "leases[3].materializations[0].target_path", reason: "clean path"},
	{name: "shared target ambient", mutate: with("leases.3.materializations.0.target_path", "/run/branchbox/leases/shared/run/secrets"), field: "leases[3].materializations[0].target_path", reason: "ambient secret"},
	{name: "endpoint target in shared namespace", mutate: with("leases.4.materializations.0.target_path", "/run/branchbox/leases/shared/x.sock"), field: "leases[4].materializations[0].target_path", reason: "tool-endpoints"},
	{name: "file without digest", mutate: with("leases.1.materializations.0.sha256", del), field: "leases[1].materializations[0].sha256", reason: "is required"},
	{name: "uppercase digest", mutate: with("leases.1.materializations.0.sha256", strings.ToUpper(mt.Digest)), field: "leases[1].materializations[0].sha256", reason: "64 lowercase"},
	{name: "provider value mounted", mutate: with("leases.1.materializations.0.target_path", "/run/branchbox/leases/x"), field: "leases[1].materializations[0].target_path", reason: "never mounted"},
	{name: "provider value without name", mutate: with("leases.1.materializations.0.environment_name", del), field: "leases[1].materializations[0].environment_name", reason: "is required"},
	{name: "provider value reserved name", mutate: with("leases.1.materializations.0.environment_name", "LD_LIBRARY_PATH"), field: "leases[1].materializations[0].environment_name", reason: "loader"},
	{name: "name bound twice for a consumer", mutate: with("leases.1.materializations.0.environment_name", "MODEL_ACCESS_TOKEN"), field: "leases[1].materializations[0].environment_name", reason: "at most once per consumer"},
	// The same with the provider-environment lease first: the check once
	// saw only inherited names of leases before it.
	{name: "name bound twice, value first", mutate: all(with("leases.1.materializations.0.environment_name", "MODEL_ACCESS_TOKEN"), swapLeases(0, 1)), field: "leases[1].inherited_environment[0]", reason: "at most once per consumer"},
	{name: "project env elsewhere", mutate: with("leases.2.materializations.0.target_path", "/run/branchbox/leases/other"), field: "leases[2].materializations[0].target_path", reason: "must be /run/branchbox/leases/project-env"},
	{name: "project env with name", mutate: with("leases.2.materializations.0.environment_name", "X_TOKEN"), field: "leases[2].materializations[0].environment_name", reason: "only provider-environment"},
	{name: "capability target elsewhere", mutate: with("leases.5.materializations.0.target_path", "/run/branchbox/leases/tool-requests/delivery/cap"), field: "leases[5].materializations[0].target_path", reason: ".capability"},
	{name: "credential without target", mutate: with("leases.8.materializations.0.target_path", del), field: "leases[8].materializations[0].target_path", reason: "is required"},
	{name: "credential target in lease root", mutate: with("leases.8.materializations.0.target_path", "/run/branchbox/leases/cred"), field: "leases[8].materializations[0].target_path", reason: "outside /run/branchbox/leases"},
	{name: "credential target at /", mutate: with("leases.8.materializations.0.target_path", "/cred"), field: "leases[8].materializations[0].target_path", reason: "not directly below /"},
	{name: "credential target relative", mutate: with("leases.8.materializations.0.target_path", "cred"), field: "leases[8].materializations[0].target_path", reason: "absolute, clean"},
	{name: "credential target ambient", mutate: with("leases.8.materializations.0.target_path", "/home/agent/.ssh/id"), field: "leases[8].materializations[0].target_path", reason: "ambient secret"},
	{name: "missing source", mutate: with("leases.1.materializations.0.source_path", del), field: "leases[1].materializations[0].source_path", reason: "is required"},

	// Tool requests.
	{name: "tool request without uid", mutate: leaseWith(5, "consumer_uid", del), field: "leases[5].consumer_uid", reason: "is required"},
	{name: "tool request without endpoint", mutate: leaseWith(5, "endpoint_lease_id", del), field: "leases[5].endpoint_lease_id", reason: "is required"},
	{name: "tool request bad endpoint id", mutate: leaseWith(5, "endpoint_lease_id", "a b"), field: "leases[5].endpoint_lease_id", reason: "must use only"},
	{name: "tool request without spool", mutate: leaseWith(5, "request_spool_target", del), field: "leases[5].request_spool_target", reason: "is required"},
	{name: "spool outside namespace", mutate: leaseWith(5, "request_spool_target", "/run/branchbox/leases/shared/delivery"), field: "leases[5].request_spool_target", reason: "strictly below /run/branchbox/leases/tool-requests"},
	{name: "spool is the namespace", mutate: leaseWith(5, "request_spool_target", "/run/branchbox/leases/tool-requests"), field: "leases[5].request_spool_target", reason: "strictly below"},
	{name: "unknown replay policy", mutate: leaseWith(5, "replay_policy", "replay-always"), field: "leases[5].replay_policy", reason: "the only replay policy"},
	{name: "endpoint lease unknown", mutate: leaseWith(5, "endpoint_lease_id", "nope"), field: "leases[5].endpoint_lease_id", reason: "names no lease"},
	{name: "endpoint lease wrong scope", mutate: leaseWith(5, "endpoint_lease_id", "shared_exchange"), field: "leases[5].endpoint_lease_id", reason: "tool-endpoint lease"},
	{name: "endpoint of another consumer", mutate: leaseWith(4, "consumer", "someone-else"), field: "leases[5].endpoint_lease_id", reason: "same consumer"},
	{name: "endpoint expires first", mutate: leaseWith(4, "expires_at", "2098-01-01T00:00:00Z"), field: "leases[5].endpoint_lease_id", reason: "must not expire before"},
	{name: "one endpoint two spools", mutate: addLease(map[string]any{"lease_id": "second_requests", "scope": "tool-request", "consumer": "coding-agent", "consumer_uid": 1000, "endpoint_lease_id": "delivery_endpoint", "request_spool_target": "/run/branchbox/leases/tool-requests/second", "expires_at": "2099-01-01T00:00:00Z", "materializations": []any{map[string]any{"source_path": run + "/materializations/second-capability", "target_path": "/run/branchbox/leases/tool-requests/second/.capability", "sha256": mt.Digest}}}), field: "leases[10].endpoint_lease_id", reason: "at most one request spool"},

	// Consumers and overlaps.
	{name: "provider env without model identity", mutate: leaseWith(1, "consumer", "nobody"), field: "leases[1].consumer", reason: "model-identity"},
	{name: "duplicate sources", mutate: with("leases.8.materializations.0.source_path", run+"/materializations/delivery-token"), field: "leases[8].materializations[0].source_path", reason: "overlaps leases[1].materializations[0].source_path"},
	{name: "nested sources", mutate: with("leases.4.materializations.0.source_path", run+"/shared/exchange/delivery.sock"), field: "leases[4].materializations[0].source_path", reason: "overlaps leases[3].materializations[0].source_path"},
	{name: "duplicate targets", mutate: with("leases.9.materializations.0.target_path", "/run/branchbox/leases/tool-endpoints/delivery.sock"), field: "leases[9].materializations[0].target_path", reason: "overlaps"},
	{name: "nested targets", mutate: with("leases.9.materializations.0.target_path", "/run/branchbox/leases/tool-endpoints/delivery.sock/inner"), field: "leases[9].materializations[0].target_path", reason: "overlaps"},
}

func TestRefusals(t *testing.T) {
	if err := parse(t, mt.Base()); err != nil {
		t.Fatalf("base document refused: %v", err)
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			var data []byte
			if tc.raw != "" || tc.mutate == nil {
				data = []byte(tc.raw)
			} else {
				doc := mt.Base()
				tc.mutate(doc)
				data = mt.Marshal(doc)
			}
			_, err := assignment.Parse(data, opts())
			assertRefusal(t, err, tc.field, tc.reason, data)
		})
	}
}

func parse(t *testing.T, doc map[string]any) error {
	t.Helper()
	_, err := assignment.Parse(mt.Marshal(doc), opts())
	return err
}

// assertRefusal checks the class, the exact field, the reason and that the
// message echoes no value: none of the planted secret markers, and no
// string value of the document of 8 bytes or more.
func assertRefusal(t *testing.T, err error, field, reason string, data []byte) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want refusal %q", reason)
	}
	if !errors.Is(err, assignment.ErrInvalid) {
		t.Fatalf("error %v is not in the ErrInvalid class", err)
	}
	var ae *assignment.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %T is not *assignment.Error", err)
	}
	if ae.Field != field {
		t.Errorf("field = %q, want %q (message %q)", ae.Field, field, err)
	}
	if !strings.Contains(ae.Reason, reason) {
		t.Errorf("reason = %q, want it to contain %q", ae.Reason, reason)
	}
	assertNoValues(t, err.Error(), data)
}

// allowedInMessages are contract constants messages may name.
var allowedInMessages = map[string]bool{
	"exact-digest-replay-v1": true, "/run/branchbox/leases/project-env": true,
	"/run/branchbox/leases": true, "/run/branchbox/leases/shared": true,
	"/run/branchbox/leases/tool-endpoints": true, "/run/branchbox/leases/tool-requests": true,
	"/workspaces": true,
}

func init() {
	for _, sc := range assignment.Scopes {
		allowedInMessages[string(sc)] = true
	}
}

func assertNoValues(t *testing.T, msg string, data []byte) {
	t.Helper()
	for _, s := range secretish {
		if strings.Contains(msg, s) {
			t.Errorf("message %q echoes planted value %q", msg, s)
		}
	}
	var doc any
	if json.Unmarshal(data, &doc) != nil {
		return
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			if len(x) >= 8 && !allowedInMessages[x] && strings.Contains(msg, x) {
				t.Errorf("message %q echoes a document value %q", msg, x)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(doc)
}

func TestSpecExamplesParse(t *testing.T) {
	for _, name := range mt.SpecExamples {
		for _, version := range []string{"2", "3"} {
			t.Run(name+"/v"+version, func(t *testing.T) {
				doc := mt.Example(name)
				if version == "3" {
					v3(doc)
				}
				a, err := assignment.Parse(mt.Marshal(doc), opts())
				if err != nil {
					t.Fatal(err)
				}
				if a.RunDir != "/run/branchbox/managed/run-id" {
					t.Errorf("RunDir = %q", a.RunDir)
				}
			})
		}
	}
}

func TestStatesAndKinds(t *testing.T) {
	a, err := assignment.Parse(mt.Marshal(mt.Base()), opts())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		assignment.StateOuter, assignment.StateProviderEnv, assignment.StatePrimaryEnvFile,
		assignment.StatePrimaryReadOnlyDir, assignment.StateTrustedRelayEndpoint,
		assignment.StateConsumerRequestSpool, assignment.StateOuter, assignment.StateOuter,
		assignment.StateMaterialized, assignment.StatePrimaryReadOnlyEndpoint,
	}
	for i, l := range a.Leases {
		if l.State != want[i] {
			t.Errorf("lease %d state = %q, want %q", i, l.State, want[i])
		}
	}
	kinds := map[int]assignment.SourceKind{1: assignment.SourceFile, 3: assignment.SourceSharedDirectory,
		4: assignment.SourceSocket, 5: assignment.SourceFile, 9: assignment.SourceEndpoint}
	for i, k := range kinds {
		if got := a.Leases[i].Materializations[0].Kind; got != k {
			t.Errorf("lease %d kind = %q, want %q", i, got, k)
		}
	}
}

func TestAcceptedVariants(t *testing.T) {
	for name, mutate := range map[string]func(map[string]any){
		"version 3":               v3,
		"version 1":               v1,
		"null optional fields":    all(with("port_proxy_image", nil), with("published_ports", []any{}), with("workspace_consumer", nil), leaseWith(6, "expires_at", nil)),
		"no leases":               with("leases", del),
		"local content digest":    image("sha256:" + mt.Digest),
		"tag and registry port":   image("registry.example:5000/team/app:v1.2_x@sha256:" + mt.Digest),
		"localhost registry":      image("localhost/app@sha256:" + mt.Digest),
		"path separators":         image("registry.example/a__b/c-d/e.f/g--h@sha256:" + mt.Digest),
		"64-hex revision":         with("repository.revision", mt.Digest),
		"uppercase revision":      with("repository.revision", strings.ToUpper(managedRevision())),
		"repository is workspace": with("repository.path", "/workspaces"),
		"ports without images":    all(with("service_images", del), with("port_proxy_image", del)),
		"proxy without images":    with("service_images", del),
		"workspace folder":        all(v3, with("workspace_folder", "/workspaces/a/b.c/d_e/f-g"), with("omitted_services", []any{"db", "cache"})),
		"empty omitted services":  all(v3, with("workspace_folder", "/workspaces/task"), with("omitted_services", []any{})),
		"no replay policy":        leaseWith(5, "replay_policy", del),
		"endpoint outlives":       leaseWith(4, "expires_at", "2100-01-01T00:00:00Z"),
		"offset expiry":           leaseWith(0, "expires_at", "2099-01-01T02:00:00+02:00"),
		"expired outer lease":     leaseWith(6, "expires_at", "2001-01-01T00:00:00Z"),
		"expired v1 model":        all(v1, leaseWith(0, "expires_at", "2001-01-01T00:00:00Z")),
		"absolute executable":     leaseWith(0, "executable", "/usr/bin/env"),
		"no inherited names":      leaseWith(0, "inherited_environment", del),
		"GITHUB_TOKEN inherited":  leaseWith(0, "inherited_environment", []any{"GITHUB_TOKEN", "MODEL_ACCESS_TOKEN"}),
		"materializations absent": leaseWith(6, "materializations", del),
	} {
		t.Run(name, func(t *testing.T) {
			doc := mt.Base()
			mutate(doc)
			if err := parse(t, doc); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func managedRevision() string { return "abcdef0123456789abcdef0123456789abcdef01" }

func TestLiveness(t *testing.T) {
	doc := mt.Base()
	set(doc, "leases.6.expires_at", "2001-01-01T00:00:00Z")
	a, err := assignment.Parse(mt.Marshal(doc), opts())
	if err != nil {
		t.Fatal(err)
	}
	if a.Leases[6].Live(now) {
		t.Error("expired outer lease reported live")
	}
	if !a.Leases[7].Live(now) {
		t.Error("lease without expiry reported expired")
	}
	exp := *a.Leases[0].ExpiresAt
	if a.Leases[0].Live(exp) || !a.Leases[0].Live(exp.Add(-time.Nanosecond)) {
		t.Error("a lease is live strictly before its expiry only")
	}
}

func TestManagedRootOption(t *testing.T) {
	doc := mt.Base()
	o := opts()
	o.ManagedRoot = "/srv/managed"
	_, err := assignment.Parse(mt.Marshal(doc), o)
	assertRefusal(t, err, "leases[1].materializations[0].source_path", "directly in the run's materializations", mt.Marshal(doc))
	o.ManagedRoot = "relative"
	if _, err := assignment.Parse(mt.Marshal(doc), o); err == nil {
		t.Error("relative managed root accepted")
	}
	if _, err := assignment.Parse(mt.Marshal(doc), assignment.Options{}); err == nil {
		t.Error("validation without a time accepted")
	}
}

func TestSummaryHoldsNoSecrets(t *testing.T) {
	a, err := assignment.Parse(mt.Marshal(mt.Base()), opts())
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(a.Summarize(now))
	for _, bad := range []string{mt.FileDigest, "/materializations/", "source_path", "sha256\""} {
		if strings.Contains(string(out), bad) {
			t.Errorf("summary holds %q: %s", bad, out)
		}
	}
	s := a.Summarize(now)
	if len(s.Leases) != 10 || s.Leases[1].EnvironmentNames[0] != "SOURCE_DELIVERY_TOKEN" || !s.Leases[0].Live {
		t.Errorf("summary = %+v", s.Leases)
	}
}

func TestErrorFormatting(t *testing.T) {
	e := assignment.Errorf("", "document is empty")
	if e.Error() != "document is empty" {
		t.Error(e.Error())
	}
	e = assignment.Errorf("leases[0]", "x %d", 1)
	if e.Error() != "leases[0]: x 1" {
		t.Error(e.Error())
	}
	if fmt.Sprint(e) != e.Error() {
		t.Error("Sprint differs from Error")
	}
}
