package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/ipam"
	"github.com/hybrid-ccm/hybrid-ccm/test/nodechurn"
)

// Leader changes between real talos-ccm processes while nodes come and go.
// Two replicas share a lease; only the leader runs node-ipam-controller. The
// leader is killed with SIGKILL (it cannot release the lease: the standby
// takes over once the lease expires, nodes created and deleted meanwhile wait),
// a third replica joins, and the next leader is stopped with SIGTERM. Churn
// never stops. Afterwards every live node has one CIDR per family, no two
// overlap, and the pool takes exactly its capacity: nothing was lost or leaked
// across three leaders.
// acquiredLease says whether a talos-ccm's log says it acquired the Lease
// kube-system/<lease>. client-go's leader election logs it structured since
// 0.37 ("Successfully acquired lease" lock="kube-system/<lease>"; before:
// successfully acquired lease kube-system/<lease>).
func acquiredLease(logs, lease string) bool {
	return strings.Contains(logs, `"Successfully acquired lease" lock="kube-system/`+lease+`"`)
}

func TestIPAMLeaderHandover(t *testing.T) {
	ep := startEndpoint(t)
	lease := fmt.Sprintf("ipam-handover-%d", time.Now().UnixNano())
	v4, v6 := netip.MustParsePrefix("10.190.0.0/22"), netip.MustParsePrefix("fd00:190::/58")
	const capacity = 64 // /28s of a /22, /64s of a /58
	const maxLive = 40
	const label = "e2e.hybrid-ccm.io/test"
	args := talosCCMArgs(t, ep,
		"--controllers=node-ipam-controller",
		"--allocate-node-cidrs",
		"--cidr-allocator-type=RangeAllocator",
		"--cluster-cidr="+v4.String()+","+v6.String(),
		"--node-cidr-mask-size-ipv4=28",
		"--node-cidr-mask-size-ipv6=64",
		"--leader-elect-lease-duration=3s",
		"--leader-elect-renew-deadline=2s",
		"--leader-elect-retry-period=250ms",
		"--leader-elect-resource-name="+lease,
	)
	for i, a := range args {
		if a == "--leader-elect=false" {
			args[i] = "--leader-elect=true"
		}
	}
	ctx := context.Background()
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: label + "=ipam-leader"})
	})
	newNode := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{label: "ipam-leader"}}}
	}

	replicas := []*process{startTalosCCM(t, args), startTalosCCM(t, args)}
	// leader waits for a replica (other than the ones in gone) that says it
	// acquired the lease.
	leader := func(gone ...*process) *process {
		t.Helper()
		var found *process
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
			for _, p := range replicas {
				skip := false
				for _, g := range gone {
					skip = skip || g == p
				}
				if !skip && acquiredLease(p.logs.String(), lease) {
					found = p
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("no replica became leader of %s", lease)
		}
		return found
	}

	var churn *nodechurn.Churn
	waitCreated := func(n int64) {
		if err := churn.WaitCreated(n); err != nil {
			t.Fatal(err)
		}
	}

	// caughtUp waits until every node live now has its CIDRs (or is gone):
	// the current leader is allocating, not just holding the lease.
	caughtUp := func(who string) {
		t.Helper()
		names := churn.Live()
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			for _, name := range names {
				n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err == nil && len(n.Spec.PodCIDRs) != 2 {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("%s leader did not allocate for the %d live nodes", who, len(names))
		}
	}

	first := leader()
	churn = nodechurn.Start(env.Client, nodechurn.Options{Workers: 3, MaxLive: maxLive, Prefix: "handover-", NewNode: newNode, Pause: 20 * time.Millisecond, Seed: 10})
	waitCreated(60)
	caughtUp("first")
	_ = first.cmd.Process.Kill() // SIGKILL: the lease is not released
	<-first.done
	killed := churn.Created()
	replicas = append(replicas, startTalosCCM(t, args))
	second := leader(first)
	t.Logf("SIGKILL of the leader: %d nodes created before the standby took over", churn.Created()-killed)
	waitCreated(churn.Created() + 60)
	caughtUp("second")
	_ = second.cmd.Process.Signal(syscall.SIGTERM)
	<-second.done
	third := leader(first, second)
	waitCreated(churn.Created() + 60)
	caughtUp("third")
	live, err := churn.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes created, %d live; three leaders in turn", churn.Created(), len(live))

	allocated := func(names []string) map[string][]netip.Prefix {
		t.Helper()
		got := map[string][]netip.Prefix{}
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			for _, name := range names {
				if _, ok := got[name]; ok {
					continue
				}
				n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil || len(n.Spec.PodCIDRs) != 2 {
					return false, nil
				}
				var ps []netip.Prefix
				for _, c := range n.Spec.PodCIDRs {
					p, err := netip.ParsePrefix(c)
					if err != nil {
						return false, fmt.Errorf("%s: pod CIDR %q: %w", name, c, err)
					}
					ps = append(ps, p)
				}
				got[name] = ps
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("not every node got pod CIDRs (%d of %d): %v\nleader logs:\n%s", len(got), len(names), err, tail(third.logs.String(), 4000))
		}
		return got
	}
	noOverlap := func(got map[string][]netip.Prefix) {
		t.Helper()
		type owned struct {
			node string
			p    netip.Prefix
		}
		var all []owned
		for name, ps := range got {
			if len(ps) != 2 || !v4.Contains(ps[0].Addr()) || ps[0].Bits() != 28 || !v6.Contains(ps[1].Addr()) || ps[1].Bits() != 64 {
				t.Errorf("%s: pod CIDRs %v, want a /28 of %s and a /64 of %s", name, ps, v4, v6)
			}
			for _, p := range ps {
				for _, o := range all {
					if o.p.Overlaps(p) {
						t.Errorf("%s (%s) overlaps %s (%s)", name, p, o.node, o.p)
					}
				}
				all = append(all, owned{name, p})
			}
		}
	}

	names := live
	list, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: label + "=ipam-leader"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(live) {
		t.Fatalf("API has %d nodes, the test believes %d are live", len(list.Items), len(live))
	}
	noOverlap(allocated(names))

	// Nothing leaked: the pool takes exactly capacity nodes, the next waits.
	for i := range capacity - len(live) {
		name := "handover-fill-" + strconv.Itoa(i)
		if _, err := env.Client.CoreV1().Nodes().Create(ctx, newNode(name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	noOverlap(allocated(names))
	if _, err := env.Client.CoreV1().Nodes().Create(ctx, newNode("handover-one-too-many"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, "handover-one-too-many", ipam.EventReasonCIDRNotAvailable, 30*time.Second)
	if err := env.Client.CoreV1().Nodes().Delete(ctx, names[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	allocated([]string{"handover-one-too-many"})
}
