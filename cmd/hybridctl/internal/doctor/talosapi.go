package doctor

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/reach"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/safetext"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
)

// CheckTalosAPIUnreachable: talos-ccm cannot reach a node's Talos API (its
// TalosAPIUnavailable Warning on the Node is current).
const CheckTalosAPIUnreachable = "TalosAPIUnreachable"

// TalosAPIEventWindow: a TalosAPIUnavailable event last seen longer ago than
// this is over (talos-ccm records it again every reach.DefaultRepeat while
// the node stays unreachable, and looks every node up at least every
// --node-status-update-frequency, 5 minutes by default).
const TalosAPIEventWindow = 3 * reach.DefaultRepeat

const talosAPIDoc = `docs/troubleshooting.md, "The Talos API of a node cannot be reached"`

// lastSeen is when an event last happened.
func lastSeen(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}

// eventClockSkew is how far ahead of doctor's clock an event may be dated
// and still be believed. Events are anyone's to write (every kubelet may
// create them in any namespace): one dated further ahead would stay the
// latest, and current, for as long as it exists.
const eventClockSkew = 5 * time.Minute

// latestNodeEvents lists the Node events of reason, the latest per node,
// leaving out those dated after now (with eventClockSkew).
func latestNodeEvents(ctx context.Context, c client.Client, reason string, now time.Time) (map[string]*corev1.Event, error) {
	var l corev1.EventList
	if err := c.List(ctx, &l, client.MatchingFields{"involvedObject.kind": "Node", "reason": reason}); err != nil {
		return nil, err
	}
	out := map[string]*corev1.Event{}
	for i := range l.Items {
		e := &l.Items[i]
		if lastSeen(e).After(now.Add(eventClockSkew)) {
			continue
		}
		if cur := out[e.InvolvedObject.Name]; cur == nil || lastSeen(e).After(lastSeen(cur)) {
			out[e.InvolvedObject.Name] = e
		}
	}
	return out, nil
}

// checkTalosAPI reports the nodes whose latest TalosAPIUnavailable event is
// current: seen within TalosAPIEventWindow and not followed by a
// TalosAPIAvailable (an event of the same second counts as following: the
// one after it is recorded within reach.DefaultRepeat if the node is still
// unreachable).
func (r *Report) checkTalosAPI(ctx context.Context, c client.Client, nodes []corev1.Node, o Options) error {
	down, err := latestNodeEvents(ctx, c, reach.ReasonUnavailable, o.Now)
	if err == nil && len(down) == 0 {
		return nil
	}
	var up map[string]*corev1.Event
	if err == nil {
		up, err = latestNodeEvents(ctx, c, reach.ReasonAvailable, o.Now)
	}
	if apierrors.IsForbidden(err) {
		r.Notes = append(r.Notes, "cannot list events (forbidden): nodes whose Talos API talos-ccm cannot reach are not checked")
		return nil
	}
	if err != nil {
		return fmt.Errorf("list node events: %w", err)
	}
	for i := range nodes {
		name := nodes[i].Name
		e := down[name]
		if e == nil || (e.InvolvedObject.UID != "" && nodes[i].UID != "" && e.InvolvedObject.UID != nodes[i].UID) {
			// none, or one of an earlier node of that name
			continue
		}
		seen := lastSeen(e)
		if a := up[name]; a != nil && !lastSeen(a).Before(seen) {
			continue
		}
		if o.Now.Sub(seen) > TalosAPIEventWindow {
			continue
		}
		// The annotations are the event writer's word: only an address, a
		// hop and a cause of talos-ccm's sets are taken (and printed, and
		// put in a command to run).
		addr := eventAddress(e.Annotations[names.TalosAPIAddressAnnotation])
		hop, cause := talos.Hop(e.Annotations[names.TalosAPIHopAnnotation]), talos.Cause(e.Annotations[names.TalosAPICauseAnnotation])
		ago := o.Now.Sub(seen).Truncate(time.Second)
		if addr == "" || !slices.Contains(talos.Hops, hop) || !slices.Contains(talos.Causes, cause) {
			// an event of an older talos-ccm: its message says what it knew
			r.add(CheckTalosAPIUnreachable, "node/"+name, talosAPIFix("", "", "", name),
				"talos-ccm cannot reach the node's Talos API (last reported %s ago): %s", ago, safetext.Clip(e.Message, 400))
			continue
		}
		via := "no connection to a Talos API endpoint"
		if ep, err := netip.ParseAddrPort(e.Annotations[names.TalosAPIEndpointAnnotation]); err == nil {
			via = "through endpoint " + netip.AddrPortFrom(ep.Addr().WithZone(""), ep.Port()).String()
		}
		r.add(CheckTalosAPIUnreachable, "node/"+name, talosAPIFix(hop, cause, addr, name),
			"talos-ccm cannot reach the node's Talos API at %s port %s, %s: %s at the %s (last reported %s ago, %d time(s))",
			addr, talos.Port, via, cause, hop, ago, max(e.Count, 1))
	}
	return nil
}

// talosAPIFix says what to check for a failure of hop and cause.
func talosAPIFix(hop talos.Hop, cause talos.Cause, addr, node string) string {
	var fix string
	switch {
	case hop == talos.HopNode && cause == talos.CauseTLS:
		fix = fmt.Sprintf("the machine at %s does not present this Talos cluster's certificate: is it this node (talosctl -n %s version), or a machine of another cluster on that address?", addr, addr)
	case hop == talos.HopNode:
		fix = fmt.Sprintf("give the control planes a path to %s port %s: KubeSpan (talosctl -n <control-plane-ip> get kubespanpeerstatus) or routing, and a firewall that lets the control planes in (talosctl -n %s version from a control plane's network)", addr, talos.Port, addr)
	case cause == talos.CausePermissionDenied:
		fix = "allow the role os:reader for talos-ccm's namespace in machine.features.kubernetesTalosAPIAccess (allowedRoles, allowedKubernetesNamespaces) on the control planes"
	case cause == talos.CauseTLS:
		fix = "talos-ccm's talosconfig is not this cluster's or expired: check its talos.dev ServiceAccount Secret and kubernetesTalosAPIAccess on the control planes"
	case hop == talos.HopEndpoint:
		fix = "talos-ccm cannot reach the control planes' apid: kubectl -n default get endpointslices -l kubernetes.io/service-name=talos, and the path from talos-ccm's host network to port " + talos.Port
	default:
		fix = "read the event: kubectl get events --field-selector involvedObject.kind=Node,involvedObject.name=" + node + ",reason=" + reach.ReasonUnavailable
	}
	return fix + "; " + talosAPIDoc
}

// eventAddress is the IP address an event's annotation names, in its
// canonical form, or "" when it names none.
func eventAddress(s string) string {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return ""
	}
	return a.WithZone("").String()
}
