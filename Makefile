# Hybrid CCM — build, test, demo.
#
#   make demo    local real control plane + simulated Talos nodes, watch it work
#   make test    all tests (unit + integration against a real kube-apiserver/etcd)
#   make bench   benchmarks with baselines measured in the same run
#   make build   binaries into bin/
#   make lint    go vet + gofmt check

GO           ?= go
KUBE_VERSION ?= 1.36.3
ETCD_VERSION ?= 3.6.8
TEST_FLAGS   ?=
FUZZTIME     ?= 5s
export KUBE_VERSION ETCD_VERSION

BINARIES := talos-ccm ccm-coordinator ccm-gate hybridctl

.PHONY: all build test unit fuzz bench lint demo control-plane clean generate verify-generated

all: build

# Builds (or reuses from the cache) kube-apiserver + etcd and prints their directory.
control-plane:
	@hack/control-plane.sh >/dev/null

build:
	@mkdir -p bin
	@for b in $(BINARIES); do \
		if [ -d cmd/$$b ]; then $(GO) build -o bin/$$b ./cmd/$$b || exit 1; fi; \
	done

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test: control-plane lint
	KUBEBUILDER_ASSETS=$$(hack/control-plane.sh) $(GO) test -count=1 -timeout 45m $(TEST_FLAGS) ./...
	$(MAKE) fuzz

# Short fuzzing of the security-relevant parsers (seconds each).
fuzz:
	@hack/fuzz.sh $(FUZZTIME)

bench: control-plane
	KUBEBUILDER_ASSETS=$$(hack/control-plane.sh) $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./test/bench/... ./ccm/csr/integration

demo: control-plane build
	KUBEBUILDER_ASSETS=$$(hack/control-plane.sh) bin/hybridctl demo

# Regenerates the NativeCCM CRD and deepcopy code (controller-gen, pinned).
generate:
	hack/coordinator-generate.sh

verify-generated:
	hack/coordinator-generate.sh --verify

clean:
	rm -rf bin
