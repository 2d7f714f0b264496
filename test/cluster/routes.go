package cluster

import (
	"context"
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// keepRoutes routes every node's pod CIDRs to its address, in the caller's
// namespace (so that the API server's replies reach pods) and in every other
// node (pod to pod across nodes), the way a simple CNI's route daemon does.
// The nodes are neighbours on the bridge: nothing is forwarded by the host.
// It follows the pod CIDRs the nodes are given (by talos-ccm's IPAM) and
// machines that boot again with an empty routing table.
func (c *Cluster) keepRoutes(ctx context.Context) {
	defer close(c.routesDone)
	applied := map[string]string{} // "<namespace>/<cidr>" → via
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			continue // the API server may be restarting
		}
		cidrs := map[string][]string{}
		for _, o := range list.Items {
			cidrs[o.Name] = o.Spec.PodCIDRs
		}
		nodes := c.Nodes()
		// namespaces: "" is the caller's; a node's is named by its holder's PID
		// (a new one after every boot).
		type target struct {
			key  string
			argv []string
			node *Node
		}
		targets := []target{{key: "host", argv: nil}}
		for _, n := range nodes {
			n.mu.Lock()
			if n.holder != nil {
				targets = append(targets, target{key: strconv.Itoa(n.init), argv: n.nsenter(n.init), node: n})
			}
			n.mu.Unlock()
		}
		for _, n := range nodes {
			for _, cidr := range cidrs[n.Name] {
				for _, tg := range targets {
					if tg.node == n {
						continue // its own CIDR is on its cni0 bridge
					}
					k := tg.key + "/" + cidr
					if applied[k] == n.IP.String() {
						continue
					}
					argv := append(append([]string{}, tg.argv...), "ip", "route", "replace", cidr, "via", n.IP.String())
					if err := run(argv...); err != nil {
						c.logf("route %s via %s in %s: %v", cidr, n.IP, tg.key, err)
						continue
					}
					applied[k] = n.IP.String()
				}
			}
		}
	}
}

// String names the node for logs.
func (n *Node) String() string { return fmt.Sprintf("%s (%s)", n.Name, n.IP) }
