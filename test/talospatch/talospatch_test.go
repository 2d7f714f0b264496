// Package talospatch applies the Talos machine-configuration patches that
// docs/install.md tells users to apply, with Talos's own configuration code
// (github.com/siderolabs/talos/pkg/machinery: generate a configuration as
// `talosctl gen config` does, patch it with the config patcher `talosctl
// gen config --config-patch` and `talosctl patch machineconfig` use, load
// the result as a machine does and validate it in the runtime modes Talos
// validates in), and checks the patched configuration gives what Hybrid CCM
// needs. Only its tests hold code.
package talospatch

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/bundle"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// mode is a Talos runtime mode as machined validates a configuration in it.
type mode struct {
	name               string
	install, container bool
}

func (m mode) String() string                     { return m.name }
func (m mode) RequiresInstall() bool              { return m.install }
func (m mode) InContainer() bool                  { return m.container }
func (m mode) validation() validation.RuntimeMode { return m }

// Talos's runtime modes: bare metal and cloud install to disk, a container
// (talosctl cluster create, Docker) does not.
var modes = []mode{{"metal", true, false}, {"cloud", true, false}, {"container", false, true}}

// patch is a ```yaml block of a doc whose first line names a patch file:
// "# <file>.patch.yaml — <which nodes>".
type patch struct {
	file, nodes, yaml string
}

// docPatches are the named machine-configuration patches of docs/install.md,
// in order.
func docPatches(t *testing.T) []patch {
	t.Helper()
	path := filepath.Join(testenv.RepoRoot(), "docs", "install.md")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out   []patch
		block []string
		in    bool
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```yaml":
			in, block = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			if len(block) == 0 || !strings.HasPrefix(block[0], "# ") {
				continue
			}
			name, nodes, _ := strings.Cut(strings.TrimPrefix(block[0], "# "), " — ")
			if strings.HasSuffix(name, ".patch.yaml") {
				out = append(out, patch{file: name, nodes: nodes, yaml: strings.Join(block, "\n") + "\n"})
			}
		case in:
			block = append(block, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestInstallPatches generates a cluster's configuration, applies the
// patches of docs/install.md as its `talosctl gen config` line does (the
// every-node patch with --config-patch, the control-plane patch with
// --config-patch-control-plane), and checks the result: it loads, it
// validates strictly in every runtime mode, and it has what talos-ccm and
// the kubelets need.
func TestInstallPatches(t *testing.T) {
	patches := docPatches(t)
	var everyNode, controlPlane []configpatcher.Patch
	for _, p := range patches {
		loaded, err := configpatcher.LoadPatch([]byte(p.yaml))
		if err != nil {
			t.Fatalf("docs/install.md %s: %v", p.file, err)
		}
		switch p.nodes {
		case "every node":
			everyNode = append(everyNode, loaded)
		case "control-plane nodes":
			controlPlane = append(controlPlane, loaded)
		default:
			t.Fatalf("docs/install.md %s: for %q: want \"every node\" or \"control-plane nodes\"", p.file, p.nodes)
		}
	}
	if len(everyNode) == 0 || len(controlPlane) == 0 {
		t.Fatalf("docs/install.md: %d every-node and %d control-plane patches, want both", len(everyNode), len(controlPlane))
	}

	b, err := bundle.NewBundle(
		// talosctl gen config's defaults (its --install-disk is /dev/sda).
		bundle.WithInputOptions(&bundle.InputOptions{ClusterName: "hybrid", Endpoint: "https://10.0.0.10:6443", KubeVersion: "1.36.3",
			GenOptions: []generate.Option{generate.WithInstallDisk("/dev/sda")}}),
		bundle.WithPatch(everyNode),
		bundle.WithPatchControlPlane(controlPlane),
	)
	if err != nil {
		t.Fatalf("talosctl gen config with the patches: %v", err)
	}
	for _, typ := range []machine.Type{machine.TypeControlPlane, machine.TypeWorker} {
		data, err := b.Serialize(encoder.CommentsDisabled, typ)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := configloader.NewFromBytes(data)
		if err != nil {
			t.Fatalf("%s: the patched configuration does not load: %v", typ, err)
		}
		for _, m := range modes {
			warnings, err := cfg.Validate(m.validation(), validation.WithStrict())
			if err != nil {
				t.Errorf("%s in mode %s: %v", typ, m, err)
			}
			for _, w := range warnings {
				t.Errorf("%s in mode %s: warning %s", typ, m, w)
			}
		}
		checkHybridCCM(t, typ, cfg)
	}
}

// checkHybridCCM: the kubelet registers for an external CCM and asks for a
// serving certificate; the control plane expects an external CCM; control
// planes let kube-system ask Talos for an os:reader talosconfig.
func checkHybridCCM(t *testing.T, typ machine.Type, cfg config.Provider) {
	t.Helper()
	args := cfg.Machine().Kubelet().ExtraArgs()
	if !slices.Equal(args["cloud-provider"], []string{"external"}) || !slices.Equal(args["rotate-server-certificates"], []string{"true"}) {
		t.Errorf("%s: kubelet extraArgs %v, want cloud-provider=external and rotate-server-certificates=true", typ, args)
	}
	if !cfg.Cluster().ExternalCloudProvider().Enabled() {
		t.Errorf("%s: cluster.externalCloudProvider not enabled", typ)
	}
	access := cfg.Machine().Features().KubernetesTalosAPIAccess()
	want := typ == machine.TypeControlPlane
	if got := access.Enabled() && slices.Contains(access.AllowedRoles(), "os:reader") &&
		slices.Contains(access.AllowedKubernetesNamespaces(), "kube-system"); got != want {
		t.Errorf("%s: kubernetesTalosAPIAccess for os:reader in kube-system is %v, want %v (enabled %v roles %v namespaces %v)",
			typ, got, want, access.Enabled(), access.AllowedRoles(), access.AllowedKubernetesNamespaces())
	}
}
