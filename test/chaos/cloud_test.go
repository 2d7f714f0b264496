package chaos

import (
	"context"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	cloudprovider "k8s.io/cloud-provider"
)

// dangerousCloud is the worst cloud a native CCM can have: it says that no
// instance exists, for every node it is asked about. Behind an ungated CCM that
// deletes every NotReady node of the cluster.
type dangerousCloud struct {
	// exists and shutdown are the answers to InstanceExists and
	// InstanceShutdown (both false: the dangerous cloud).
	exists, shutdown bool

	mu sync.Mutex
	// asked are the nodes InstanceExists was called for.
	asked map[string]int
}

var (
	_ cloudprovider.Interface   = (*dangerousCloud)(nil)
	_ cloudprovider.InstancesV2 = (*dangerousCloud)(nil)
)

func newDangerousCloud() *dangerousCloud { return &dangerousCloud{asked: map[string]int{}} }

// newShutdownCloud says that every instance exists and is shut down: the
// controller taints NotReady nodes instead of deleting them.
func newShutdownCloud() *dangerousCloud {
	return &dangerousCloud{exists: true, shutdown: true, asked: map[string]int{}}
}

func (c *dangerousCloud) InstanceExists(_ context.Context, node *corev1.Node) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked[node.Name]++
	return c.exists, nil
}

func (c *dangerousCloud) InstanceShutdown(context.Context, *corev1.Node) (bool, error) {
	return c.shutdown, nil
}

func (c *dangerousCloud) InstanceMetadata(context.Context, *corev1.Node) (*cloudprovider.InstanceMetadata, error) {
	return nil, cloudprovider.InstanceNotFound
}

// seen returns the sorted names of the nodes the cloud was asked about.
func (c *dangerousCloud) seen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.asked {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (c *dangerousCloud) Initialize(cloudprovider.ControllerClientBuilder, <-chan struct{}) {}
func (c *dangerousCloud) LoadBalancer() (cloudprovider.LoadBalancer, bool)                  { return nil, false }
func (c *dangerousCloud) Instances() (cloudprovider.Instances, bool)                        { return nil, false }
func (c *dangerousCloud) InstancesV2() (cloudprovider.InstancesV2, bool)                    { return c, true }
func (c *dangerousCloud) Zones() (cloudprovider.Zones, bool)                                { return nil, false }
func (c *dangerousCloud) Clusters() (cloudprovider.Clusters, bool)                          { return nil, false }
func (c *dangerousCloud) Routes() (cloudprovider.Routes, bool)                              { return nil, false }
func (c *dangerousCloud) ProviderName() string                                              { return "dangerous" }
func (c *dangerousCloud) HasClusterID() bool                                                { return true }

// countingNodeInformer hands the controller a lister that counts its List
// calls: one per monitor pass of cloud-node-lifecycle. Tests wait for passes,
// never for wall-clock time.
type countingNodeInformer struct {
	coreinformers.NodeInformer
	mu     sync.Mutex
	passes int
}

func (i *countingNodeInformer) Lister() corelisters.NodeLister {
	return countingLister{NodeLister: i.NodeInformer.Lister(), i: i}
}

func (i *countingNodeInformer) count() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.passes
}

type countingLister struct {
	corelisters.NodeLister
	i *countingNodeInformer
}

func (l countingLister) List(selector labels.Selector) ([]*corev1.Node, error) {
	l.i.mu.Lock()
	l.i.passes++
	l.i.mu.Unlock()
	return l.NodeLister.List(selector)
}
