package cloudnode_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloudnode"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// TestUnroutedRefreshRetried: enforce mode and two initialized nodes whose
// Talos API does not answer when talos-ccm first looks: one another CCM
// initialized (no routing label), one already routed. The unrouted one is
// read again with back-off, and once its Talos API answers it gets its
// routing label without anything else happening to the Node: it is not left
// to the informer's resync (StatusUpdateFrequency, five minutes here as in
// talos-ccm's default), during which the gate would not route it to its
// native CCM. The routed one, meanwhile, is not read again before its
// StatusUpdateFrequency: an outage's nodes cost no more lookups than before.
func TestUnroutedRefreshRetried(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ep := talosnode.StartFor(t)
	node := func(name, ip string, labels map[string]string) *talosnode.Node {
		t.Helper()
		machine := metalNode(t, ctx, ep, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       corev1.NodeSpec{ProviderID: "talos://metal/" + ip},
		}, ip)
		machine.SetUnreachable(true, false)
		return machine
	}
	const unrouted, routed = "refresh-unrouted", "refresh-routed"
	unroutedMachine := node(unrouted, "192.0.2.41", nil)
	routedMachine := node(routed, "192.0.2.42", map[string]string{names.PlatformLabel: "metal"})

	src := facts.NewSource(ep.ClientFor(t), cloud.NewInterpreter(nil), facts.Options{})
	defer run(t, env.Client, src, cloudnode.Options{Workers: 1, Enforce: true, StatusUpdateFrequency: 5 * time.Minute})()

	// both first lookups have ended (failed: the Talos API refuses)
	for deadline := time.Now().Add(30 * time.Second); !src.Looked(unrouted) || !src.Looked(routed); {
		if time.Now().After(deadline) {
			t.Fatal("the first lookups never ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
	first, routedCalls := unroutedMachine.Calls(), routedMachine.Calls()
	if first == 0 || routedCalls == 0 {
		t.Fatalf("requests of the first lookups: %d to %s, %d to %s", first, unrouted, routedCalls, routed)
	}
	// the unrouted node is read again (twice more) while it does not answer
	for deadline := time.Now().Add(time.Minute); unroutedMachine.Calls() < 3*first; {
		if time.Now().After(deadline) {
			t.Fatalf("node %s: %d requests to its Talos API after the first lookup's %d: not read again", unrouted, unroutedMachine.Calls(), first)
		}
		time.Sleep(10 * time.Millisecond)
	}
	got, err := env.Client.CoreV1().Nodes().Get(ctx, unrouted, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels[names.PlatformLabel] != "" {
		t.Fatalf("node %s labelled %q while its Talos API did not answer", unrouted, got.Labels[names.PlatformLabel])
	}
	unroutedMachine.SetUnreachable(false, false)

	for deadline := time.Now().Add(time.Minute); ; {
		got, err = env.Client.CoreV1().Nodes().Get(ctx, unrouted, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Labels[names.PlatformLabel] == "metal" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not routed after its Talos API answered again: labels %v (a failed read waits for the informer's resync)", unrouted, got.Labels)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := routedMachine.Calls(); n != routedCalls {
		t.Errorf("node %s (routed) was read again before its StatusUpdateFrequency: %d requests to its Talos API, %d in the first lookup", routed, n, routedCalls)
	}
}

// TestUnroutedRefreshWriteRetried: enforce mode and an initialized node
// another CCM initialized (no routing label) whose Talos API answers, but
// whose Node is written by someone else (its kubelet) while the lookup is in
// flight: talos-ccm's update, made from the informer's copy, is refused (409,
// a stale resourceVersion). The refresh failed and is retried with back-off;
// the retry must read and write again, not take the read whose result was
// never written for done until StatusUpdateFrequency (five minutes here, as
// talos-ccm's default), during which the node stays unrouted.
func TestUnroutedRefreshWriteRetried(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const name, ip = "refresh-conflict", "192.0.2.43"
	ep := talosnode.StartFor(t)
	machine := metalNode(t, ctx, ep, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{ProviderID: "talos://metal/" + ip},
	}, ip)
	machine.Hold()
	defer machine.Release()

	src := facts.NewSource(ep.ClientFor(t), cloud.NewInterpreter(nil), facts.Options{})
	defer run(t, env.Client, src, cloudnode.Options{Workers: 1, Enforce: true, StatusUpdateFrequency: 5 * time.Minute})()

	writtenDuringLookup(t, ctx, machine, name)

	for deadline := time.Now().Add(30 * time.Second); ; {
		got, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Labels[names.PlatformLabel] == "metal" {
			if got.Labels["example.com/written-by-kubelet"] != "yes" {
				t.Errorf("the kubelet's label was lost: labels %v", got.Labels)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not routed 30 s after its refused update: labels %v (the retry took the unwritten read for done)", name, got.Labels)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
