package demo

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
)

// gateProbe is one write attempted as a native CCM's ServiceAccount.
type gateProbe struct {
	// Who is the ServiceAccount user name, Target the node.
	Who, Target string
	// Allowed is what the API server decided; Message its answer.
	Allowed bool
	Message string
}

// fenceMessage starts every denial of the product's fence.
const fenceMessage = "hybrid-ccm gate"

// probeGate acts as native CCMs (impersonating their ServiceAccounts, the
// identities the coordinator gave them), deleting nodes not theirs for real:
// the hcloud CCM an aws node (foreignNode) — what an ungated Hetzner CCM does
// to nodes it cannot find — and the first aws region's CCM the other
// region's node (otherRegionNode) — what an ungated AWS CCM of one region
// does to another region's nodes (kubernetes/cloud-provider-aws#939); and, as
// a dry run, the hcloud CCM its own hcloud node. The API server's admission
// policy (the fence) decides: by platform, then by domain.
func probeGate(ctx context.Context, admin *rest.Config, cc client.Client, cs kubernetes.Interface, ownNode, foreignNode, otherRegionNode string) ([]gateProbe, error) {
	// wait until the coordinator has found the fence and the grants in
	// place (it records what the fence enforces in status.gate)
	deadline := time.Now().Add(60 * time.Second)
	for _, name := range []string{"hcloud", awsNative} {
		for {
			var obj v1alpha1.NativeCCM
			err := cc.Get(ctx, client.ObjectKey{Name: name}, &obj)
			if err == nil && obj.Status.Gate != nil && len(obj.Status.Gate.ProviderIDPrefixes) > 0 {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("NativeCCM %s has no status.gate (the coordinator has not found its fence and grant): %v", name, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	hcloud, err := impersonate(admin, "hcloud")
	if err != nil {
		return nil, err
	}
	aws, err := impersonate(admin, awsNative)
	if err != nil {
		return nil, err
	}
	var probes []gateProbe
	p, err := fencedDelete(ctx, hcloud, cs, foreignNode)
	if err != nil {
		return nil, err
	}
	own := hcloud.CoreV1().Nodes().Delete(ctx, ownNode, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	probes = append(probes, p, gateProbe{Who: hcloud.who, Target: ownNode + " (dry run)", Allowed: own == nil, Message: errMessage(own)})
	p, err = fencedDelete(ctx, aws, cs, otherRegionNode)
	return append(probes, p), err
}

// nativeClient is a client acting as a native CCM's ServiceAccount.
type nativeClient struct {
	kubernetes.Interface
	who string
}

// impersonate returns a client of NativeCCM name's ServiceAccount.
func impersonate(admin *rest.Config, name string) (nativeClient, error) {
	who := "system:serviceaccount:" + nativeNamespace + ":" + v1alpha1.ReleasePrefix + name
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: who,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + nativeNamespace, "system:authenticated"}}
	c, err := kubernetes.NewForConfig(cfg)
	return nativeClient{c, who}, err
}

// fencedDelete deletes node as ccm once the fence answers its dry run (it
// takes a moment to become active), and checks that the node survives.
func fencedDelete(ctx context.Context, ccm nativeClient, cs kubernetes.Interface, node string) (gateProbe, error) {
	var err error
	for i := 0; i < 300; i++ {
		err = ccm.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), fenceMessage) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), fenceMessage) {
		return gateProbe{}, fmt.Errorf("the fence never denied %s deleting node %s (last answer: %v)", ccm.who, node, err)
	}
	// now for real: denied, and the node survives
	err = ccm.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
	p := gateProbe{Who: ccm.who, Target: node, Allowed: err == nil, Message: errMessage(err)}
	if _, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
		return p, fmt.Errorf("node %s is gone: %w", node, err)
	}
	return p, nil
}

func errMessage(err error) string {
	if err == nil {
		return "allowed"
	}
	return err.Error()
}
