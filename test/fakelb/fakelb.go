// Package fakelb is a load-balancer cloud API for tests and the demo, on
// loopback: test/testccm's LoadBalancer implementation (the cloud half of
// k8s.io/cloud-provider's service controller) creates, updates, reads and
// deletes one load balancer per Service through it, and tests read what each
// cloud was asked to build (which nodes a load balancer targets).
//
// The API, under /loadbalancers/<provider>/<namespace>/<name>:
//
//	PUT    {"nodes": ["<node>", ...], "ports": [80, ...]} -> 200 {"ip": "...", "nodes": [...]}
//	GET    -> 200 the same, or 404
//	DELETE -> 204 (also when absent)
//
// Addresses come from 203.0.113.0/24 (TEST-NET-3), one per load balancer, and
// are never reused.
package fakelb

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Prefix is the path every request of this API starts with.
const Prefix = "/loadbalancers/"

// LoadBalancer is one load balancer of one cloud.
type LoadBalancer struct {
	// Provider is the cloud (the CCM's --cloud-provider).
	Provider string `json:"provider"`
	// Service is namespace/name.
	Service string `json:"service"`
	// IP is its address.
	IP string `json:"ip"`
	// Nodes are the node names it targets, sorted.
	Nodes []string `json:"nodes"`
	// Ports are the Service ports it listens on.
	Ports []int32 `json:"ports,omitempty"`
	// Updates counts the PUTs after the first.
	Updates int `json:"updates"`
}

// Cloud holds the load balancers of every provider. Its zero value is not
// usable: call New.
type Cloud struct {
	mu   sync.Mutex
	lbs  map[string]*LoadBalancer
	next int
	// Deleted are provider/namespace/name of load balancers deleted, in order.
	deleted []string
}

// New returns an empty Cloud.
func New() *Cloud { return &Cloud{lbs: map[string]*LoadBalancer{}, next: 1} }

// LoadBalancers returns a copy of every load balancer, ordered by provider
// and Service.
func (c *Cloud) LoadBalancers() []LoadBalancer {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]LoadBalancer, 0, len(c.lbs))
	for _, lb := range c.lbs {
		cp := *lb
		cp.Nodes = slices.Clone(lb.Nodes)
		cp.Ports = slices.Clone(lb.Ports)
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b LoadBalancer) int {
		return strings.Compare(a.Provider+"/"+a.Service, b.Provider+"/"+b.Service)
	})
	return out
}

// Get returns the load balancer of a provider for a Service (namespace/name).
func (c *Cloud) Get(provider, service string) (LoadBalancer, bool) {
	for _, lb := range c.LoadBalancers() {
		if lb.Provider == provider && lb.Service == service {
			return lb, true
		}
	}
	return LoadBalancer{}, false
}

// Deleted returns provider/namespace/name of every deleted load balancer.
func (c *Cloud) Deleted() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.deleted)
}

type request struct {
	Nodes []string `json:"nodes"`
	Ports []int32  `json:"ports"`
}

// ServeHTTP implements the API.
func (c *Cloud) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, Prefix), "/")
	if !strings.HasPrefix(r.URL.Path, Prefix) || len(parts) != 3 || slices.Contains(parts, "") {
		http.Error(w, "want "+Prefix+"<provider>/<namespace>/<name>", http.StatusNotFound)
		return
	}
	provider, service := parts[0], parts[1]+"/"+parts[2]
	key := provider + "/" + service
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		lb, ok := c.lbs[key]
		if !ok {
			http.Error(w, "no load balancer "+key, http.StatusNotFound)
			return
		}
		writeJSON(w, lb)
	case http.MethodPut:
		var req request
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			http.Error(w, "body: "+err.Error(), http.StatusBadRequest)
			return
		}
		nodes := slices.Clone(req.Nodes)
		slices.Sort(nodes)
		lb, ok := c.lbs[key]
		if !ok {
			if c.next > 254 {
				http.Error(w, "out of addresses", http.StatusInsufficientStorage)
				return
			}
			lb = &LoadBalancer{Provider: provider, Service: service, IP: fmt.Sprintf("203.0.113.%d", c.next)}
			c.next++
			c.lbs[key] = lb
		} else {
			lb.Updates++
		}
		lb.Nodes, lb.Ports = nodes, req.Ports
		writeJSON(w, lb)
	case http.MethodDelete:
		if _, ok := c.lbs[key]; ok {
			delete(c.lbs, key)
			c.deleted = append(c.deleted, key)
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, r.Method+" not supported", http.StatusMethodNotAllowed)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
