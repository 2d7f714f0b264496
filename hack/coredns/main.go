// Command coredns is CoreDNS (github.com/coredns/coredns, unmodified) built
// with only the plugins the Corefile that Talos deploys uses, for the test
// cluster's cluster DNS (test/fleet runs it as Talos does). hack/coredns.sh
// builds it into a cache outside the repository.
//
// Left out on purpose: forward. Talos' Corefile forwards every name outside
// the cluster domain to the node's resolvers; nothing the test cluster runs
// may reach beyond this machine, so this CoreDNS answers the cluster's names
// and nothing else, and a Corefile that names forward is refused at start
// (unknown directive) instead of silently not forwarding.
//
// It is a module of its own (not part of the repository's module): its
// dependencies are CoreDNS's, pinned by this directory's go.sum.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// The plugins of Talos' Corefile, less forward. Each registers itself
	// under its directive's name (prometheus is plugin/metrics).
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives are the plugins above in the order a request passes them:
// CoreDNS's own order (core/dnsserver's Directives) with every other
// plugin left out, so that the Corefile may name only these.
var directives = []string{
	"reload",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
	"loop",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
