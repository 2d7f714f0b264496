package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
)

// awsSplitSecret is the credentials Secret of a split aws NativeCCM: its
// cloud.conf names another region, which each member's replaces.
func awsSplitSecret(t *testing.T, name string) {
	createSecret(t, name, map[string]string{
		"access-key-id": "AKIATEST", "secret-access-key": "secret",
		"cloud.conf": "[Global]\nRegion = us-west-2\nVPC = vpc-1\nKubernetesClusterID = test\n",
	})
}

// memberCloudConfig is the cloud.conf a member's release wrote.
func memberCloudConfig(t *testing.T, release string) (string, error) {
	var s corev1.Secret
	if err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: releaseNamespace, Name: release + "-cloud-config"}, &s); err != nil {
		return "", err
	}
	return string(s.Data["cloud.conf"]), nil
}

// TestSplitByRegion: an aws NativeCCM split by region over nodes in two
// regions runs one release per region, each with its own ServiceAccount,
// its region in cloud.conf and its view narrowed to its region, reported in
// status.members; when a region's nodes are gone, its member is uninstalled
// and the other stays; without the split again, the NativeCCM's own release
// replaces the member.
func TestSplitByRegion(t *testing.T) {
	const platform = "split-a"
	awsSplitSecret(t, "split-a-credentials")
	createRegionNode(t, "split-eu-1", platform, "eu-west-1", "aws:///eu-west-1a/i-0a01")
	createRegionNode(t, "split-eu-2", platform, "eu-west-1", "aws:///eu-west-1b/i-0a02")
	createRegionNode(t, "split-us-1", platform, "us-east-1", "aws:///us-east-1a/i-0b01")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: platform}, Spec: v1.NativeCCMSpec{
		Platform:             platform,
		Credentials:          &v1.Credentials{SecretRef: meta.LocalObjectReference{Name: "split-a-credentials"}},
		Domain:               &v1.Domain{SplitBy: regionLabel},
		UninstallGracePeriod: &metav1.Duration{},
	}})

	waitMessage(t, platform, meta.ReadyCondition, metav1.ConditionTrue, v1.UpToDateReason,
		"2 member release(s)", "native-ccm-split-a--eu-west-1 (eu-west-1, 2 node(s))", "native-ccm-split-a--us-east-1 (us-east-1, 1 node(s))")
	// the patch helper writes the conditions before the rest of the status
	var obj *v1.NativeCCM
	eventually(t, "status.members: both regions ready", func() (bool, string) {
		obj = getNativeCCM(t, platform)
		return len(obj.Status.Members) == 2 && obj.Status.Members[0].Ready && obj.Status.Members[1].Ready, fmt.Sprintf("%+v", obj.Status.Members)
	})
	if obj.Status.Release != nil {
		t.Errorf("a split NativeCCM has a release of its own: %+v", obj.Status.Release)
	}
	want := []struct {
		value string
		nodes int32
	}{{"eu-west-1", 2}, {"us-east-1", 1}}
	if len(obj.Status.Members) != len(want) {
		t.Fatalf("status.members %+v, want %v", obj.Status.Members, want)
	}
	for i, w := range want {
		m := obj.Status.Members[i]
		rel := "native-ccm-split-a--" + w.value
		if m.Value != w.value || m.Release != rel || m.Nodes != w.nodes || !m.Ready || m.Revision < 1 {
			t.Errorf("status.members[%d] = %+v, want value %s, release %s, %d node(s), ready", i, m, w.value, rel, w.nodes)
		}
		d, err := getDeployment(t, rel)
		if err != nil {
			t.Fatalf("member %s: %v", rel, err)
		}
		if sa := d.Spec.Template.Spec.ServiceAccountName; sa != rel {
			t.Errorf("member %s runs as ServiceAccount %s, want %s (the fence reads the value from it)", rel, sa, rel)
		}
		if args := strings.Join(gateArgs(d), " "); !strings.Contains(args, "--domain-selector="+regionLabel+" in ("+w.value+")") {
			t.Errorf("member %s: ccm-gate args %s, want its region's view", rel, args)
		}
		conf, err := memberCloudConfig(t, rel)
		if err != nil {
			t.Fatalf("member %s: its cloud config: %v", rel, err)
		}
		// the credentials' file first, the member's region after it (gcfg takes the last)
		if !strings.HasPrefix(conf, "[Global]\nRegion = us-west-2\nVPC = vpc-1\n") || !strings.HasSuffix(strings.TrimSpace(conf), "[Global]\nRegion = \""+w.value+"\"") {
			t.Errorf("member %s: cloud.conf %q, want the credentials' file followed by [Global] Region = %q", rel, conf, w.value)
		}
		var vols []string
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil {
				vols = append(vols, v.Secret.SecretName)
			}
		}
		if !slices.Contains(vols, rel+"-cloud-config") || slices.Contains(vols, "split-a-credentials") {
			t.Errorf("member %s mounts Secrets %v, want its own cloud config and not the credentials' file", rel, vols)
		}
		var sa corev1.ServiceAccount
		if err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: releaseNamespace, Name: rel}, &sa); err != nil {
			t.Errorf("member %s: ServiceAccount: %v", rel, err)
		}
	}
	noDeployment(t, "native-ccm-split-a")
	if ok, seen := hasEvent(t, platform, v1.InstallSucceededReason); !ok {
		t.Fatalf("no %s event: %s", v1.InstallSucceededReason, seen)
	}

	// us-east-1's node goes: its member is uninstalled, eu-west-1's stays.
	deleteNode(t, "split-us-1")
	eventually(t, "the us-east-1 member uninstalled", func() (bool, string) {
		_, err := getDeployment(t, "native-ccm-split-a--us-east-1")
		return apierrors.IsNotFound(err), fmt.Sprintf("Deployment: %v", err)
	})
	waitMessage(t, platform, meta.ReadyCondition, metav1.ConditionTrue, v1.UpToDateReason, "1 member release(s)", "native-ccm-split-a--eu-west-1")
	// the patch helper writes the conditions before the rest of the status
	eventually(t, "status.members: eu-west-1 alone", func() (bool, string) {
		obj = getNativeCCM(t, platform)
		return len(obj.Status.Members) == 1 && obj.Status.Members[0].Value == "eu-west-1", fmt.Sprintf("%+v", obj.Status.Members)
	})
	if _, err := getDeployment(t, "native-ccm-split-a--eu-west-1"); err != nil {
		t.Errorf("the eu-west-1 member: %v", err)
	}
	if _, err := memberCloudConfig(t, "native-ccm-split-a--us-east-1"); !apierrors.IsNotFound(err) {
		t.Errorf("the us-east-1 member's cloud config is left: %v", err)
	}
	if ok, seen := hasEvent(t, platform, v1.UninstallSucceededReason); !ok {
		t.Fatalf("no %s event: %s", v1.UninstallSucceededReason, seen)
	}

	// The split taken out (its nodes are in one region now): the member goes,
	// the NativeCCM's own release comes.
	obj = getNativeCCM(t, platform)
	obj.Spec.Domain = nil
	if err := k8s.Update(ctxT(t), obj); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the member replaced by the NativeCCM's own release", func() (bool, string) {
		_, memberErr := getDeployment(t, "native-ccm-split-a--eu-west-1")
		_, ownErr := getDeployment(t, "native-ccm-split-a")
		return apierrors.IsNotFound(memberErr) && ownErr == nil, fmt.Sprintf("member: %v, own: %v", memberErr, ownErr)
	})
	eventually(t, "status: the own release, no members", func() (bool, string) {
		obj = getNativeCCM(t, platform)
		return obj.Status.Release != nil && len(obj.Status.Members) == 0 && conditions.IsReady(obj),
			fmt.Sprintf("release %+v, members %+v, ready %v", obj.Status.Release, obj.Status.Members, conditions.IsReady(obj))
	})
}

// TestInvalidSplit: a split the profile cannot make, or one with load
// balancers, stalls naming spec.domain.splitBy and installs nothing; a node
// value that cannot name a member is reported naming the node and value.
func TestInvalidSplit(t *testing.T) {
	const platform = "split-b"
	awsSplitSecret(t, "aws-ccm")
	createRegionNode(t, "splitb-1", platform, "eu-west-1", "aws:///eu-west-1a/i-0c01")
	for _, tc := range []struct {
		name string
		spec v1.NativeCCMSpec
		want []string
	}{
		{"split-b-label", v1.NativeCCMSpec{Domain: &v1.Domain{SplitBy: v1.DomainLabel}},
			[]string{"spec.domain.splitBy", v1.DomainLabel, "only be split by its boundary label " + regionLabel}},
		{"split-b-lb", v1.NativeCCMSpec{Domain: &v1.Domain{SplitBy: regionLabel}, LoadBalancers: &v1.LoadBalancers{Enabled: true, Class: "hybridccm.io/split-b-lb"}},
			[]string{"spec.domain.splitBy", "serves no load balancers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.Platform, tc.spec.Profile = platform, platform
			createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: tc.name}, Spec: tc.spec})
			obj := waitMessage(t, tc.name, meta.StalledCondition, metav1.ConditionTrue, v1.InvalidDomainReason, tc.want...)
			if len(obj.Status.Members) != 0 {
				t.Errorf("status.members %+v, want none", obj.Status.Members)
			}
			noDeployment(t, "native-ccm-"+tc.name+"--eu-west-1")
		})
	}

	t.Run("value", func(t *testing.T) {
		// a region value no member can be named by (not a DNS label)
		createRegionNode(t, "splitb-bad", platform, "EU_West", "aws:///x/i-0c02")
		createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "split-b-value"}, Spec: v1.NativeCCMSpec{
			Platform: platform, Profile: platform, Domain: &v1.Domain{SplitBy: regionLabel}}})
		waitMessage(t, "split-b-value", v1.NodesOwnedCondition, metav1.ConditionFalse, v1.InvalidDomainReason,
			`node splitb-bad has `+regionLabel+`="EU_West", which cannot name a member`)
		waitMessage(t, "split-b-value", meta.ReadyCondition, metav1.ConditionTrue, v1.UpToDateReason, "native-ccm-split-b-value--eu-west-1")
		var obj *v1.NativeCCM
		eventually(t, "status.members: eu-west-1 alone", func() (bool, string) {
			obj = getNativeCCM(t, "split-b-value")
			return len(obj.Status.Members) == 1 && obj.Status.Members[0].Value == "eu-west-1", fmt.Sprintf("%+v", obj.Status.Members)
		})
		if c := conditions.Get(obj, v1.NodesOwnedCondition); c == nil || c.Status != metav1.ConditionFalse {
			t.Errorf("NodesOwned %+v, want False naming the node", c)
		}

		// The NativeCCM goes: so does its member.
		if err := k8s.Delete(ctxT(t), &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "split-b-value"}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the member uninstalled with its NativeCCM", func() (bool, string) {
			_, err := getDeployment(t, "native-ccm-split-b-value--eu-west-1")
			return apierrors.IsNotFound(err), fmt.Sprintf("Deployment: %v", err)
		})
	})
}

// TestSplitMembersBounded: a kubelet may set its own region label, so the
// members a split NativeCCM's nodes can ask for are bounded: an installed
// member keeps its place, a new value beyond the bound gets no member and is
// reported (NodesOwned=False naming the value and the node), and
// status.members says exactly what runs. (The review of the split: one node
// relabelling itself left a member per value; 65 values made status.members
// unwritable.)
func TestSplitMembersBounded(t *testing.T) {
	const platform = "split-c"
	maxMembers.Store(2)
	t.Cleanup(func() { maxMembers.Store(32) })
	awsSplitSecret(t, "split-c-credentials")
	createRegionNode(t, "splitc-1", platform, "eu-west-1", "aws:///eu-west-1a/i-0d01")
	createRegionNode(t, "splitc-2", platform, "us-east-1", "aws:///us-east-1a/i-0d02")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: platform}, Spec: v1.NativeCCMSpec{
		Platform:    platform,
		Credentials: &v1.Credentials{SecretRef: meta.LocalObjectReference{Name: "split-c-credentials"}},
		Domain:      &v1.Domain{SplitBy: regionLabel},
	}})
	eventually(t, "two members", func() (bool, string) {
		obj := getNativeCCM(t, platform)
		return len(obj.Status.Members) == 2, fmt.Sprintf("%+v", obj.Status.Members)
	})
	// a third value (a node that set its own label, say) gets none
	createRegionNode(t, "splitc-3", platform, "ap-south-1", "aws:///ap-south-1a/i-0d03")
	waitMessage(t, platform, v1.NodesOwnedCondition, metav1.ConditionFalse, v1.InvalidDomainReason,
		regionLabel+"=ap-south-1 (node splitc-3) gets no member: NativeCCM split-c has 2 already")
	obj := getNativeCCM(t, platform)
	var values []string
	for _, m := range obj.Status.Members {
		values = append(values, m.Value)
	}
	if strings.Join(values, ",") != "eu-west-1,us-east-1" {
		t.Errorf("status.members %v, want the two installed ones", values)
	}
	if _, err := getDeployment(t, "native-ccm-split-c--ap-south-1"); err == nil {
		t.Error("a member beyond the bound was installed")
	}
	// The warning is an event once, not once per reconcile: nodes that
	// change make the coordinator look again.
	for i := range 3 {
		var n corev1.Node
		if err := k8s.Get(ctxT(t), client.ObjectKey{Name: "splitc-1"}, &n); err != nil {
			t.Fatal(err)
		}
		n.Labels["example.com/touched"] = fmt.Sprint(i)
		if err := k8s.Update(ctxT(t), &n); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	var list corev1.EventList
	if err := k8s.List(ctxT(t), &list, client.MatchingFields{"involvedObject.name": platform}); err != nil {
		t.Fatal(err)
	}
	warned := int32(0)
	for _, e := range list.Items {
		if e.Reason == v1.InvalidDomainReason {
			warned += max(e.Count, 1)
		}
	}
	if warned != 1 {
		t.Errorf("the unserved value was warned of %d times, want once", warned)
	}
}
