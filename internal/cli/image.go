package cli

import (
	"github.com/spf13/cobra"
)

func newImageCmd(deps Deps) *cobra.Command {
	c := &cobra.Command{
		Use:   "image",
		Short: "Manage the Incus sandbox image",
	}
	var o ImageOptions
	build := &cobra.Command{
		Use:   "build [--alias A] [--incus-project P] [--force]",
		Short: "Build the Incus sandbox image (once, before the first incus broker)",
		Long: `Build the default sandbox image for the Incus backend and import it into
Incus: Debian bookworm (debootstrap minbase, from this machine's own Debian
mirror as its apt sources name it: no image server needed) with git, tmux
and ca-certificates, an init that stops at once, the agent user (uid 1000)
and an empty /workspace it owns.

Run it once, as root, on a machine with Incus running and debootstrap
installed; it takes a minute or two. It is idempotent: an alias that holds
this version of the recipe already is kept (--force rebuilds it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if deps.BuildImage == nil {
				return exitf(ExitFailed, "this build has no Incus backend")
			}
			o.Progress = cmd.OutOrStdout()
			if err := deps.BuildImage(cmd.Context(), o); err != nil {
				return exitf(ExitFailed, "image build: %v", err)
			}
			return nil
		},
	}
	build.Flags().StringVar(&o.Alias, "alias", "", "image alias (default jailbee)")
	build.Flags().StringVar(&o.IncusProject, "incus-project", "", "Incus project (default: Incus's default project)")
	build.Flags().BoolVar(&o.Force, "force", false, "rebuild even when the alias is up to date")
	c.AddCommand(build)
	return c
}
