// Command apid is the control planes' apid of the talos-ccm benchmark: a
// process of its own (as apid is on a control-plane machine) whose CPU time
// the benchmark reports beside talos-ccm's, on the same cores as the API
// server. Each listener is one control plane's apid (talosnode.Forwarder):
// it passes every request through to the machine its "node" metadata names,
// frames undecoded as Talos's apid proxies them, over a mutual-TLS
// connection of its own per machine, to the simulated machines' apid (the
// benchmark's talosnode endpoint).
//
//	apid -credentials FILE -nodes HOST:PORT -listen ADDR[,ADDR...] [-cpuprofile FILE]
//
// It prints "listening ADDR ..." (the addresses bound, port 0 resolved) once
// it serves, and on SIGTERM or SIGINT "forwarded ADDR=N ..." (the requests
// each listener forwarded) before it exits.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

func main() {
	creds := flag.String("credentials", "", "the apid credentials (talosnode.ApidCredentials.WriteFile)")
	nodes := flag.String("nodes", "", "the machines' apid (host:port)")
	listen := flag.String("listen", "", "comma-separated addresses, one per control plane")
	profile := flag.String("cpuprofile", "", "write a CPU profile of its whole life to this file")
	flag.Parse()
	if *profile != "" {
		f, err := os.Create(*profile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "apid:", err)
			os.Exit(1)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	if err := run(*creds, *nodes, strings.Split(*listen, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "apid:", err)
		os.Exit(1)
	}
}

func run(credsPath, nodes string, listen []string) error {
	creds, err := talosnode.ReadApidCredentials(credsPath)
	if err != nil {
		return err
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	var fwds []*talosnode.Forwarder
	var addrs []string
	for _, a := range listen {
		lis, err := net.Listen("tcp", a)
		if err != nil {
			return err
		}
		f, err := talosnode.NewForwarder(creds, nodes)
		if err != nil {
			return err
		}
		go func() { _ = f.Serve(lis) }()
		fwds = append(fwds, f)
		addrs = append(addrs, lis.Addr().String())
	}
	fmt.Println("listening", strings.Join(addrs, " "))
	<-stop
	counts := make([]string, len(fwds))
	for i, f := range fwds {
		f.Stop()
		counts[i] = fmt.Sprintf("%s=%d", addrs[i], f.Forwarded())
	}
	fmt.Println("forwarded", strings.Join(counts, " "))
	return nil
}
