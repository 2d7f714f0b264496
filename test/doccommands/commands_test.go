package doccommands

import (
	"testing"
)

// entry is one command the docs show and what this package does with it.
type entry struct {
	// cmd is the command as Extract gives it: continuations joined, the
	// comment dropped, placeholders (<name>, registry.example.com) as the
	// docs write them.
	cmd string
	// run runs it here (TestDocCommandsRun), in the order of the table; nil
	// when it cannot run here.
	run *step
	// why says why it does not run here and what covers it instead; for a
	// step that does not run the command as written (a dry run, a stand-in),
	// what it does instead.
	why string
}

// commands is every command of the docs' shell blocks. The entries that run
// do so in this order, one world for all: the Helm path of docs/install.md
// (local charts), its kubectl checks, uninstall, the migration from the
// Talos CCM, images and releases, the gitops Secrets, the static manifests;
// then the make and go test lines, checked without running what they run.
var commands = []entry{
	// docs/install.md, "Install the chart" ... "Upgrades and uninstall":
	// the umbrella chart from a copy of charts/.
	{cmd: "helm dependency build charts/hybrid-ccm", run: &step{check: subchartsPackaged}},
	{cmd: "helm install hybrid-ccm charts/hybrid-ccm --namespace kube-system", run: &step{check: umbrellaInstalled}},
	{cmd: "kubectl -n kube-system get pods -l app.kubernetes.io/name=talos-ccm", run: &step{check: noPods},
		why: "the API server runs no controllers, so the Deployment has no pods: the check is that kubectl accepts the query"},
	{cmd: "kubectl get nodes -L node.cloudprovider.kubernetes.io/platform,topology.kubernetes.io/region,topology.kubernetes.io/zone",
		run: &step{before: fixtures, check: nodeColumns}, why: "a Node made as talos-ccm leaves it"},
	{cmd: "kubectl get csr", run: &step{before: fixtures, check: csrListed}, why: "a kubelet-serving CSR made by the test"},
	{cmd: `kubectl -n hybrid-ccm-system create secret generic hcloud --from-literal=token="$HCLOUD_TOKEN"`, run: &step{check: hcloudSecret}},
	// docs/install.md, "AWS: the IAM user and cloud.conf": the Secret from a
	// stand-in key and the doc's cloud.conf (newWorld writes the named block).
	{cmd: `kubectl -n hybrid-ccm-system create secret generic aws-ccm --from-literal=access-key-id="$AWS_ACCESS_KEY_ID" --from-literal=secret-access-key="$AWS_SECRET_ACCESS_KEY" --from-file=cloud.conf`,
		run: &step{check: awsSecret},
		why: "cloud.conf is the ini block docs/install.md names so; the key is a stand-in (the aws iam lines need an AWS account)"},
	{cmd: "helm upgrade hybrid-ccm charts/hybrid-ccm -n kube-system --reuse-values --set clouds.hcloud.enabled=true", run: &step{check: hcloudEnabled}},
	{cmd: "helm upgrade hybrid-ccm charts/hybrid-ccm -n kube-system --reuse-values -f clouds.yaml", run: &step{before: docFile("clouds.yaml"), check: cloudsYAMLApplied},
		why: "clouds.yaml is the yaml block docs/install.md names so"},
	{cmd: "kubectl get nativeccms", run: &step{check: nativeCCMsListed}},
	{cmd: "kubectl describe nativeccm hcloud", run: &step{check: nativeCCMDescribed}},
	{cmd: `kubectl annotate nativeccm hcloud reconcile.fluxcd.io/requestedAt="$(date +%s)" --overwrite`, run: &step{check: reconcileRequested}},
	{cmd: "kubectl get node <name> -o yaml", run: &step{before: fixtures, subst: []string{"<name>", fixtureNode}, check: nodeYAML}},
	{cmd: "kubectl get events --field-selector involvedObject.kind=Node,involvedObject.name=<name>",
		run: &step{before: fixtures, subst: []string{"<name>", fixtureNode}, check: nodeEventListed}},
	{cmd: "kubectl get events -A --field-selector involvedObject.kind=Node,type=Warning", run: &step{before: fixtures, check: nodeEventListed}},
	{cmd: "helm upgrade hybrid-ccm charts/hybrid-ccm -n kube-system --reuse-values --set clouds.hcloud.enabled=false", run: &step{check: hcloudDisabled}},
	{cmd: "helm uninstall hybrid-ccm -n kube-system", run: &step{check: umbrellaUninstalled}},
	// docs/operations.md, "Is it working? helm test".
	{cmd: "helm test hybrid-ccm -n kube-system --logs",
		why: "the test pods need kubelets and the hybridctl image: test/oncluster runs helm test (Helm's SDK) on the documented install, passing and failing (TestInstallAsDocumented/HelmTest)"},

	// docs/migrating-from-a-cloud-ccm.md: the AWS CCM's own chart (from the
	// module cache) as release aws-cloud-controller-manager, Hybrid CCM
	// beside it with the doc's values, the AWS CCM uninstalled. No
	// controllers run here: what the AWS CCM and the coordinator would write
	// is written before the commands that show it; test/takeover runs the
	// same path on a real cluster with the real AWS CCM and coordinator.
	{cmd: "helm list -A --filter aws-cloud-controller-manager", run: &step{before: previousAWSCCM, check: previousAWSCCMListed},
		why: "the AWS CCM's chart installed unmodified; its Lease as the AWS CCM's leader election writes it (no pod runs here)"},
	{cmd: "kubectl -n kube-system get lease cloud-controller-manager -o yaml", run: &step{check: previousLeaseShown}},
	{cmd: "helm install hybrid-ccm charts/hybrid-ccm --namespace kube-system -f takeover.yaml", run: &step{before: docFile("takeover.yaml"), check: takeOverInstalled},
		why: "takeover.yaml is the yaml block the doc names so; its aws-ccm Secret is the one docs/install.md's line made above"},
	{cmd: "kubectl get nativeccm aws", run: &step{before: nativeCCMWaitingStatus, check: nativeCCMWaitingShown},
		why: "the status is the one the coordinator writes while the AWS CCM renews its Lease (coordinator/controller's TestTakeOverWaitsForThePreviousCCM, test/takeover on a real cluster)"},
	{cmd: "kubectl describe nativeccm aws", run: &step{check: nativeCCMWaitingDescribed}},
	{cmd: "helm uninstall aws-cloud-controller-manager -n kube-system", run: &step{check: previousAWSCCMGone}},
	{cmd: "kubectl -n kube-system wait --for=delete pod -l k8s-app=aws-cloud-controller-manager --timeout=2m", run: &step{before: previousPodsLabel, check: noPreviousPods},
		why: "no kubelet runs the AWS CCM's pod here, so there is none to wait for; the step checks that the label selects the chart's pods (test/takeover waits for the real pod)"},
	{cmd: "kubectl wait nativeccm/aws --for=condition=Ready --timeout=5m", run: &step{before: nativeCCMReadyStatus, check: nativeCCMReadyWaited},
		why: "the status and Lease are the ones the coordinator and the native CCM write once it leads (test/takeover waits for them on a real cluster)"},
	{cmd: "kubectl -n hybrid-ccm-system get lease native-ccm-aws", run: &step{check: nativeLeaseShown}},
	{cmd: "kubectl get services -A", run: &step{check: servicesListed}},

	// docs/migrating-from-talos-ccm.md, "The chart".
	{cmd: "helm uninstall -n kube-system talos-cloud-controller-manager", run: &step{before: upstreamReleaseStandIn, check: upstreamReleaseGone},
		why: "the release it removes is a stand-in chart of the test's under the upstream release's name (the upstream chart is not downloaded)"},
	{cmd: "helm install talos-ccm charts/talos-ccm -n kube-system -f values.yaml", run: &step{before: migratedValues, check: talosCCMFromMigratedValues},
		why: "values.yaml holds upstream values translated as the doc's table says"},

	// docs/install.md, "Images and releases": make images and make release
	// into bin/images of this checkout, as for a user.
	{cmd: "make images", run: &step{inRepo: true, check: imagesBuilt}},
	{cmd: "make images PLATFORMS=linux/amd64", run: &step{inRepo: true, dryRun: true, check: makeRecipe("--platforms=linux/amd64", "--out bin/images")},
		why: "dry run (make -n): the build is `make images` above, for one platform"},
	{cmd: "skopeo copy --all oci:bin/images:ghcr.io/hybrid-ccm/talos-ccm:0.1.0 docker://registry.example.com/hybrid-ccm/talos-ccm:0.1.0",
		run: &step{inRepo: true, subst: []string{"registry.example.com", "{registry}"}, check: imageCopied}},
	{cmd: "make release REGISTRY=registry.example.com/hybrid-ccm VERSION=0.2.0",
		run: &step{inRepo: true, subst: []string{"registry.example.com", "{registry}"}, check: released}},
	{cmd: "make release REGISTRY=ghcr.io/<org> VERSION=0.2.0",
		run: &step{inRepo: true, subst: []string{"ghcr.io/<org>", "{registry}/hybrid-ccm"}, check: released},
		why: "docs/gitops.md's: with the test registry for ghcr.io/<org> it is docs/install.md's, run once"},
	{cmd: "helm install hybrid-ccm oci://registry.example.com/hybrid-ccm/charts/hybrid-ccm --version 0.2.0 --namespace kube-system",
		run: &step{subst: []string{"registry.example.com", "{registry}"}, check: installedFromRelease}},
	// docs/supply-chain.md: the same release signed with a key cosign
	// generates, verified and its SBOM fetched with cosign.
	{cmd: "cosign generate-key-pair", run: &step{needs: "cosign", check: keyPairGenerated}},
	{cmd: "make release REGISTRY=registry.example.com/hybrid-ccm VERSION=0.2.0 SIGNING_KEY=cosign.key",
		run: &step{needs: "cosign", inRepo: true, subst: []string{"registry.example.com", "{registry}", "SIGNING_KEY=cosign.key", "SIGNING_KEY={work}/cosign.key"}, check: releasedSigned},
		why: "make runs in the checkout: the key generated above is named by its path in the working directory"},
	{cmd: "cosign verify --key cosign.pub --insecure-ignore-tlog=true registry.example.com/hybrid-ccm/talos-ccm:0.2.0",
		run: &step{needs: "cosign", subst: []string{"registry.example.com", "{registry}"}, check: cosignVerified}},
	{cmd: "cosign verify --key cosign.pub --insecure-ignore-tlog=true registry.example.com/hybrid-ccm/charts/hybrid-ccm:0.2.0",
		run: &step{needs: "cosign", subst: []string{"registry.example.com", "{registry}"}, check: cosignVerified}},
	{cmd: "cosign download sbom --platform linux/amd64 registry.example.com/hybrid-ccm/talos-ccm:0.2.0 > talos-ccm.spdx.json",
		run: &step{needs: "cosign", subst: []string{"registry.example.com", "{registry}"}, check: sbomDownloaded}},
	// docs/install.md, "Bootstrap, then Helm or Flux": the hand-over install.
	{cmd: "helm install hybrid-ccm oci://ghcr.io/hybrid-ccm/charts/hybrid-ccm --version <version> --namespace kube-system -f values.yaml",
		run: &step{subst: []string{"ghcr.io/hybrid-ccm", "{registry}/hybrid-ccm", "<version>", "0.2.0"}, before: emptyValues, check: installedFromRelease},
		why: "values.yaml is the platform team's: an empty one here; test/adopt installs this way over the static manifests on a real cluster"},
	// docs/install.md, "Private registry".
	{cmd: "helm registry login registry.example.com",
		why: "credentials of a private registry; test/oncluster's registry requires them and Helm pulls the charts logged in (TestPrivateRegistry)"},
	{cmd: `kubectl -n kube-system create secret docker-registry regcred --docker-server=registry.example.com --docker-username="$USER" --docker-password="$TOKEN"`,
		run: &step{subst: []string{"$USER", "deploy", "$TOKEN", "t0ken"}, check: regcredSecret("kube-system")}},
	{cmd: "helm install hybrid-ccm oci://registry.example.com/hybrid-ccm/charts/hybrid-ccm --version 0.2.0 --namespace kube-system --set 'global.imagePullSecrets[0].name=regcred'",
		run: &step{subst: []string{"registry.example.com", "{registry}"}, check: installedFromRelease}},
	{cmd: `kubectl -n hybrid-ccm-system create secret docker-registry regcred --docker-server=registry.example.com --docker-username="$USER" --docker-password="$TOKEN"`,
		run: &step{subst: []string{"$USER", "deploy", "$TOKEN", "t0ken"}, check: regcredSecret("hybrid-ccm-system")}},
	// docs/operations.md, "Scraping".
	{cmd: "kubectl create clusterrolebinding prometheus:talos-ccm-metrics --clusterrole=talos-ccm:metrics-reader --serviceaccount=monitoring:prometheus",
		run: &step{check: metricsReaderBound}},

	// docs/gitops.md, "Secrets".
	{cmd: `kubectl -n hybrid-ccm-system create secret generic hcloud --from-literal=token="$HCLOUD_TOKEN" --dry-run=client -o yaml > clusters/prod/secrets/hcloud.sops.yaml`,
		run: &step{check: secretWrittenInClear}, why: "in a copy of gitops/'s clusters/"},
	{cmd: "kubectl -n flux-system create secret generic sops-age --from-file=age.agekey=prod.agekey", run: &step{before: ageKeyStandIn, check: ageKeySecret},
		why: "prod.agekey is a stand-in written by the test, in age-keygen's format (age-keygen is not run, below)"},
	{cmd: "age-keygen -o prod.agekey",
		why: "age is no dependency of this repository's tests; the next line runs with a stand-in key file"},
	{cmd: "sops --encrypt --in-place clusters/prod/secrets/hcloud.sops.yaml",
		why: "sops is neither a Debian package nor a module of this repository; go test ./gitops checks that every committed Secret is a SOPS envelope"},

	// docs/install.md, "Without Helm: static manifests".
	{cmd: "kubectl apply --server-side -f docs/deploy/talos-ccm.yaml -f docs/deploy/ccm-coordinator.yaml", run: &step{fresh: true, check: staticManifestsApplied},
		why: "against an API server of its own: a cluster without Helm"},

	// docs/transformations.md: explain from a file in talosctl's format.
	{cmd: "hybridctl transform explain -c rules.yaml -m node.yaml", run: &step{before: explainInputs, check: explainAsDocumented},
		why: "rules.yaml and node.yaml are cmd/hybridctl/internal/cli/testdata's, the input of the doc's example output"},

	// README.md, docs/csr-approval.md, docs/benchmarks.md: make and go test lines. make test
	// runs every test and CI runs make test; here: make's recipe (make -n),
	// and that the packages exist and each -run/-bench/-fuzz pattern names
	// a function in them.
	{cmd: "make test", run: &step{inRepo: true, dryRun: true, check: makeRecipe("hack/test.sh", "FUZZTIME=")},
		why: "dry run: CI runs it (.ci/run), and with it this test"},
	{cmd: "make demo", run: &step{inRepo: true, dryRun: true, check: makeRecipe("bin/hybridctl demo")},
		why: "dry run: the demo runs a real cluster as root (cmd/hybridctl/internal/demo's tests run it)"},
	{cmd: "make fuzz", run: &step{inRepo: true, dryRun: true, check: makeRecipe("hack/fuzz.sh 2000x")},
		why: "dry run: make test runs it"},
	{cmd: "make bench", run: &step{inRepo: true, dryRun: true, check: makeRecipe("-bench . -benchtime 1x", "./test/bench/...")},
		why: "dry run: the benchmarks take half an hour and print figures; make test runs each benchmark package's tests"},
	{cmd: "make bench-10k", run: &step{inRepo: true, dryRun: true, check: makeRecipe("HYBRID_CCM_BENCH_NODES=1000,5000,10000", "-bench . -benchtime 1x")},
		why: "dry run: as make bench, with 10,000 nodes"},
	{cmd: "go test ./ccm/csr", run: &step{inRepo: true, exec: goTestNames}, why: "make test runs it"},
	{cmd: "KUBEBUILDER_ASSETS=$(hack/control-plane.sh) go test ./ccm/csr/integration", run: &step{inRepo: true, exec: goTestNames}, why: "make test runs it"},
	{cmd: "go test -run '^$' -fuzz '^FuzzValidate$' -fuzztime 60s ./ccm/csr", run: &step{inRepo: true, exec: goTestNames},
		why: "make fuzz fuzzes it (2000 inputs)"},
	{cmd: "KUBEBUILDER_ASSETS=$(hack/control-plane.sh) go test -run '^$' -bench Decide -benchtime 1x ./ccm/csr/integration",
		run: &step{inRepo: true, exec: goTestNames}, why: "make bench runs it"},
	{cmd: "KUBEBUILDER_ASSETS=$(hack/control-plane.sh) go test -run '^$' -bench RenewalStorm -benchtime 1x ./ccm/csr/integration",
		run: &step{inRepo: true, exec: goTestNames}, why: "make bench runs it"},
	{cmd: "KUBEBUILDER_ASSETS=$(hack/control-plane.sh) go test -run '^$' -bench Initialize -benchtime 1x ./test/bench/talosccm",
		run: &step{inRepo: true, exec: goTestNames}, why: "make bench runs it"},

	// Commands that need what this machine has not: Talos machines,
	// GitHub, Flux, ghcr.io credentials.
	{cmd: "aws iam create-user --user-name hybrid-ccm-aws",
		why: "an AWS account; go test ./test/fakeec2 checks the policy files against the calls test/aws saw the upstream AWS CCM make"},
	{cmd: "aws iam put-user-policy --user-name hybrid-ccm-aws --policy-name node-lifecycle --policy-document file://docs/examples/aws-iam-lifecycle.json",
		why: "an AWS account; go test ./test/fakeec2 (TestLifecyclePolicy) reads the policy file as IAM would parse it and checks it grants what test/aws saw the lifecycle-only CCM call, ec2:DescribeInstances"},
	{cmd: "aws iam create-access-key --user-name hybrid-ccm-aws",
		why: "an AWS account; the aws-ccm Secret above is made from a stand-in key"},
	{cmd: "talosctl gen config my-cluster https://<endpoint>:6443 --config-patch @hybrid-ccm.patch.yaml --config-patch-control-plane @hybrid-ccm-controlplane.patch.yaml",
		why: "test/talospatch generates a configuration and applies these patches with Talos's own config code, and validates the result"},
	{cmd: "talosctl -n <cp-ip>,<cp-ip>,... patch machineconfig --patch @hybrid-ccm.patch.yaml --patch @hybrid-ccm-controlplane.patch.yaml",
		why: "running Talos machines; test/talospatch applies the patches with the patcher talosctl uses"},
	{cmd: "talosctl -n <worker-ip>,<worker-ip>,... patch machineconfig --patch @hybrid-ccm.patch.yaml",
		why: "running Talos machines; test/talospatch applies the patch with the patcher talosctl uses"},
	{cmd: "talosctl -n 10.0.0.5 get platformmetadata -o yaml > node.yaml",
		why: "a Talos machine; its output format is cmd/hybridctl/internal/cli/testdata/web-1.talosctl.yaml, which the explain step reads"},
	{cmd: "echo --- >> node.yaml", why: "part of the talosctl lines around it"},
	{cmd: "talosctl -n 10.0.0.5 get systeminformation -o yaml >> node.yaml",
		why: "a Talos machine; its output format is cmd/hybridctl/internal/cli/testdata/web-1.talosctl.yaml, which the explain step reads"},
	{cmd: "hybridctl transform explain -c rules.yaml --node 10.0.0.5",
		why: "a Talos API at 10.0.0.5; cmd/hybridctl/internal/cli's TestExplainLiveNode runs explain --node against a simulated Talos API (test/talosnode)"},
	{cmd: "hybridctl transform explain -c ccm-config.yaml --node <node-ip>",
		why: "a Talos API; cmd/hybridctl/internal/cli's TestExplainLiveNode runs explain --node against a simulated Talos API (test/talosnode)"},
	{cmd: "flux bootstrap github --owner=<org> --repository=<repo> --path=clusters/prod",
		why: "GitHub and a Flux installation; go test ./gitops renders clusters/prod as Flux's kustomize-controller and helm-controller would"},
	{cmd: "flux get kustomizations hybrid-ccm hybrid-ccm-secrets", why: "Flux's controllers; go test ./gitops checks the Kustomizations it names"},
	{cmd: "flux get helmreleases -n flux-system hybrid-ccm", why: "Flux's controllers; go test ./gitops checks the HelmRelease it names"},
	{cmd: "flux reconcile kustomization hybrid-ccm --with-source", why: "Flux's controllers"},
	{cmd: "flux suspend helmrelease -n flux-system hybrid-ccm", why: "Flux's controllers"},
	{cmd: "flux resume helmrelease -n flux-system hybrid-ccm", why: "Flux's controllers"},
	{cmd: "docker login ghcr.io && helm registry login ghcr.io",
		why: "credentials for ghcr.io; the test's registry takes pushes without a login (make release above pushes to it)"},
}

// TestEveryDocCommandInTable fails for a command of the docs the table lacks
// (a new or changed command must be run, or say why not) and for an entry no
// doc shows any more.
func TestEveryDocCommandInTable(t *testing.T) {
	cmds, _, err := Extract(repoRoot())
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) < 40 {
		t.Fatalf("extracted %d commands from %v: the extraction is broken", len(cmds), Docs)
	}
	table := map[string]bool{}
	for _, e := range commands {
		if table[e.cmd] {
			t.Errorf("the table has %q twice", e.cmd)
		}
		table[e.cmd] = true
		if e.run == nil && e.why == "" {
			t.Errorf("%q neither runs nor says why not", e.cmd)
		}
	}
	shown := map[string]bool{}
	for _, c := range cmds {
		shown[c.Text] = true
		if !table[c.Text] {
			t.Errorf("%s: not in the table of test/doccommands: run it there, or say why it cannot run", c)
		}
	}
	for _, e := range commands {
		if !shown[e.cmd] {
			t.Errorf("the table has %q, which no doc shows any more: remove the entry", e.cmd)
		}
	}
}
