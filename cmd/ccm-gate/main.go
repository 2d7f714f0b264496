// Command ccm-gate is the node-view proxy sidecar of a native CCM: the CCM uses
// it as its API server and sees only the nodes of its own platform
// (coordinator/gate/proxy).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/internal/version"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
)

// defaultMemoryLimit is a soft limit for the Go runtime (GOMEMLIMIT overrides).
const defaultMemoryLimit = 32 << 20

func main() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	opts := proxy.DefaultServerOptions()
	fs := pflag.NewFlagSet("ccm-gate", pflag.ExitOnError)
	opts.BindFlags(fs)
	printVersion := fs.Bool("version", false, "Print the version and exit.")
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	_ = fs.Parse(os.Args[1:])
	if *printVersion {
		fmt.Println(version.Line("ccm-gate"))
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithName("ccm-gate"))
	if err := proxy.Serve(ctx, opts, nil); err != nil {
		fmt.Fprintln(os.Stderr, "ccm-gate:", err)
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
