package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"agentbox/internal/agentbin"
)

// AgentCacheEnv names a directory that keeps verified agent downloads,
// so a machine downloads each version once.
const AgentCacheEnv = "JAILBEE_AGENT_CACHE"

func newAgentCmd(deps Deps) *cobra.Command {
	c := &cobra.Command{
		Use:   "agent",
		Short: "Install and list the coding agents sandboxes run",
		Long: `Coding agents (today: claude, the Claude Code CLI) are installed once per host,
under the state dir by version, and every sandbox sees them read-only: no
sandbox downloads anything.`,
	}
	var state, version, cache string
	install := &cobra.Command{
		Use:   "install AGENT [--version V]",
		Short: "Install an agent's pinned release (a no-op when it is installed)",
		Long: fmt.Sprintf(`Install AGENT's release V (default: the pin in <state>/broker.yaml,
agents.AGENT.version, else %s for claude): the host's npm client
looks its platform package up (so npm's registry and proxy settings apply),
the package is downloaded, checked against the registry's sha512 integrity,
and its native binary kept at <state>/agents/AGENT/V/bin. No node is needed
to run it. Installing a version that is there does nothing.

--cache DIR (or $%s) keeps verified downloads by digest, so several
state dirs on one machine download a version once.`, agentbin.ClaudeDefaultVersion, AgentCacheEnv),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := stateDir(state)
			if err != nil {
				return err
			}
			if cache == "" {
				cache = os.Getenv(AgentCacheEnv)
			}
			if version == "" {
				cfg, err := loadBrokerConfig(filepath.Join(dir, BrokerConfigFile))
				if err != nil {
					return err
				}
				version = cfg.AgentVersions[args[0]] // "" : the built-in default
			}
			o := agentbin.Options{StateDir: dir, CacheDir: cache, Progress: cmd.OutOrStdout()}
			inst, present, err := agentbin.Install(cmd.Context(), o, args[0], version)
			if err != nil {
				return exitf(ExitFailed, "%v", err)
			}
			if present {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s is installed already\n", inst.Agent, inst.Version)
			}
			fmt.Fprintln(cmd.OutOrStdout(), inst.Path)
			return nil
		},
	}
	addStateFlag(install, &state)
	install.Flags().StringVar(&version, "version", "", "the release to install (default: broker.yaml's pin, else the built-in one)")
	install.Flags().StringVar(&cache, "cache", "", "keep verified downloads here (default $"+AgentCacheEnv+")")

	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the installed agents",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := stateDir(state)
			if err != nil {
				return err
			}
			list, err := agentbin.List(dir)
			if err != nil {
				return exitf(ExitFailed, "%v", err)
			}
			if asJSON {
				if list == nil {
					list = []agentbin.Installed{}
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AGENT\tVERSION\tSIZE\tINSTALLED\tPATH")
			for _, i := range list {
				fmt.Fprintf(tw, "%s\t%s\t%d MB\t%s\t%s\n", i.Agent, i.Version, i.Size>>20, i.InstalledAt.Format("2006-01-02 15:04"), i.Path)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	addStateFlag(ls, &state)
	c.AddCommand(install, ls)
	return c
}
