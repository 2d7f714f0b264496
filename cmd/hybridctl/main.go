// Command hybridctl is the Hybrid CCM command-line tool. The commands live in
// internal/cli; this file only runs them.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.NewRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hybridctl:", err)
		os.Exit(1)
	}
}
