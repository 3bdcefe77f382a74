package cli

import (
	"errors"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"agentbox/internal/agentbin"
	"agentbox/internal/broker"
	"agentbox/internal/config"
	"agentbox/internal/forge"
	"agentbox/internal/orchestrate"
	"agentbox/internal/secfs"
	"agentbox/internal/store"
)

// BrokerConfigFile is the broker's config in its state dir.
const BrokerConfigFile = "broker.yaml"

func newBrokerCmd(deps Deps) *cobra.Command {
	var state, kind, logLevel, configFile, incusProject, incusPool, image string
	var noLimits bool
	c := &cobra.Command{
		Use:   "broker [--state DIR] [--config FILE] [--backend local|incus [--incus-project P] [--incus-pool POOL] [--image ALIAS]] [--no-limits]",
		Short: "Run the orchestration broker in the foreground",
		Long: `Run the orchestration broker in the foreground until interrupted.

The broker keeps broker.db (SQLite) in the state dir, serves the host admin
socket <state>/admin.sock (owner only) for the host commands, and one socket
per orchestrator or child at <state>/sock/<uuid>.<random>/broker.sock. Its
start line ("broker serving") names the state dir and its pid. It refuses
to start while another broker holds the state dir, naming that broker's pid.

With --backend local (the default), sandboxes run under bubblewrap as one
unit each, which outlives the broker: stopping or killing the broker ends no
sandbox, and the next broker finds them running. A broker run as root gives
each sandbox its own unprivileged host uid; otherwise sandboxes run as the
broker's uid. With --backend incus, sandboxes are unprivileged Incus system
containers made from the image 'jailbee image build' makes (docs/incus.md).

Every sandbox gets the installed agents ('jailbee agent install'; the release
broker.yaml pins, else the built-in one) read-only on its PATH, from its next
start; the broker logs each agent that is not installed, which cannot run.

Per-sandbox limits (tasks, memory, CPU weight), the inbox quota and read
retention, and each orchestrator's caps (children, queued spawns, unread
items of its whole tree) come from <state>/broker.yaml (or --config FILE;
see docs/broker-config.md), with a repository's .jailbee/config.yaml
'limits' overriding the per-sandbox limits. Once a minute the broker
removes read items past the retention and gives broker.db's free space
back. Where cgroups
cannot be used (a broker that is not root on a cgroup v1 host) the broker
refuses to start unless --no-limits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := stateDir(state)
			if err != nil {
				return err
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return exitf(ExitUsage, "bad --log-level")
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			if err := secfs.EnsurePrivateDir(dir); err != nil {
				return exitf(ExitFailed, "state dir %s: %v", dir, err)
			}
			if configFile == "" {
				configFile = filepath.Join(dir, BrokerConfigFile)
			}
			cfg, err := loadBrokerConfig(configFile)
			if err != nil {
				return err
			}
			model, err := modelConfig(cfg.Model)
			if err != nil {
				return exitf(ExitFailed, "broker config: %v", err)
			}
			if model == nil {
				log.Info("no model key configured (broker.yaml model.api_key_file or api_key_env): sandboxes get no model socket")
			}
			publish, err := publishConfig(cfg, log)
			if err != nil {
				return exitf(ExitFailed, "broker config: %v", err)
			}
			be, err := deps.OpenBackend(BackendOptions{Kind: kind, StateDir: dir, NoLimits: noLimits, IncusProject: incusProject, IncusPool: incusPool, Image: image,
				AgentBinaries: agentBinaries(dir, cfg, log)})
			if err != nil {
				return exitf(ExitFailed, "%v", err)
			}
			sandboxes := orchestrate.Sandboxes{Limits: cfg.Limits, NoLimits: noLimits, Mounts: cfg.Mounts}
			if os.Geteuid() == 0 {
				sandboxes.HostUIDs = &cfg.SandboxUIDs
			}
			b, err := broker.Open(broker.Config{
				StateDir: dir, Backend: be, Logger: log, Sandboxes: sandboxes,
				InboxQuota: store.Quota{MaxUnreadItems: cfg.Inbox.MaxUnreadItems, MaxUnreadBytes: cfg.Inbox.MaxUnreadBytes,
					TreeMaxUnreadItems: cfg.Tree.MaxUnreadItems, TreeMaxUnreadBytes: cfg.Tree.MaxUnreadBytes},
				ReadRetention: time.Duration(cfg.Inbox.ReadRetentionDays) * 24 * time.Hour,
				Caps: orchestrate.Caps{MaxChildren: cfg.Tree.MaxChildren, MaxQueuedSpawns: cfg.Tree.MaxQueuedSpawns,
					MaxSpawnsPerHour: cfg.Tree.MaxSpawnsPerHour},
				TreeMaxConns: cfg.Tree.MaxConnections,
				Model:        model,
				Publish:      publish,
			})
			if errors.Is(err, broker.ErrLocked) {
				if pid := broker.LockHolder(dir); pid > 0 {
					return exitf(ExitFailed, "another broker holds the state dir %s (pid %d)", dir, pid)
				}
				return exitf(ExitFailed, "another broker holds the state dir %s", dir)
			}
			if err != nil {
				return exitf(ExitFailed, "%v", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := b.Serve(); err != nil {
				b.Close()
				return exitf(ExitFailed, "%v", err)
			}
			<-ctx.Done()
			log.Info("broker stopping")
			return b.Close()
		},
	}
	addStateFlag(c, &state)
	c.Flags().StringVar(&configFile, "config", "", "broker config (default <state>/broker.yaml; missing: the defaults)")
	c.Flags().StringVar(&kind, "backend", "local", "sandbox backend: local (bubblewrap) or incus (system containers)")
	c.Flags().StringVar(&incusProject, "incus-project", "", "Incus project of the sandboxes (default: Incus's default project)")
	c.Flags().StringVar(&incusPool, "incus-pool", "", "Incus storage pool of new sandboxes (default: the profile's; a btrfs pool makes creation fast, see docs/incus.md)")
	c.Flags().StringVar(&image, "image", "", "Incus image alias of new sandboxes (default: jailbee)")
	c.Flags().BoolVar(&noLimits, "no-limits", false, "run sandboxes without per-sandbox resource limits (no cgroups)")
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return c
}

// agentBinaries maps each known agent whose pinned release (broker.yaml,
// else the built-in one) is installed to its binary, for the backend to
// put on every sandbox's PATH. One not installed is left out and logged:
// the broker runs without it.
func agentBinaries(stateDir string, cfg *config.Broker, log *slog.Logger) map[string]string {
	out := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(agentbin.Agents)) {
		a := agentbin.Agents[name]
		version := cfg.AgentVersions[name] // "": the built-in default
		inst, err := agentbin.Find(stateDir, name, version)
		if err != nil {
			log.Warn(name+" agents cannot run until `jailbee agent install "+name+"`", "agent", name, "err", err)
			continue
		}
		// From the state dir, not the recorded path: the dir may have moved.
		out[name] = filepath.Join(agentbin.BinDir(stateDir, name, inst.Version), filepath.Base(a.File))
	}
	return out
}

// publishConfig is what publish manifests need of broker.yaml: the forge
// with its token, and the budget. Without a token publishing is refused
// (nil), and the broker runs.
func publishConfig(cfg *config.Broker, log *slog.Logger) (*orchestrate.Publishing, error) {
	if !cfg.Forge.HasToken() {
		log.Info("no forge token configured (broker.yaml forge.token_file or token_env): publish manifests are refused")
		return nil, nil
	}
	token, err := forge.LoadToken(cfg.Forge)
	if err != nil {
		return nil, err
	}
	gh, err := forge.New(forge.Config{APIURL: cfg.Forge.APIURL, Token: token})
	if err != nil {
		return nil, err
	}
	return &orchestrate.Publishing{Forge: gh, ActionsPerHour: cfg.Publish.ActionsPerHour, BytesPerHour: cfg.Publish.BytesPerHour, GitURL: cfg.Forge.GitURL, Token: token}, nil
}

// loadBrokerConfig reads broker.yaml; a missing file is the defaults.
func loadBrokerConfig(path string) (*config.Broker, error) {
	data, err := secfs.ReadFileNoFollow(path, config.MaxBrokerConfigBytes)
	if errors.Is(err, os.ErrNotExist) {
		return config.DefaultBroker(), nil
	}
	if err != nil {
		return nil, exitf(ExitFailed, "broker config %s: %v", path, err)
	}
	cfg, err := config.ParseBroker(data)
	if err != nil {
		return nil, exitf(ExitFailed, "broker config %s: %v", path, err)
	}
	return cfg, nil
}
