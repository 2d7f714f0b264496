package cluster

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// live are the clusters of this process that are up: on SIGINT or SIGTERM
// they go down (the host restored) before the process exits, as a test
// binary or the demo would otherwise exit at once and leave them to the
// next Recover.
var (
	liveMu   sync.Mutex
	live     = map[*Cluster]bool{}
	watching bool
)

func register(c *Cluster) {
	liveMu.Lock()
	defer liveMu.Unlock()
	live[c] = true
	if watching {
		return
	}
	watching = true
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		liveMu.Lock()
		cs := make([]*Cluster, 0, len(live))
		for c := range live {
			cs = append(cs, c)
		}
		liveMu.Unlock()
		for _, c := range cs {
			fmt.Fprintf(os.Stderr, "cluster: %s: taking the cluster down\n", s)
			if err := c.Down(); err != nil {
				fmt.Fprintf(os.Stderr, "cluster: down: %v\n", err)
			}
		}
		code := 128 + int(s.(syscall.Signal))
		os.Exit(code)
	}()
}

func unregister(c *Cluster) {
	liveMu.Lock()
	defer liveMu.Unlock()
	delete(live, c)
}
