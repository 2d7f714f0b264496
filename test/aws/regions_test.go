package aws

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	fencepkg "github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// otherRegion is the second region of the two-region tests; region is the
// first.
const otherRegion = "us-east-1"

// regionNodes are aws nodes of two regions as talos-ccm initializes them
// (providerID aws:///<zone>/<id>, region and zone labels), each region with
// a Ready and a NotReady node, every instance running in its own region.
var regionNodes = []node{
	regional("eu-ready", zone, "i-0000000000000d001", true),
	regional("eu-notready", zone, "i-0000000000000d002", false),
	regional("us-ready", otherRegion+"a", "i-0000000000000d003", true),
	regional("us-notready", otherRegion+"a", "i-0000000000000d004", false),
}

// The NotReady nodes, the ones cloud-node-lifecycle asks EC2 about.
var euNotReady, usNotReady = regionNodes[1], regionNodes[3]

func regional(name, zone, instanceID string, ready bool) node {
	return node{name: name, platform: "aws", zone: zone, instanceID: instanceID, instance: fakeec2.Running, ready: ready,
		labels: map[string]string{corev1.LabelTopologyRegion: fakeec2.RegionOf(zone), corev1.LabelTopologyZone: zone}}
}

// regionCluster registers regionNodes and returns the fake EC2 with their
// instances, serving the endpoints of both regions (by region).
func regionCluster(t *testing.T, ctx context.Context) (*fakeec2.Server, map[string]string) {
	t.Helper()
	ec2 := fakeec2.New(ec2Instances(regionNodes)...)
	urls := serveEC2(t, ec2, region, otherRegion)
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ccmNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, n := range regionNodes {
		register(t, ctx, n)
	}
	return ec2, urls
}

// TestAWSCCMOtherRegion reproduces upstream kubernetes/cloud-provider-aws#939
// with the unmodified CCM: configured for one region and run as its release
// would be (its RBAC) but ungated, it asks its own region's EC2 endpoint about
// the other region's NotReady node, is told the instance does not exist, and
// deletes the node; its own region's nodes stay. That the fake answers as
// EC2 does across regions is what this proves.
func TestAWSCCMOtherRegion(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ec2, urls := regionCluster(t, ctx)
	before := map[string]string{}
	for _, n := range regionNodes[:3] {
		o, err := env.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before[n.name] = o.ResourceVersion
	}

	const sa = "aws-ccm-one-region"
	token := grantRelease(t, ctx, sa, false)
	kubeconfig := writeTokenKubeconfig(t, &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}}, token)
	ccm := renderCCM(t, ctx, "native-ccm-aws-one-region", nil)
	startCCM(t, ctx, ccmProcess{container: ccm, conf: cloudConf(region, urls[region]), kubeconfig: kubeconfig, authKubeconfig: kubeconfig, secret: fakeSecret})

	gone(t, ctx, usNotReady.name, ec2)
	deleting := waitDeletingEvent(t, ctx, usNotReady.name)
	t.Logf("the %s CCM deleted %s: %s", region, usNotReady.name, deleting)

	// Two more monitor periods (each asks about its own NotReady node
	// twice) before judging what it left alone.
	seen := asked(ec2, euNotReady.instanceID, region)
	poll(t, ctx, "two more monitor periods", func() bool { return asked(ec2, euNotReady.instanceID, region) >= seen+4 })

	calls := ec2.Calls()
	t.Logf("the %s CCM's calls (%d):\n  %s", region, len(calls), strings.Join(summarize(calls), "\n  "))
	if !slices.ContainsFunc(calls, func(c fakeec2.Call) bool {
		return c.Region == region && slices.Contains(c.InstanceIDs, usNotReady.instanceID) && c.Error == "InvalidInstanceID.NotFound"
	}) {
		t.Errorf("never asked %s about %s (of %s) and was told it does not exist", region, usNotReady.instanceID, otherRegion)
	}
	for _, c := range calls {
		if c.Service != fakeec2.IMDS && (c.Region != region || c.SignedRegion != region) {
			t.Errorf("call %s sent to region %q signed for %q, want %s", c, c.Region, c.SignedRegion, region)
		}
	}
	for name, rv := range before {
		o, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("node %s: %v", name, err)
		} else if o.ResourceVersion != rv {
			t.Errorf("node %s was changed: taints %v", name, o.Spec.Taints)
		}
	}
}

// TestAWSCCMRegionDomains is what the product makes of the same cluster:
// one CCM per region, each behind its own ccm-gate showing it only the nodes
// of its domain (platform aws and topology.kubernetes.io/region=<its region>),
// each with its own ServiceAccount, lease and cloud.conf Region. No node of
// either region is deleted; when the other region's instance is terminated,
// that region's CCM deletes exactly its node, and the first region's CCM
// never asks EC2 about it.
func TestAWSCCMRegionDomains(t *testing.T) {
	if !gateHasFlag(t, "--domain-selector") {
		t.Skip("needs --domain-selector: this ccm-gate has no such flag yet")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ec2, urls := regionCluster(t, ctx)

	leases := map[string]string{} // region -> lease name
	releases := map[string]nativeRelease{}
	outputs := map[string]*testenv.Buffer{}
	for _, r := range []string{region, otherRegion} {
		name := "aws-" + r
		rel := confineRelease(t, ctx, name, false)
		// its grant names its domain: the fence's half
		if err := fencepkg.EnsureGrant(ctx, rel.client, fencepkg.Grant{NativeCCM: name, Namespace: ccmNamespace, Platform: "aws",
			Domain: fencepkg.DomainGrant{Require: map[string][]string{corev1.LabelTopologyRegion: {r}}}}); err != nil {
			t.Fatal(err)
		}
		releases[r] = rel
		ccm := renderCCM(t, ctx, "native-ccm-"+name, nil)
		leases[r] = leaseName(t, ccm)
		_, outputs[r] = rel.start(t, ctx, ccmProcess{container: ccm, conf: cloudConf(r, urls[r]), secret: fakeSecret, leaderElect: true},
			"--domain-selector="+corev1.LabelTopologyRegion+"="+r)
	}
	// The fence, whatever the view shows: the first region's identity may
	// not delete the other region's node, even asking the API server itself.
	direct := kubernetes.NewForConfigOrDie(releases[region].direct)
	poll(t, ctx, "the fence refuses the "+region+" CCM the "+otherRegion+" node", func() bool {
		err := direct.CoreV1().Nodes().Delete(ctx, usNotReady.name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "outside the domain of NativeCCM aws-"+region)
	})
	if leases[region] == leases[otherRegion] {
		t.Fatalf("both releases use lease %s", leases[region])
	}
	holders := map[string]bool{}
	for r, l := range leases {
		var lease *coordinationv1.Lease
		poll(t, ctx, "the "+r+" CCM holds lease "+l, func() bool {
			var err error
			lease, err = env.Client.CoordinationV1().Leases(ccmNamespace).Get(ctx, l, metav1.GetOptions{})
			return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != ""
		})
		holders[*lease.Spec.HolderIdentity] = true
	}
	if len(holders) != 2 {
		t.Errorf("lease holders %v, want one CCM each", holders)
	}

	// Each CCM checks its own NotReady node, three monitor periods, and
	// deletes nothing.
	var missing []string
	poll(t, ctx, "three monitor periods of each CCM, or a node deleted", func() bool {
		missing = absent(t, ctx, regionNodes)
		return len(missing) > 0 || asked(ec2, euNotReady.instanceID, region) >= 6 && asked(ec2, usNotReady.instanceID, otherRegion) >= 6
	})
	if len(missing) > 0 {
		t.Fatalf("nodes %v deleted; calls:\n  %s", missing, strings.Join(summarize(ec2.Calls()), "\n  "))
	}

	// The other region's instance terminated: its node goes, and only it.
	if !ec2.SetState(usNotReady.instanceID, fakeec2.Terminated) {
		t.Fatalf("no instance %s", usNotReady.instanceID)
	}
	gone(t, ctx, usNotReady.name, ec2)
	t.Logf("%s deleted: %s", usNotReady.name, waitDeletingEvent(t, ctx, usNotReady.name))
	seen := asked(ec2, euNotReady.instanceID, region)
	poll(t, ctx, "two more monitor periods of the "+region+" CCM", func() bool { return asked(ec2, euNotReady.instanceID, region) >= seen+4 })
	if missing := absent(t, ctx, regionNodes); !slices.Equal(missing, []string{usNotReady.name}) {
		t.Errorf("nodes %v deleted, want just %s", missing, usNotReady.name)
	}

	calls := ec2.Calls()
	t.Logf("the two CCMs' calls (%d):\n  %s", len(calls), strings.Join(summarize(calls), "\n  "))
	for _, c := range calls {
		if c.Service == fakeec2.IMDS {
			t.Errorf("metadata request %s", c)
			continue
		}
		if c.Region != c.SignedRegion {
			t.Errorf("call %s sent to %q signed for %q", c, c.Region, c.SignedRegion)
		}
		for _, n := range regionNodes {
			if slices.Contains(c.InstanceIDs, n.instanceID) && c.Region != fakeec2.RegionOf(n.zone) {
				t.Errorf("the %s CCM asked about %s, an instance of %s: %s", c.Region, n.instanceID, fakeec2.RegionOf(n.zone), c)
			}
		}
	}
	// The first region's CCM was told of no node of the other region: its
	// output never names one. The other region's recorded the deletion
	// (the event broadcaster logs every event it sends).
	for _, n := range regionNodes {
		if r := fakeec2.RegionOf(n.zone); r != region && strings.Contains(outputs[region].String(), n.name) {
			t.Errorf("the %s CCM's output names %s, a node of %s", region, n.name, r)
		}
	}
	if !slices.ContainsFunc(strings.Split(outputs[otherRegion].String(), "\n"), func(l string) bool {
		return strings.Contains(l, `object="`+usNotReady.name+`"`) && strings.Contains(l, `reason="DeletingNode"`)
	}) {
		t.Errorf("the %s CCM's output does not record deleting %s", otherRegion, usNotReady.name)
	}
}

// gateHasFlag reports whether the ccm-gate binary knows the flag (its usage
// names it).
func gateHasFlag(t *testing.T, flag string) bool {
	t.Helper()
	out, _ := exec.Command(gateBin, "--help").CombinedOutput()
	if !strings.Contains(string(out), "--listen") {
		t.Fatalf("ccm-gate --help printed no usage:\n%s", out)
	}
	return strings.Contains(string(out), flag)
}

// leaseName is the --leader-elect-resource-name of the CCM container.
func leaseName(t *testing.T, ccm corev1.Container) string {
	t.Helper()
	for _, a := range ccm.Args {
		if v, ok := strings.CutPrefix(a, "--leader-elect-resource-name="); ok {
			return v
		}
	}
	t.Fatalf("CCM args %v name no lease", ccm.Args)
	return ""
}

// absent returns the names of the nodes that no longer exist.
func absent(t *testing.T, ctx context.Context, nodes []node) []string {
	t.Helper()
	var out []string
	for _, n := range nodes {
		_, err := env.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			out = append(out, n.name)
		} else if err != nil {
			t.Errorf("node %s: %v", n.name, err)
		}
	}
	return out
}

// waitDeletingEvent waits for the event cloud-node-lifecycle records when it
// deletes a node (reason DeletingNode) and returns its message.
func waitDeletingEvent(t *testing.T, ctx context.Context, node string) string {
	t.Helper()
	var msg string
	poll(t, ctx, "a DeletingNode event for "+node, func() bool {
		events, err := env.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node, "reason": "DeletingNode"}.String()})
		if err != nil || len(events.Items) == 0 {
			return false
		}
		msg = events.Items[0].Source.Component + ": " + events.Items[0].Message
		return true
	})
	return msg
}
