package cluster

import (
	"fmt"
	"os"
	"path/filepath"
)

// cniTemplate is the CNI configuration containerd writes once the kubelet
// passes on the node's pod CIDRs (CRI UpdateRuntimeConfig): a bridge with
// host-local addresses from exactly those CIDRs. Routes to the other nodes'
// pod CIDRs are the cluster's (keepRoutes).
const cniTemplate = `{
  "cniVersion": "0.4.0",
  "name": "hybrid-ccm-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [{{range $i, $r := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$r}}"}]{{end}}],
        "routes": [{{range $i, $r := .Routes}}{{if $i}}, {{end}}{"dst": "{{$r}}"}{{end}}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// writeConfigs writes the node's containerd, kubelet and kube-proxy
// configuration and its kubelet's client credential.
func (n *Node) writeConfigs() error {
	c := n.c
	tmpl := filepath.Join(c.work, "cni.template")
	if _, err := os.Stat(tmpl); err != nil {
		if err := os.WriteFile(tmpl, []byte(cniTemplate), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(c.work, "resolv.conf"), []byte("nameserver "+Gateway.String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	registry := ""
	if c.opts.RegistryHosts != "" {
		registry = fmt.Sprintf("\n  [plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = %q\n", c.opts.RegistryHosts)
	}
	sandbox := c.opts.SandboxImage
	if sandbox == "" {
		sandbox = "registry.k8s.io/pause:3.10"
	}
	containerd := fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # The VM's capability bounding set lacks CAP_SYS_RESOURCE: a negative
  # oom_score_adj (the pause container's -998) is refused.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/var/lib/cni/net.d"
    conf_template = %q%s`, sandbox, tmpl, registry)
	if err := os.WriteFile(filepath.Join(n.dir, "containerd.toml"), []byte(containerd), 0o644); err != nil {
		return err
	}
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 hierarchies.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
serverTLSBootstrap: true
rotateCertificates: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
address: %q
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
clusterDomain: %s
clusterDNS: [%q]
resolvConf: %q
failSwapOn: false
volumePluginDir: /var/lib/kubelet/volumeplugins
maxPods: 60
# Every node sees the whole machine's disk: evict only when it is really full.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%%, imagefs.available: 1%%, nodefs.inodesFree: 1%%, imagefs.inodesFree: 1%%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 2s
`, n.cgroup, c.pki.CAFile(), n.IP, ClusterDomain, DNSServiceIP, filepath.Join(c.work, "resolv.conf"))
	if err := os.WriteFile(filepath.Join(n.dir, "kubelet.yaml"), []byte(kubelet), 0o644); err != nil {
		return err
	}
	if _, err := c.pki.kubeconfig("kubelet-"+n.Name, c.Server(), "system:node:"+n.Name, "system:nodes"); err != nil {
		return err
	}
	proxy := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
mode: iptables
hostnameOverride: %q
clusterCIDR: %q
# Leave the machine-wide conntrack settings alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
`, c.pki.path("kube-proxy.kubeconfig"), n.Name, ClusterCIDR)
	return os.WriteFile(filepath.Join(n.dir, "kube-proxy.yaml"), []byte(proxy), 0o644)
}
