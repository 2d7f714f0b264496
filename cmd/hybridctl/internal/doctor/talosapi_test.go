package doctor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/reach"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/cli"
	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/doctor"
)

// TestDoctorTalosAPI: the nodes whose Talos API talos-ccm reports unreachable
// (its events, as ccm/reach records them) are findings naming the address,
// the endpoint and the cause, with a fix for that cause; a node that answers
// again, one whose event is old, and a deleted one are not.
func TestDoctorTalosAPI(t *testing.T) {
	ctx := context.Background()
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: env.Client.CoreV1().Events("")})
	defer b.Shutdown()
	rep := reach.New(reach.Options{})
	rep.SetRecorder(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: reach.Component}))

	mk := func(name string) *corev1.Node {
		n := node(name, "metal", "talos://metal/"+name, false)
		create(t, c, n)
		t.Cleanup(func() { _ = c.Delete(context.Background(), n) })
		return n
	}
	far, back, role := mk("tapi-far"), mk("tapi-back"), mk("tapi-role")
	gone := node("tapi-gone", "metal", "", false) // never created
	refused := status(t, "dial tcp 10.80.0.1:50000: connect: connection refused")
	rep.Unreachable(far, []talos.Failure{{Node: "10.80.0.1", Endpoint: "10.0.0.2:50000", Hop: talos.HopNode, Cause: talos.CauseRefused, Err: refused}})
	rep.Unreachable(back, []talos.Failure{{Node: "10.80.0.2", Endpoint: "10.0.0.2:50000", Hop: talos.HopNode, Cause: talos.CauseTimeout, Err: context.DeadlineExceeded}})
	rep.Reached(back)
	rep.Unreachable(role, []talos.Failure{{Node: "10.80.0.3", Endpoint: "10.0.0.3:50000", Hop: talos.HopEndpoint, Cause: talos.CausePermissionDenied, Err: errors.New("permission denied")}})
	rep.Unreachable(gone, []talos.Failure{{Node: "10.80.0.4", Hop: talos.HopEndpoint, Cause: talos.CauseRefused, Err: refused}})
	// an older talos-ccm's event (no annotations), of a node still there, long ago
	old := mk("tapi-old")
	create(t, c, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "tapi-old.legacy", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: old.Name, APIVersion: "v1"}, Type: corev1.EventTypeWarning,
		Reason: reach.ReasonUnavailable, Message: "Cannot initialize node yet: dial tcp 10.80.0.5:50000: connection refused", Source: corev1.EventSource{Component: "cloud-node"},
		FirstTimestamp: metav1.NewTime(time.Now().Add(-2 * time.Hour)), LastTimestamp: metav1.NewTime(time.Now().Add(-2 * time.Hour)), Count: 7})
	t.Cleanup(func() {
		var l corev1.EventList
		_ = c.List(context.Background(), &l, client.MatchingFields{"involvedObject.kind": "Node"})
		for i := range l.Items {
			if strings.HasPrefix(l.Items[i].InvolvedObject.Name, "tapi-") {
				_ = c.Delete(context.Background(), &l.Items[i])
			}
		}
	})
	// the recorder writes asynchronously: wait for the 5 events
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var l corev1.EventList
		err := c.List(ctx, &l, client.MatchingFields{"involvedObject.kind": "Node"})
		n := 0
		for _, e := range l.Items {
			if strings.HasPrefix(e.InvolvedObject.Name, "tapi-") && e.Source.Component == reach.Component {
				n++
			}
		}
		return err == nil && n == 5, nil
	}); err != nil {
		t.Fatal("talos-ccm's events were not recorded")
	}

	rep2, err := doctor.Run(ctx, c, doctor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]doctor.Finding{}
	for _, f := range rep2.Findings {
		if f.Check == doctor.CheckTalosAPIUnreachable {
			got[f.Object] = f
		}
	}
	if len(got) != 2 || got["node/tapi-far"].Check == "" || got["node/tapi-role"].Check == "" {
		t.Fatalf("TalosAPIUnreachable findings %v: want node/tapi-far and node/tapi-role", got)
	}
	for obj, want := range map[string][]string{
		"node/tapi-far":  {"10.80.0.1 port 50000", "through endpoint 10.0.0.2:50000", "refused at the node", "1 time(s)"},
		"node/tapi-role": {"10.80.0.3 port 50000", "through endpoint 10.0.0.3:50000", "permission-denied at the endpoint"},
	} {
		for _, s := range want {
			if !strings.Contains(got[obj].Message, s) {
				t.Errorf("%s: message lacks %q: %s", obj, s, got[obj].Message)
			}
		}
		if !strings.Contains(got[obj].Fix, "docs/troubleshooting.md") {
			t.Errorf("%s: fix does not point to the troubleshooting doc: %s", obj, got[obj].Fix)
		}
	}
	if f := got["node/tapi-far"].Fix; !strings.Contains(f, "KubeSpan") || !strings.Contains(f, "10.80.0.1 port 50000") {
		t.Errorf("node/tapi-far: fix %q does not say to give the control planes a path to the node", f)
	}
	if f := got["node/tapi-role"].Fix; !strings.Contains(f, "os:reader") {
		t.Errorf("node/tapi-role: fix %q does not name the role", f)
	}
	// seen 40 minutes later (no event recorded again meanwhile): over
	rep2, err = doctor.Run(ctx, c, doctor.Options{Now: time.Now().Add(40 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep2.Findings {
		if f.Check == doctor.CheckTalosAPIUnreachable {
			t.Errorf("an event older than %s is reported: %s %s", doctor.TalosAPIEventWindow, f.Object, f.Message)
		}
	}
	// the command says it, and exits non-zero
	out, err := runDoctor()
	if !errors.Is(err, cli.ErrFindings) || !strings.Contains(out, "TalosAPIUnreachable") || !strings.Contains(out, "node/tapi-far") {
		t.Errorf("hybridctl doctor = %v:\n%s", err, out)
	}
}

// status is an error as the machinery client returns it.
func status(t *testing.T, msg string) error {
	t.Helper()
	return fmt.Errorf("rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: %s\"", msg)
}
