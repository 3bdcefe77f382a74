// Command branchbox is the managed runtime: see internal/managed/cli for
// the command tree and docs/branchbox.md for the contract.
package main

import (
	"os"

	"agentbox/internal/managed/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], cli.ProcessEnv()))
}
