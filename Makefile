# Hybrid CCM — build, test, demo.
#
#   make demo    a real cluster on this machine (Talos machines of several platforms as real nodes), watch it work (as root)
#   make test    all tests (unit, integration against a real kube-apiserver/etcd, the real cluster)
#   make bench   benchmarks with baselines measured in the same run (make bench-10k: 10,000 nodes too)
#   make build   binaries into bin/
#   make lint    go vet + gofmt check
#   make images     OCI images (amd64+arm64, reproducible) into the layout bin/images
#   make release    images and charts pushed to REGISTRY at VERSION (Helm OCI)
#   make manifests  docs/deploy/*.yaml rendered from the charts
#
# REGISTRY (default ghcr.io/hybrid-ccm) and VERSION (default: appVersion of
# charts/talos-ccm) are defaulted in one place, hack/ship; set them to override.
# IMAGES_DIR is the layout make images/release write (default bin/images); two
# builds of one layout at once take turns.

GO           ?= go
KUBE_VERSION ?= $(shell . hack/lib/versions.sh && echo $$KUBE_VERSION)
ETCD_VERSION ?= $(shell . hack/lib/versions.sh && echo $$ETCD_VERSION)
TEST_FLAGS   ?=
FUZZTIME     ?= 2000x
FUZZPKG      ?= .
REGISTRY     ?=
VERSION      ?=
SIGNING_KEY  ?=
PLATFORMS    ?= linux/amd64,linux/arm64
IMAGES_DIR   ?= bin/images
# GOGC of the Go toolchain in the builds below (make test's prerequisites, its
# test builds, images, release): a compile or link spends a quarter to a half
# less CPU collecting garbage for a few percent more memory (measured cold:
# k8s.io/client-go/kubernetes 174 s of CPU at Go's default 100, 123-137 s at
# 400, largest compile 0.63 GB; a test binary's link 14.8 s -> 7.7 s). It
# changes no byte of the output. make test runs the tests themselves with
# the caller's GOGC (hack/test.sh).
BUILD_GOGC   ?= 400
export KUBE_VERSION ETCD_VERSION

SHIP      = $(GO) run ./hack/ship/cmd/ship
SHIPFLAGS = $(if $(REGISTRY),--registry=$(REGISTRY)) $(if $(VERSION),--version=$(VERSION)) --platforms=$(PLATFORMS)

BINARIES := talos-ccm ccm-coordinator ccm-gate hybridctl

.PHONY: test-oldest all build test unit fuzz bench bench-10k lint demo prerequisites prerequisites-kube prerequisites-other control-plane cluster aws-ccm coredns kubectl cosign clean generate verify-generated images release manifests

all: build

# Builds (or reuses from the cache) kube-apiserver + etcd and prints their directory.
control-plane:
	@GOGC=$(BUILD_GOGC) hack/control-plane.sh >/dev/null

# The test cluster's other parts (test/cluster): kubelet, kube-controller-manager,
# kube-scheduler and kube-proxy built (or reused from the cache) at KUBE_VERSION, and
# containerd, runc, the CNI plugins, iptables and conntrack from Debian's packages
# (installed with apt-get when missing; skopeo too, for test/doccommands).
cluster:
	@hack/cluster-packages.sh
	@GOGC=$(BUILD_GOGC) hack/cluster-binaries.sh >/dev/null

# Builds (or reuses from the cache) the upstream AWS CCM at the version
# profiles/aws.yaml names (test/aws and the demo run it).
aws-ccm:
	@GOGC=$(BUILD_GOGC) hack/aws-ccm.sh >/dev/null

# Builds (or reuses from the cache) CoreDNS with the plugins of Talos' Corefile
# (hack/coredns): the fleet (test/fleet) and the demo run cluster DNS as Talos
# deploys it.
coredns:
	@GOGC=$(BUILD_GOGC) hack/coredns.sh >/dev/null

# Builds (or reuses from the cache) kubectl at KUBE_VERSION: test/doccommands runs
# the docs' kubectl lines with it.
kubectl:
	@GOGC=$(BUILD_GOGC) hack/kubectl.sh >/dev/null

# make test's prerequisites in two chains side by side: the Kubernetes binaries
# one after the other (they share compiled packages), and the upstream AWS CCM
# then CoreDNS. Cold, one chain's downloads and links overlap the other's
# compiling; warm, every step is a cache hit.
prerequisites:
	@$(MAKE) --no-print-directory -j2 prerequisites-kube prerequisites-other

prerequisites-kube:
	@$(MAKE) --no-print-directory control-plane
	@$(MAKE) --no-print-directory cluster
	@$(MAKE) --no-print-directory kubectl

prerequisites-other:
	@$(MAKE) --no-print-directory aws-ccm
	@$(MAKE) --no-print-directory coredns

# Builds (or reuses from the cache) the cosign CLI: test/registry and
# test/doccommands verify signed releases and fetch SBOMs with it
# (docs/supply-chain.md) when it is built, and skip those checks, saying so,
# when not. Not a prerequisite of make test: cold, it downloads about 2 GB of
# modules and builds for 5-10 minutes, too much for CI's budget; hack/ship's
# TestRelease checks every signature in cosign's format without it.
cosign:
	@hack/cosign.sh >/dev/null

build:
	@mkdir -p bin
	@for b in $(BINARIES); do \
		if [ -d cmd/$$b ]; then $(GO) build -o bin/$$b ./cmd/$$b || exit 1; fi; \
	done

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# hack/test.sh: the commands and their release images built once for the run
# (test/testbin), then two lanes side by side: the packages that run a real
# cluster (test/cluster and its users), one at a time; and make lint, every
# other package, test/monitoring and the fuzz targets (FUZZTIME inputs each).
test: prerequisites
	KUBEBUILDER_ASSETS=$$(hack/control-plane.sh) HYBRID_CCM_CLUSTER_BINARIES=$$(hack/cluster-binaries.sh) GO_TEST_FLAGS="$(TEST_FLAGS)" FUZZTIME="$(FUZZTIME)" FUZZPKG="$(FUZZPKG)" BUILD_GOGC="$(BUILD_GOGC)" hack/test.sh

# The API-server suites (node initialization, CSR approval, IPAM, the coordinator
# with its gate and fence, the binaries with their chart RBAC, hybridctl) against
# the oldest supported minor's kube-apiserver (OLDEST_KUBE_VERSION in
# hack/lib/versions.sh): with make test, the supported range docs/install.md states.
test-oldest:
	GO_TEST_FLAGS="$(TEST_FLAGS)" hack/test-oldest.sh

# Short fuzzing of the security-relevant parsers: a count of inputs each, not a
# duration, because go1.26's fuzz coordinator can fail a duration-bounded run
# with a bare "context deadline exceeded" at its end (go.dev/issue/75804,
# fixed in Go 1.27); a count has no deadline to race. FUZZPKG=./coordinator/gate/proxy
# fuzzes only the packages under it (the gate's wire code and view).
fuzz:
	@hack/fuzz.sh $(FUZZTIME) $(FUZZPKG)

bench: control-plane
	KUBEBUILDER_ASSETS=$$(hack/control-plane.sh) $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 90m ./test/bench/... ./ccm/csr/integration

# The scale benchmarks at 10,000 nodes too (HYBRID_CCM_BENCH_NODES, default
# 1000,5000): about twice as long as make bench.
bench-10k:
	HYBRID_CCM_BENCH_NODES=1000,5000,10000 $(MAKE) bench

demo: control-plane cluster aws-ccm coredns build
	KUBEBUILDER_ASSETS=$$(hack/control-plane.sh) HYBRID_CCM_CLUSTER_BINARIES=$$(hack/cluster-binaries.sh) bin/hybridctl demo

# Images of talos-ccm, ccm-coordinator, ccm-gate, hybridctl without a Docker
# daemon: an OCI image layout in bin/images (one image index per image).
images:
	GOGC=$(BUILD_GOGC) $(SHIP) images $(SHIPFLAGS) --out $(IMAGES_DIR)

# Builds the images, pushes them, an SPDX SBOM attached to each, and the four
# charts (oci://REGISTRY/charts). SIGNING_KEY=<PEM private key file> signs every
# image and chart in cosign's format (COSIGN_PASSWORD for cosign's encrypted
# keys); without it nothing is signed. Credentials: docker login / helm
# registry login. docs/supply-chain.md says how to verify.
release:
	GOGC=$(BUILD_GOGC) $(SHIP) release $(SHIPFLAGS) $(if $(SIGNING_KEY),--signing-key=$(SIGNING_KEY)) --out $(IMAGES_DIR)

# Renders docs/deploy/*.yaml (kubectl apply, Talos externalCloudProvider).
manifests:
	$(SHIP) manifests --out docs/deploy

# Regenerates the NativeCCM CRD and deepcopy code (controller-gen, pinned).
generate:
	hack/coordinator-generate.sh

verify-generated:
	hack/coordinator-generate.sh --verify

clean:
	rm -rf bin
