// Command jailbee (also installed as jb) is the orchestration broker, the
// host commands, and the inbox client used inside sandboxes. The same
// binary is the local backend's launcher and sandbox supervisor, and the
// in-sandbox side of git transfers (hidden commands starting with "_").
package main

import (
	"context"
	"os"
	"path/filepath"

	"agentbox/internal/agentprobe"
	"agentbox/internal/backend/incus"
	"agentbox/internal/backend/local/unit"
	"agentbox/internal/cli"
	"agentbox/internal/gitx"
	"agentbox/internal/outboxread"
	"agentbox/internal/warmtar"
)

func main() {
	if len(os.Args) > 1 {
		// Hidden commands run before the command tree: the supervisor is a
		// sandbox's pid 1 and must start with nothing but its descriptors.
		switch arg := os.Args[1]; {
		case arg == "_sandbox-init":
			os.Exit(unit.InitMain())
		case arg == "_sandbox-launch":
			os.Exit(unit.LaunchMain())
		case incus.IsHelperCommand(arg):
			os.Exit(incus.HelperMain(os.Args[1:]))
		case gitx.IsHelperCommand(arg):
			os.Exit(gitx.HelperMain(os.Args[1:]))
		case agentprobe.IsHelperCommand(arg):
			os.Exit(agentprobe.HelperMain(os.Args[1:]))
		case outboxread.IsHelperCommand(arg):
			os.Exit(outboxread.HelperMain(os.Args[1:]))
		case warmtar.IsHelperCommand(arg):
			os.Exit(warmtar.HelperMain(os.Args[1:]))
		}
	}
	name := filepath.Base(os.Args[0])
	if name != "jb" {
		name = "jailbee"
	}
	os.Exit(cli.Run(context.Background(), name, os.Args[1:], cli.Deps{
		OpenBackend: openBackend,
		BuildImage:  buildImage,
		Stdin:       os.Stdin,
		Stdout:      os.Stdout,
		Stderr:      os.Stderr,
	}))
}
