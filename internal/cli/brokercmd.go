package cli

import (
	"errors"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"agentbox/internal/broker"
)

func newBrokerCmd(deps Deps) *cobra.Command {
	var state, kind, logLevel string
	var insecure bool
	c := &cobra.Command{
		Use:   "broker [--state DIR] [--backend local] [--insecure-no-sandbox]",
		Short: "Run the orchestration broker in the foreground",
		Long: `Run the orchestration broker in the foreground until interrupted.

The broker keeps broker.db (SQLite) in the state dir, serves the host admin
socket <state>/admin.sock (owner only) for the host commands, and one socket
per orchestrator or child at <state>/sock/<uuid>.<random>/broker.sock. It
refuses to start while another broker holds the state dir.

The local backend runs sandboxes under bubblewrap. Without bubblewrap it is
refused unless --insecure-no-sandbox, which runs commands directly on the
host with JAILBEE_ORCHESTRATION_SOCKET set (no isolation at all).`,
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
			be, err := deps.OpenBackend(BackendOptions{Kind: kind, StateDir: dir, Insecure: insecure})
			if err != nil {
				return exitf(ExitFailed, "%v", err)
			}
			b, err := broker.Open(broker.Config{StateDir: dir, Backend: be, Logger: log, Insecure: insecure})
			if errors.Is(err, broker.ErrLocked) {
				return exitf(ExitFailed, "another broker holds the state dir")
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
	c.Flags().StringVar(&kind, "backend", "local", "sandbox backend: local (bubblewrap)")
	c.Flags().BoolVar(&insecure, "insecure-no-sandbox", false, "local backend without bubblewrap: no isolation")
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return c
}
