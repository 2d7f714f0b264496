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

// probeGate acts as the hcloud native CCM (impersonating its ServiceAccount, the
// identity the coordinator gave it): it tries to delete an aws node for real —
// what an ungated Hetzner CCM does to nodes it cannot find — and, as a dry run,
// its own hcloud node. The API server's admission policy (the fence) decides.
func probeGate(ctx context.Context, admin *rest.Config, cc client.Client, cs kubernetes.Interface, ownNode, foreignNode string) ([]gateProbe, error) {
	const who = "system:serviceaccount:" + nativeNamespace + ":native-ccm-hcloud"
	// wait until the coordinator has found the fence and hcloud's grant in
	// place (it records what the fence enforces in status.gate)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var obj v1alpha1.NativeCCM
		err := cc.Get(ctx, client.ObjectKey{Name: "hcloud"}, &obj)
		if err == nil && obj.Status.Gate != nil && len(obj.Status.Gate.ProviderIDPrefixes) > 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("NativeCCM hcloud has no status.gate (the coordinator has not found its fence and grant): %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: who,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + nativeNamespace, "system:authenticated"}}
	ccm, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// the fence takes a moment to become active: retry the dry run of the
	// foreign delete until the fence itself answers
	var foreign error
	for i := 0; i < 300; i++ {
		foreign = ccm.CoreV1().Nodes().Delete(ctx, foreignNode, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if foreign != nil && strings.Contains(foreign.Error(), fenceMessage) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if foreign == nil || !strings.Contains(foreign.Error(), fenceMessage) {
		return nil, fmt.Errorf("the fence never denied %s deleting node %s (last answer: %v)", who, foreignNode, foreign)
	}
	// now for real: denied, and the node survives
	foreign = ccm.CoreV1().Nodes().Delete(ctx, foreignNode, metav1.DeleteOptions{})
	own := ccm.CoreV1().Nodes().Delete(ctx, ownNode, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	probes := []gateProbe{
		{Who: who, Target: foreignNode, Allowed: foreign == nil, Message: errMessage(foreign)},
		{Who: who, Target: ownNode + " (dry run)", Allowed: own == nil, Message: errMessage(own)},
	}
	if _, err := cs.CoreV1().Nodes().Get(ctx, foreignNode, metav1.GetOptions{}); err != nil {
		return probes, fmt.Errorf("node %s is gone: %w", foreignNode, err)
	}
	return probes, nil
}

func errMessage(err error) string {
	if err == nil {
		return "allowed"
	}
	return err.Error()
}
