// Command testccm is a cloud-controller-manager for the end-to-end tests of
// Hybrid CCM: k8s.io/cloud-provider/app run exactly as upstream CCMs run it
// (secure port with delegated authentication and authorization, leader
// election, --controllers, --cloud-config, the shared flags), with a cloud
// that knows nothing of its own. It stands in for an upstream CCM whose binary
// cannot be built here, so that what the coordinator renders for a native CCM
// (RBAC, flags, the gate) is run for real: a missing permission or an unknown
// flag makes it exit at start, as it would make the upstream CCM exit.
//
// It registers one cloud under every --cloud-provider name the built-in
// profiles use. The cloud answers instance questions from the fake cloud API
// at $TESTCCM_CLOUD_URL (GET ?provider=<name>&node=<node>&providerID=<id>
// answering {"exists": bool, "shutdown": bool}; it runs on the test's
// loopback); without it every instance exists and runs. With it, it also
// serves LoadBalancer Services through the fake's load-balancer API
// (test/fakelb). It must never reach beyond loopback and is never shipped.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	cloudcontrollerconfig "k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
)

// providers are the --cloud-provider names of profiles/*.yaml.
var providers = []string{"aws", "azure", "cloudscale", "digitalocean", "gce", "hcloud", "oci", "openstack", "scaleway"}

// cloudURLEnv names the fake cloud API.
const cloudURLEnv = "TESTCCM_CLOUD_URL"

func main() {
	for _, name := range providers {
		cloudprovider.RegisterCloudProvider(name, func(config io.Reader) (cloudprovider.Interface, error) {
			if config != nil {
				// read it as the upstream CCMs do: a missing or unreadable file fails start-up
				if _, err := io.ReadAll(config); err != nil {
					return nil, fmt.Errorf("cloud config: %w", err)
				}
			}
			return newCloud(name, os.Getenv(cloudURLEnv)), nil
		})
	}
	opts, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		klog.Fatalf("options: %v", err)
	}
	cmd := app.NewCloudControllerManagerCommand(opts, initCloud, app.DefaultInitFuncConstructors,
		names.CCMControllerAliases(), cliflag.NamedFlagSets{}, wait.NeverStop)
	cmd.Use = "testccm"
	os.Exit(cli.Run(cmd))
}

func initCloud(c *cloudcontrollerconfig.CompletedConfig) cloudprovider.Interface {
	shared := c.ComponentConfig.KubeCloudShared.CloudProvider
	cloud, err := cloudprovider.InitCloudProvider(shared.Name, shared.CloudConfigFile)
	if err != nil {
		klog.Fatalf("cloud provider %q: %v", shared.Name, err)
	}
	if cloud == nil {
		klog.Fatalf("cloud provider %q: not registered", shared.Name)
	}
	return cloud
}

// cloud answers InstancesV2 from the fake cloud API; it has nothing else.
type cloud struct {
	name, url string
	client    *http.Client
}

var (
	_ cloudprovider.Interface   = (*cloud)(nil)
	_ cloudprovider.InstancesV2 = (*cloud)(nil)
)

func newCloud(name, url string) *cloud {
	return &cloud{name: name, url: url, client: &http.Client{Timeout: 5 * time.Second}}
}

type instance struct {
	Exists   bool `json:"exists"`
	Shutdown bool `json:"shutdown"`
}

func (c *cloud) lookup(ctx context.Context, node *corev1.Node) (instance, error) {
	if c.url == "" {
		return instance{Exists: true}, nil
	}
	q := url.Values{"provider": {c.name}, "node": {node.Name}, "providerID": {node.Spec.ProviderID}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url+"?"+q.Encode(), nil)
	if err != nil {
		return instance{}, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return instance{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return instance{}, fmt.Errorf("fake cloud: %s", resp.Status)
	}
	var in instance
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		return instance{}, fmt.Errorf("fake cloud: %w", err)
	}
	return in, nil
}

func (c *cloud) InstanceExists(ctx context.Context, node *corev1.Node) (bool, error) {
	in, err := c.lookup(ctx, node)
	return in.Exists, err
}

func (c *cloud) InstanceShutdown(ctx context.Context, node *corev1.Node) (bool, error) {
	in, err := c.lookup(ctx, node)
	return in.Shutdown, err
}

func (c *cloud) InstanceMetadata(context.Context, *corev1.Node) (*cloudprovider.InstanceMetadata, error) {
	// lifecycle-only: talos-ccm initializes nodes, never this CCM
	return nil, fmt.Errorf("%s: instance metadata is talos-ccm's job", c.name)
}

func (c *cloud) Initialize(cloudprovider.ControllerClientBuilder, <-chan struct{}) {}
func (c *cloud) LoadBalancer() (cloudprovider.LoadBalancer, bool) {
	// without a fake cloud there is nowhere to build them
	return loadBalancers{c}, c.url != ""
}
func (c *cloud) Instances() (cloudprovider.Instances, bool)     { return nil, false }
func (c *cloud) InstancesV2() (cloudprovider.InstancesV2, bool) { return c, true }
func (c *cloud) Zones() (cloudprovider.Zones, bool)             { return nil, false }
func (c *cloud) Clusters() (cloudprovider.Clusters, bool)       { return nil, false }
func (c *cloud) Routes() (cloudprovider.Routes, bool)           { return nil, false }
func (c *cloud) ProviderName() string                           { return c.name }
func (c *cloud) HasClusterID() bool                             { return true }
