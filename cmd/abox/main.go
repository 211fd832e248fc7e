// Command abox runs AI coding agents in filtered, isolated virtual machines.
package main

import (
	"os"

	"github.com/abox-dev/abox/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
