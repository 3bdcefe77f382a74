package compose_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"agentbox/internal/managed/compose"
	"agentbox/internal/managed/policy"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

const (
	appImage = "registry.example/app@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	dbImage  = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

// source is a repository's Compose file with everything the facade must
// replace: builds, host binds, ports, env files, a root primary, and a
// connector (whose keys are never run).
const source = `services:
  app:
    build: .
    image: app:latest
    user: "0"
    ports: ["8080:80"]
    expose: ["9000"]
    env_file: [.env]
    cap_drop: [NET_RAW]
    volumes:
      - ./src:/src
      - /etc:/host-etc:ro
    environment:
      PRICE: "5$$"
    depends_on: [db]
  db:
    image: postgres:16
    user: "0"
    volumes: ["dbdata:/var/lib/postgresql/data", "/srv:/srv"]
    ports: ["5432:5432"]
    environment:
      PRICE: "5$$"
  cloudflared:
    image: cloudflare/cloudflared
    volumes: ["/root/.cloudflared:/etc/cloudflared"]
    devices: ["/dev/net/tun:/dev/net/tun"]
    cap_add: [NET_ADMIN]
volumes:
  dbdata: {}
`

func TestFacadeOverTheSource(t *testing.T) {
	ctx := context.Background()
	files := []compose.File{{Path: "compose.yaml", Data: []byte(source)}}
	p, err := compose.Check(ctx, t.TempDir(), files)
	if err != nil {
		t.Fatal(err)
	}
	spool := compose.SpoolVolumeName("run-1", "requests")
	plan := compose.FacadePlan{
		Images:    map[string]string{"app": appImage, "db": dbImage},
		Primary:   "app",
		Workspace: compose.Bind{Source: "/srv/worktrees/task-$1", Target: "/workspaces/task"},
		Leases:    []compose.Bind{{Source: "/run/branchbox/managed/run-1/evidence", Target: "/run/branchbox/leases/evidence"}},
		Spools:    []compose.Volume{{Name: spool, Target: "/run/branchbox/tool-requests/requests"}},
		Seccomp:   "/run/branchbox/managed/run-1/seccomp.json",
		User:      "1000:1000",
	}
	facade, err := compose.Facade(p, plan)
	if err != nil {
		t.Fatal(err)
	}
	// What Compose makes of the source with the facade last, interpolation
	// on (as it runs), no profile enabled.
	model, err := loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  t.TempDir(),
		Environment: types.Mapping{},
		ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: []byte(source)}, {Filename: "facade.yaml", Content: facade}},
	}, func(o *loader.Options) {
		o.SetProjectName(compose.ProjectName("run-1", "/run/m.json", "/srv/wt"), true)
		o.SkipResolveEnvironment = true
	})
	if err != nil {
		t.Fatalf("load the source and the facade: %v\n%s", err, facade)
	}
	app, db := model.Services["app"], model.Services["db"]
	for name, svc := range map[string]types.ServiceConfig{"app": app, "db": db} {
		if svc.Image != plan.Images[name] || svc.Build != nil || svc.PullPolicy != "never" {
			t.Errorf("%s: image %q build %v pull %q", name, svc.Image, svc.Build, svc.PullPolicy)
		}
		if len(svc.Ports)+len(svc.Expose)+len(svc.EnvFiles)+len(svc.Devices)+len(svc.Secrets)+len(svc.Configs)+len(svc.VolumesFrom) > 0 {
			t.Errorf("%s: host-facing keys left: %+v %v %v %v", name, svc.Ports, svc.Expose, svc.EnvFiles, svc.Devices)
		}
	}
	confined := []string{"seccomp=" + plan.Seccomp, policy.NoNewPrivileges}
	for name, svc := range map[string]types.ServiceConfig{"app": app, "db": db} {
		if !reflect.DeepEqual(svc.SecurityOpt, confined) || !reflect.DeepEqual(svc.CapDrop, []string{"ALL"}) ||
			svc.Cgroup != "private" || svc.Privileged {
			t.Errorf("%s: security_opt %v cap_drop %v cgroup %q privileged %v", name, svc.SecurityOpt, svc.CapDrop, svc.Cgroup, svc.Privileged)
		}
		if core := svc.Ulimits["core"]; len(svc.Ulimits) != 1 || core == nil || core.Single != 0 || core.Soft != 0 || core.Hard != 0 {
			t.Errorf("%s: ulimits %v, want core dumps off (core 0, soft and hard)", name, svc.Ulimits)
		}
	}
	if len(app.CapAdd) != 0 || app.User != plan.User {
		t.Errorf("app: cap_add %v user %q, want none and the consumer", app.CapAdd, app.User)
	}
	if len(db.Volumes) != 0 || !reflect.DeepEqual(db.CapAdd, policy.ServiceCapabilities) || db.User != "0" {
		t.Errorf("db: volumes %+v cap_add %v user %q", db.Volumes, db.CapAdd, db.User)
	}
	want := []types.ServiceVolumeConfig{
		{Type: "bind", Source: "/srv/worktrees/task-$1", Target: "/workspaces/task"},
		{Type: "bind", Source: "/run/branchbox/managed/run-1/evidence", Target: "/run/branchbox/leases/evidence", ReadOnly: true},
		{Type: "volume", Source: spool, Target: "/run/branchbox/tool-requests/requests"},
	}
	if len(app.Volumes) != len(want) {
		t.Fatalf("app volumes: %+v", app.Volumes)
	}
	for i, w := range want {
		got := app.Volumes[i]
		if got.Type != w.Type || got.Source != w.Source || got.Target != w.Target || got.ReadOnly != w.ReadOnly {
			t.Errorf("app volume %d: %+v, want %+v", i, got, w)
		}
	}
	// The primary's environment is its image's (the Dev Containers CLI
	// runs a root shell with it); another service's is kept as written.
	if len(app.Environment) != 0 {
		t.Errorf("app environment: %v, want none of the repository's", app.Environment)
	}
	if db.Environment["PRICE"] == nil || *db.Environment["PRICE"] != "5$" {
		t.Errorf("db environment kept as written: %v", db.Environment)
	}
	if _, ok := model.Services["cloudflared"]; ok {
		t.Error("the connector is enabled")
	}
	if c, ok := model.DisabledServices["cloudflared"]; !ok || !reflect.DeepEqual(c.Profiles, []string{compose.DisabledProfile}) || len(c.Volumes) != 0 {
		t.Errorf("the connector: %+v", c)
	}
	if v := model.Volumes[spool]; v.Name != spool {
		t.Errorf("spool volume: %+v", v)
	}
	// A project name and volume names are deterministic and distinct.
	name := compose.ProjectName("run-1", "/run/m.json", "/srv/wt")
	if again := compose.ProjectName("run-1", "/run/m.json", "/srv/wt"); name != again ||
		name == compose.ProjectName("run-2", "/run/m.json", "/srv/wt") ||
		compose.SpoolVolumeName("run-1", "a") == compose.SpoolVolumeName("run-1", "b") {
		t.Error("names are not deterministic or not distinct")
	}
}

func TestNames(t *testing.T) {
	// Known answers, computed apart: sha256("r\x00/m\x00/w") and
	// sha256("r\x00l"), cut to 24 and 32 hex digits.
	if got := compose.ProjectName("r", "/m", "/w"); got != "branchbox-55f403840da07b36e7660fba" {
		t.Errorf("ProjectName = %q", got)
	}
	if got := compose.SpoolVolumeName("r", "l"); got != "branchbox-tool-requests-d5a7b1bd5990bc72e08166eb653028e0" {
		t.Errorf("SpoolVolumeName = %q", got)
	}
}

func TestFacadeRefuses(t *testing.T) {
	p, err := compose.Check(context.Background(), t.TempDir(), []compose.File{{Path: "compose.yaml", Data: []byte(source)}})
	if err != nil {
		t.Fatal(err)
	}
	ok := compose.FacadePlan{Images: map[string]string{"app": appImage, "db": dbImage}, Primary: "app",
		Workspace: compose.Bind{Source: "/w", Target: "/workspaces/w"}, Seccomp: "/s.json", User: "1000:1000"}
	for _, tc := range []struct {
		name   string
		change func(*compose.FacadePlan)
		want   string
	}{
		{"a connector as primary", func(p *compose.FacadePlan) { p.Primary = "cloudflared" }, "not a runnable service"},
		{"a service without its image", func(p *compose.FacadePlan) { p.Images = map[string]string{"app": appImage} }, `"db" has no image`},
		{"no seccomp profile", func(p *compose.FacadePlan) { p.Seccomp = "" }, "seccomp"},
		{"no consumer", func(p *compose.FacadePlan) { p.User = "" }, "consumer"},
	} {
		plan := ok
		tc.change(&plan)
		if _, err := compose.Facade(p, plan); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestOmittedServices: an omitted service is not runnable, needs no
// image, and the facade disables it; the primary and a name that is not
// a runnable service cannot be omitted.
func TestOmittedServices(t *testing.T) {
	ctx := context.Background()
	files := []compose.File{{Path: "compose.yaml", Data: []byte(source)}}
	p, err := compose.Check(ctx, t.TempDir(), files)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Omit([]string{"db"}, "app"); err != nil {
		t.Fatal(err)
	}
	var r *compose.Refusal
	if err := p.CheckRunnable(); !errors.As(err, &r) || r.Where != "compose.yaml: services.app.depends_on.db" || r.Rule != `"db" is not a bound service` {
		t.Fatalf("app depends on the omitted db: %v", err)
	}
	// The rest without the dependency.
	noDeps := strings.Replace(source, "    depends_on: [db]\n", "", 1)
	files = []compose.File{{Path: "compose.yaml", Data: []byte(noDeps)}}
	if p, err = compose.Check(ctx, t.TempDir(), files); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{{"app"}, {"cloudflared"}, {"nosuch"}} {
		q, _ := compose.Check(ctx, t.TempDir(), files)
		var r *compose.Refusal
		if err := q.Omit(bad, "app"); !errors.As(err, &r) {
			t.Errorf("Omit(%q): %v", bad, err)
		}
	}
	if err := p.Omit([]string{"db"}, "app"); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Runnable, []string{"app"}) || !reflect.DeepEqual(p.Omitted, []string{"db"}) {
		t.Fatalf("runnable %q omitted %q", p.Runnable, p.Omitted)
	}
	facade, err := compose.Facade(p, compose.FacadePlan{
		Images: map[string]string{"app": appImage}, Primary: "app",
		Workspace: compose.Bind{Source: "/w", Target: "/workspaces/w"}, Seccomp: "/s.json", User: "1000:1000",
	})
	if err != nil {
		t.Fatal(err)
	}
	model, err := loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir: t.TempDir(), Environment: types.Mapping{},
		ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: []byte(noDeps)}, {Filename: "facade.yaml", Content: facade}},
	}, func(o *loader.Options) {
		o.SetProjectName("p", true)
		o.SkipResolveEnvironment = true
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := model.Services["db"]; ok {
		t.Fatal("the omitted service is enabled")
	}
	if db, ok := model.DisabledServices["db"]; !ok || len(db.Ports)+len(db.Volumes) != 0 {
		t.Fatalf("the omitted service: %+v", db)
	}
}

// TestReplacedKeys: every key of the source the facade replaces is
// listed, file by file, with what runs instead; the primary's user and
// environment are, db's are kept; the connector's keys are never run and not listed.
func TestReplacedKeys(t *testing.T) {
	files := []compose.File{{Path: "compose.yaml", Data: []byte(source)},
		{Path: ".devcontainer/compose.dev.yaml", Data: []byte("services:\n  db:\n    build: ./db\n")}}
	p, err := compose.Check(context.Background(), t.TempDir(), files)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range p.Replaced("app") {
		got = append(got, r.String())
	}
	why := func(file, path, because string) string {
		return file + ": services." + path + ": replaced by the managed launch: " + because
	}
	ports := "no port is published but the assignment's published_ports, through loopback proxies"
	mounts := "no mount of the repository's (the primary gets exactly the workspace, the signed leases and the spools)"
	want := []string{
		why("compose.yaml", "app.build", "nothing is built"),
		why("compose.yaml", "app.cap_drop", "every capability is dropped but the policy's"),
		why("compose.yaml", "app.env_file", "no host file is read"),
		why("compose.yaml", "app.environment", "the primary service runs with its image's environment only (the Dev Containers CLI starts a root shell in it with that environment)"),
		why("compose.yaml", "app.expose", ports),
		why("compose.yaml", "app.image", "the service runs the image service_images binds"),
		why("compose.yaml", "app.ports", ports),
		why("compose.yaml", "app.user", "the primary service runs as the workspace consumer"),
		why("compose.yaml", "app.volumes", mounts),
		why("compose.yaml", "db.image", "the service runs the image service_images binds"),
		why("compose.yaml", "db.ports", ports),
		why("compose.yaml", "db.volumes", mounts),
		why(".devcontainer/compose.dev.yaml", "db.build", "nothing is built"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Replaced:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestOmittedServiceBehindAProfile: a service behind a profile is a
// runnable service to omit like any other, and the facade resets its
// env_file, which Compose would otherwise read on the host when it loads
// every profile (as the Dev Containers CLI's config does).
func TestOmittedServiceBehindAProfile(t *testing.T) {
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), "never-read")
	src := base + "  evil:\n    image: y\n    profiles: [p]\n    env_file: " + missing + "\n"
	files := []compose.File{{Path: "compose.yaml", Data: []byte(src)}}
	p, err := compose.Check(ctx, t.TempDir(), files)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Runnable, []string{"app", "evil"}) {
		t.Fatalf("runnable %q, want app and evil", p.Runnable)
	}
	if err := p.Omit([]string{"evil"}, "app"); err != nil {
		t.Fatal(err)
	}
	facade, err := compose.Facade(p, compose.FacadePlan{
		Images: map[string]string{"app": appImage}, Primary: "app",
		Workspace: compose.Bind{Source: "/w", Target: "/workspaces/w"}, Seccomp: "/s.json", User: "1000:1000",
	})
	if err != nil {
		t.Fatal(err)
	}
	load := func(files ...types.ConfigFile) error {
		_, err := loader.LoadWithContext(ctx, types.ConfigDetails{WorkingDir: t.TempDir(), Environment: types.Mapping{}, ConfigFiles: files},
			func(o *loader.Options) {
				o.SetProjectName("p", true)
				o.Profiles = []string{"*"}
			})
		return err
	}
	source := types.ConfigFile{Filename: "compose.yaml", Content: []byte(src)}
	// Without the facade, loading every profile reads the env_file.
	if err := load(source); err == nil || !strings.Contains(err.Error(), "never-read") {
		t.Fatalf("the source alone: %v, want its env_file read", err)
	}
	if err := load(source, types.ConfigFile{Filename: "facade.yaml", Content: facade}); err != nil {
		t.Fatalf("with the facade: %v", err)
	}
}
