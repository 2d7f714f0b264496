#!/usr/bin/env bash
# Installs the test cluster's (test/cluster) container runtime from Debian's
# packages when a command is missing: containerd, runc, the CNI plugins
# (/usr/lib/cni), iptables and conntrack; and skopeo, whose copy line in
# docs/install.md test/doccommands runs. Needs root (apt-get); does nothing
# when everything is present.
set -euo pipefail

missing=()
for c in containerd containerd-shim-runc-v2 runc iptables conntrack nsenter unshare ip skopeo; do
  command -v "$c" >/dev/null 2>&1 || missing+=("$c")
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/portmap ]] || missing+=(cni-plugins)
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "cluster-packages: missing ${missing[*]}; install as root: apt-get install containerd runc containernetworking-plugins iptables conntrack iproute2 util-linux skopeo" >&2
  exit 1
fi
echo "cluster-packages: installing Debian packages for ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends containerd runc containernetworking-plugins iptables conntrack iproute2 util-linux skopeo >&2
