// Command jailbee (also installed as jb) is the orchestration broker, the
// host commands, and the inbox client used inside sandboxes.
package main

import (
	"context"
	"os"
	"path/filepath"

	"agentbox/internal/cli"
)

func main() {
	name := filepath.Base(os.Args[0])
	if name != "jb" {
		name = "jailbee"
	}
	os.Exit(cli.Run(context.Background(), name, os.Args[1:], cli.Deps{
		OpenBackend: openBackend,
		Stdin:       os.Stdin,
		Stdout:      os.Stdout,
		Stderr:      os.Stderr,
	}))
}
