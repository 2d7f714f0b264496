package helm

import (
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// clusterAccess gives the Helm SDK the coordinator's own rest.Config (no
// kubeconfig file), with discovery cached for the life of the process.
// It implements genericclioptions.RESTClientGetter.
type clusterAccess struct {
	cfg       *rest.Config
	namespace string

	once      sync.Once
	discovery discovery.CachedDiscoveryInterface
	mapper    meta.RESTMapper
	err       error
}

// ClusterAccess is the access newClusterAccess gives the engine, for a Helm
// action the engine does not offer, as a person would run it (the tests'
// helm uninstall --keep-history).
func ClusterAccess(cfg *rest.Config, namespace string) genericclioptions.RESTClientGetter {
	return newClusterAccess(cfg, namespace)
}

func newClusterAccess(cfg *rest.Config, namespace string) *clusterAccess {
	c := rest.CopyConfig(cfg)
	return &clusterAccess{cfg: c, namespace: namespace}
}

func (c *clusterAccess) ToRESTConfig() (*rest.Config, error) { return rest.CopyConfig(c.cfg), nil }

func (c *clusterAccess) init() {
	c.once.Do(func() {
		dc, err := discovery.NewDiscoveryClientForConfig(c.cfg)
		if err != nil {
			c.err = err
			return
		}
		c.discovery = memory.NewMemCacheClient(dc)
		c.mapper = restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(c.discovery), c.discovery, nil)
	})
}

func (c *clusterAccess) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	c.init()
	return c.discovery, c.err
}

func (c *clusterAccess) ToRESTMapper() (meta.RESTMapper, error) {
	c.init()
	return c.mapper, c.err
}

// ToRawKubeConfigLoader only answers the namespace question Helm asks; there is
// no kubeconfig behind it.
func (c *clusterAccess) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	return namespaceOnly{cfg: c.cfg, namespace: c.namespace}
}

type namespaceOnly struct {
	cfg       *rest.Config
	namespace string
}

func (n namespaceOnly) RawConfig() (clientcmdapi.Config, error) { return clientcmdapi.Config{}, nil }
func (n namespaceOnly) ClientConfig() (*rest.Config, error)     { return rest.CopyConfig(n.cfg), nil }
func (n namespaceOnly) Namespace() (string, bool, error)        { return n.namespace, true, nil }
func (n namespaceOnly) ConfigAccess() clientcmd.ConfigAccess    { return nil }
