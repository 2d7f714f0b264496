// Package demo runs Hybrid CCM end to end on a real cluster on this
// machine (test/fleet): etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler, and Talos machines of several platforms as real nodes —
// each a kubelet with its own containerd and kube-proxy, answering the Talos
// API on its own address. It releases the product into a registry the
// cluster pulls from, installs it the Talos way (the static manifests of
// docs/deploy, server-side applied), creates NativeCCMs as a user does, and
// shows live what the product does with the nodes: initialized, pod CIDRs,
// serving certificates, native CCMs running gated, load balancers, and an
// outage in which machines really power off.
//
// It is the engine of `hybridctl demo` (and of the tests that run it). No
// traffic leaves the machine: the cluster lives in the demo's own network
// namespace; nothing is downloaded.
//
// It runs on the simulation kit under test/ (fleet, cluster, registry,
// talosnode, fakeec2, fakelb, netns), which hybridctl therefore links:
// nothing here or there may import testing (cmd/hybridctl's
// TestShippedBinaryLinksNoTesting), nor Helm (only the coordinator links it:
// the demo installs the product without it, as Talos does).
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// Options configure a demo run.
type Options struct {
	// Out receives the live view (or, non-interactive, a line per change).
	Out io.Writer
	// Interactive redraws a table in place (ANSI); otherwise prints a log.
	Interactive bool
	// ExitWhenDone returns once the end state is reached (instead of waiting for
	// ctx to be cancelled, e.g. by Ctrl-C).
	ExitWhenDone bool
	// Timeout bounds the wait for the end state, from the product's install.
	Timeout time.Duration
	// TerminalSize, if set, returns the terminal's width and height; the live
	// view cuts its frame to fit (interactive only).
	TerminalSize func() (width, height int)
}

// machine is one Talos machine of the demo: a real node, and what its
// platform reports besides the metadata.
type machine struct {
	fleet.Machine
	extras fleet.TalosExtras
}

// The AWS side of the demo: two regions, each with its own NativeCCM and
// credentials (cloud.conf [Global] Region); awsRegion is the default of the
// fake EC2.
const (
	awsRegion    = "eu-central-1"
	awsRegion2   = "us-east-1"
	awsClusterID = "hybrid-demo"
)

// controlPlane is the machine the product's pods run on (the manifests'
// nodeSelector), as Talos runs them on its control-plane nodes.
const controlPlane = "cp-metal1"

func machines() []machine {
	hetzner := fleet.TalosExtras{Manufacturer: "Hetzner", ProductName: "vServer"}
	withIP := func(x fleet.TalosExtras, ip string) fleet.TalosExtras { x.ExternalIP = ip; return x }
	return []machine{
		{Machine: fleet.Machine{Name: controlPlane, Platform: "metal", ControlPlane: true, Region: "home-dc"}},
		{Machine: fleet.Machine{Name: "web-metal1", Platform: "metal", Region: "home-dc"}},
		{Machine: fleet.Machine{Name: downMetal, Platform: "metal", Region: "home-dc"}},
		{Machine: fleet.Machine{Name: terminatedAWS, Platform: "aws", ProviderID: "aws:///eu-central-1a/i-0a11", Region: awsRegion, Zone: "eu-central-1a", InstanceType: "m6i.large"},
			extras: fleet.TalosExtras{ExternalIP: "198.51.100.11"}},
		{Machine: fleet.Machine{Name: stoppedAWS, Platform: "aws", ProviderID: "aws:///eu-central-1b/i-0a12", Region: awsRegion, Zone: "eu-central-1b", InstanceType: "m6i.large"},
			extras: fleet.TalosExtras{Spot: true, ExternalIP: "198.51.100.12"}},
		{Machine: fleet.Machine{Name: otherRegionAWS, Platform: "aws", ProviderID: "aws:///us-east-1a/i-0b21", Region: awsRegion2, Zone: "us-east-1a", InstanceType: "m6i.large"},
			extras: fleet.TalosExtras{ExternalIP: "198.51.100.21"}},
		{Machine: fleet.Machine{Name: "hcloud-app-1", Platform: "hcloud", InstanceID: "5101", Region: "fsn1", Zone: "fsn1-dc14", InstanceType: "cx32"},
			extras: withIP(hetzner, "95.216.0.11")},
		{Machine: fleet.Machine{Name: goneHcloud, Platform: "hcloud", InstanceID: "5102", Region: "nbg1", Zone: "nbg1-dc3", InstanceType: "cx32"},
			extras: withIP(hetzner, "95.216.0.12")},
		{Machine: fleet.Machine{Name: "gcp-batch-1", Platform: "gcp", ProviderID: "gce://hybrid-demo/europe-west4-a/gcp-batch-1", InstanceID: "7001", Region: "europe-west4", Zone: "europe-west4-a", InstanceType: "e2-standard-4"},
			extras: fleet.TalosExtras{ExternalIP: "34.0.0.11"}},
		{Machine: fleet.Machine{Name: "gcp-batch-2", Platform: "gcp", ProviderID: "gce://hybrid-demo/europe-west4-b/gcp-batch-2", InstanceID: "7002", Region: "europe-west4", Zone: "europe-west4-b", InstanceType: "e2-standard-4"},
			extras: fleet.TalosExtras{ExternalIP: "34.0.0.12"}},
	}
}

// The outage the demo stages once everything runs: which machine goes down
// how. Each powers off for real: its kubelet, containerd and containers die,
// its Talos API stops answering, and kube-controller-manager marks its node
// NotReady after the node-monitor grace period.
const (
	// downMetal is powered off: NotReady, and no cloud's CCM may touch it.
	downMetal = "db-metal1"
	// goneHcloud's server is deleted: the hcloud CCM deletes its node.
	goneHcloud = "hcloud-app-2"
	// terminatedAWS's EC2 instance is terminated: the (real) aws CCM deletes
	// its node.
	terminatedAWS = "aws-web-1"
	// stoppedAWS (a spot instance) is stopped, not deleted: the aws CCM
	// taints it shutdown.
	stoppedAWS = "aws-web-2"
	// otherRegionAWS is the aws machine of the second region: its region's
	// CCM owns it, the first region's never sees it (the fence refuses that
	// one to delete it).
	otherRegionAWS = "aws-api-1"
)

// Rules is the transformations file of the demo.
const Rules = `global:
  clusterName: hybrid-demo
transformations:
  - name: web-on-metal
    nodeSelector:
      - matchExpressions:
          - key: platform
            operator: In
            values: [metal]
          - key: hostname
            operator: Regexp
            values: ['^web-']
    labels:
      node-role.kubernetes.io/web: ""
    platformMetadata:
      Zone: rack-1
  - name: hetzner-hardware
    nodeSelector:
      - matchExpressions:
          - key: manufacturer
            operator: In
            values: [Hetzner]
    labels:
      example.com/vendor: '{{ lower .Manufacturer }}'
`

// ErrNotRoot is returned by Run when it does not run as root.
var ErrNotRoot = errors.New("the demo needs root: it runs a real cluster (kubelets, containerd; namespaces, mounts, cgroups) in a network namespace of its own; run it as root, e.g. `sudo make demo`")

// Run runs the demo until the end state (ExitWhenDone) or until ctx ends; it
// always cleans up what it started.
//
// When ctx is cancelled or SIGINT, SIGTERM or SIGHUP arrive (Ctrl-C), Run stops
// whatever it has started so far, in reverse order, and returns nil: an
// interrupted demo is a normal way to end it, wherever it was. Its last line
// says whether everything was cleaned up. (While the cluster comes up, the
// cluster's own handler has the signals: it takes the cluster down and
// exits.)
func Run(ctx context.Context, o Options) (err error) {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	if netns.Isolated() {
		if err := netns.LoopbackUp(); err != nil {
			return err
		}
	}
	// The clients log through controller-runtime; its lines are not part of
	// the view, and without a logger controller-runtime prints a stack trace.
	ctrllog.SetLogger(logr.Discard())
	v := newView(o.Out, o.Interactive)
	v.size = o.TerminalSize
	// takeSignals replaces this once the cluster is up (below); stopped at
	// the very end, so that a second Ctrl-C cannot cut the cleanup short
	stopSignals := context.CancelFunc(func() {})
	// registered first, so it runs last: after every cleanup below
	var cleanupErrs []error
	cleanup := func(what string, f func() error) {
		v.note(what)
		if err := f(); err != nil {
			cleanupErrs = append(cleanupErrs, fmt.Errorf("%s: %w", what, err))
		}
	}
	defer func() {
		interrupted := errors.Is(ctx.Err(), context.Canceled)
		defer stopSignals()
		if interrupted && err != nil {
			if !errors.Is(err, context.Canceled) {
				v.note("interrupted while: " + err.Error())
			}
			err = nil
		}
		how := "finished"
		if interrupted {
			how = "stopped"
		}
		if cerr := errors.Join(cleanupErrs...); cerr != nil {
			v.note(fmt.Sprintf("demo %s; cleanup incomplete:\n%v", how, cerr))
			if err == nil {
				err = fmt.Errorf("cleanup: %w", cerr)
			}
			return
		}
		v.note("demo " + how + "; everything it started is stopped, the host is as before and its temporary files are removed")
	}()
	work, err := os.MkdirTemp("", "hybrid-ccm-demo-")
	if err != nil {
		return err
	}
	defer cleanup("removing temporary files ("+work+")", func() error { return os.RemoveAll(work) })
	logFile, err := os.Create(filepath.Join(work, "cluster.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	log := &stepLog{f: logFile, v: v}
	// client-go's warnings and klog lines (the cluster's clients) go to the
	// log file: on a terminal they would tear the live table
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	klog.LogToStderr(false)
	klog.SetOutput(logFile)
	defer klog.SetOutput(io.Discard)

	root := testenv.RepoRoot()
	awsCCM, err := awsCCMBinary()
	if err != nil {
		return err
	}
	v.step("building test/testccm, the stand-in for the upstream hcloud and gcp CCM images; the aws CCM is the upstream one: " + awsCCM)
	images, err := upstreamImages(ctx, root, work, awsCCM)
	if err != nil {
		return err
	}

	ms := machines()
	var fms []fleet.Machine
	for _, m := range ms {
		fms = append(fms, m.Machine)
	}
	v.step(fmt.Sprintf("starting a real cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and %d Talos machines as real nodes "+
		"(kubelet, containerd, kube-proxy; each answers the Talos API on its own address), a registry with the upstream CCM images, "+
		"and cluster DNS as Talos deploys it (CoreDNS: its pods wait for a node with a pod network, which talos-ccm's node IPAM gives here)", len(ms)))
	waiting := time.AfterFunc(3*time.Second, log.waiting)
	f, err := fleet.Up(ctx, fleet.Options{Machines: fms, Images: images, Log: log})
	waiting.Stop()
	if err != nil {
		return fmt.Errorf("%w\n%s", err, log.tail())
	}
	defer cleanup("taking the cluster down: nodes and their containers, control plane, registry, Talos API; the host restored", f.Down)
	// test/cluster takes the cluster down and exits at once on SIGINT and
	// SIGTERM; from here the demo stops what it started itself, in order.
	ctx, stopSignals = takeSignals(ctx)
	v.kubectl = fmt.Sprintf("nsenter --net=/proc/%d/ns/net kubectl --kubeconfig=%s", os.Getpid(), f.KubeconfigPath)
	v.note("point kubectl at the cluster while the demo runs (as root; the cluster lives in the demo's network namespace):\n  " + v.kubectl + " get nodes,nativeccms")

	for _, m := range ms {
		if m.extras != (fleet.TalosExtras{}) {
			if err := f.SetTalosExtras(ctx, m.Name, m.extras); err != nil {
				return err
			}
		}
	}
	clouds, err := f.StartClouds(fleet.CloudOptions{AWSRegion: awsRegion, AWSClusterID: awsClusterID})
	if err != nil {
		return err
	}
	defer cleanup("stopping the fake clouds' APIs", clouds.Close)
	v.step(fmt.Sprintf("fake cloud APIs on the cluster's gateway: EC2 for the upstream AWS CCM (%s), the instance and load-balancer API of test/testccm (%s)",
		clouds.EC2URL(), clouds.TestCCMURL()))

	talosObjs, err := readManifest(root, talosCCMManifest)
	if err != nil {
		return err
	}
	if err := editTalosCCM(talosObjs); err != nil {
		return err
	}
	coordObjs, err := readManifest(root, coordinatorManifest)
	if err != nil {
		return err
	}
	shipped := manifestImages(append(append([]*unstructured.Unstructured(nil), talosObjs...), coordObjs...))
	upstream, version, err := releaseOf(shipped)
	if err != nil {
		return err
	}
	v.step(fmt.Sprintf("make release into the registry as %s, version %s: the nodes pull %s unchanged", upstream, version, strings.Join(shipped, ", ")))
	if err := f.ReleaseAs(ctx, upstream, version); err != nil {
		return err
	}
	for _, img := range shipped {
		if err := f.HasImage(ctx, img); err != nil {
			return fmt.Errorf("a manifest names an image the release did not push: %w", err)
		}
	}

	cs := f.Client
	cc, err := controllerClient(f.Config)
	if err != nil {
		return err
	}
	v.step("creating LoadBalancer Services: shop/web-aws (class hybridccm.io/aws: the upstream AWS CCM, a Classic ELB in the fake EC2), shop/web-hcloud, shop/web-gcp (their classes), shop/web (no class: gcp is the default)")
	if err := createServices(ctx, cs); err != nil {
		return err
	}
	v.step(fmt.Sprintf("an impostor: %s's kubelet credential files a serving CSR (%s) with the address of %s", terminatedAWS, forgedCSR, "hcloud-app-1"))
	if err := submitForgedCSR(ctx, f, terminatedAWS, "hcloud-app-1"); err != nil {
		return err
	}

	v.step("applying " + talosCCMManifest + " server-side as Talos applies cluster.externalCloudProvider.manifests (the demo's copy: its transformation rules, node IPAM on); " +
		"answering its talos.dev ServiceAccount as Talos does")
	if err := f.ApplyManifests(ctx, talosObjs); err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	err = f.AnswerTalosServiceAccount(actx, talosCCMNamespace, talosCCMTalosSA)
	cancel()
	if err != nil {
		return err
	}
	v.step("applying " + coordinatorManifest + " (the NativeCCM CRD, ccm-coordinator, its RBAC and the fence) as it is")
	if err := f.ApplyManifests(ctx, coordObjs); err != nil {
		return err
	}
	if err := waitNativeCCMKind(ctx, cc); err != nil {
		return err
	}
	v.step(fmt.Sprintf("creating NativeCCMs %s with their fence grants and credentials Secrets, as a user does with kubectl: "+
		"one aws CCM per region, each owning its region's nodes (spec.domain.selector on %s, cloud.conf [Global] Region)", strings.Join(nativeNames(), ", "), corev1.LabelTopologyRegion))
	if err := createNativeCCMs(ctx, cc, clouds); err != nil {
		return err
	}

	var probes []gateProbe
	seen := map[string]bool{} // nodes seen initialized with pod CIDRs
	outage, reached := false, false
	deadline := time.After(o.Timeout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := observe(ctx, cs, cc, len(ms))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		st.remember(seen)
		st.probes, st.outage, st.questions = probes, outage, clouds.Questions()
		st.lbs = clouds.AllLoadBalancers()
		if st.ready() && probes == nil {
			v.step(fmt.Sprintf("the hcloud CCM's identity tries to delete %s (what an ungated Hetzner CCM does to a node it cannot find), the %s CCM's identity %s, a node of %s (what an ungated AWS CCM of one region does to another region's nodes)",
				terminatedAWS, awsNative, otherRegionAWS, awsRegion2))
			if probes, err = probeGate(ctx, f.Config, cc, cs, "hcloud-app-1", terminatedAWS, otherRegionAWS); err != nil {
				return err
			}
			st.probes = probes
			v.render(st)
			v.step(fmt.Sprintf("outage: %s is powered off; the hcloud server of %s is deleted, the aws instance of %s terminated, the aws spot instance of %s stopped — "+
				"each machine powers off: kubelet silent, NotReady after kube-controller-manager's grace period", downMetal, goneHcloud, terminatedAWS, stoppedAWS))
			if err := startOutage(f, clouds); err != nil {
				return err
			}
			outage = true
			continue
		}
		v.render(st)
		if st.done() {
			if o.ExitWhenDone {
				v.summary(st)
				return st.Check()
			}
			if !reached {
				reached = true
				if !o.Interactive {
					v.note("end state reached: " + st.pending() + " (Ctrl-C stops the demo)")
				}
			}
			v.reached = st.pending()
		}
		select {
		case <-ctx.Done():
			v.summary(st)
			return nil
		case <-deadline:
			if o.ExitWhenDone {
				return fmt.Errorf("end state not reached within %s: %s\n%s", o.Timeout, st.pending(), productLogs(context.Background(), f))
			}
		case <-tick.C:
		}
	}
}

// takeSignals takes SIGINT, SIGTERM and SIGHUP (the terminal closed) for the
// returned context (which ends with any), from every handler before:
// test/cluster's, which takes the cluster down and exits at once. Ignoring
// them first means no signal finds the default action (exit without
// cleanup) in between.
func takeSignals(ctx context.Context) (context.Context, context.CancelFunc) {
	signal.Ignore(os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
}

// startOutage takes the machines down in their clouds, then powers them off,
// the metal one first: a CCM whose view leaked it would see it in the same
// pass as its own nodes.
func startOutage(f *fleet.Fleet, clouds *fleet.Clouds) error {
	if err := clouds.Terminate(goneHcloud); err != nil {
		return err
	}
	if err := clouds.Terminate(terminatedAWS); err != nil {
		return err
	}
	if err := clouds.Stop(stoppedAWS); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i, name := range []string{downMetal, goneHcloud, terminatedAWS, stoppedAWS} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f.PowerOff(name) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// productLogs are the tails of the product's pods' logs, for an end state
// not reached.
func productLogs(ctx context.Context, f *fleet.Fleet) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, ns := range []string{talosCCMNamespace, nativeNamespace} {
		// Not Talos' CoreDNS (in kube-system too): not the product.
		pods, err := f.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "!k8s-app"})
		if err != nil {
			fmt.Fprintf(&b, "pods of %s: %v\n", ns, err)
			continue
		}
		for _, p := range pods.Items {
			for _, c := range p.Spec.Containers {
				logs, err := f.PodLogs(ctx, ns, p.Name, c.Name)
				if err != nil {
					fmt.Fprintf(&b, "--- %s/%s %s: %s, %v\n", ns, p.Name, c.Name, p.Status.Phase, err)
					continue
				}
				fmt.Fprintf(&b, "--- %s/%s %s (tail) ---\n%s\n", ns, p.Name, c.Name, tailString(logs, 2000))
			}
		}
	}
	return b.String()
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func controllerClient(cfg *rest.Config) (client.Client, error) {
	sch := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(sch); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: sch})
}

// stepLog is the cluster's and the fleet's log: every line into a file, the
// lines of their steps ("cluster: ...", "fleet: ...") to the view as well;
// what make release prints only to the file.
type stepLog struct {
	mu   sync.Mutex
	f    *os.File
	v    *view
	part []byte
	last []string
}

func (l *stepLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.f.Write(p)
	l.part = append(l.part, p...)
	for {
		i := strings.IndexByte(string(l.part), '\n')
		if i < 0 {
			break
		}
		line := string(l.part[:i])
		l.part = l.part[i+1:]
		l.last = append(l.last, line)
		if len(l.last) > 40 {
			l.last = l.last[1:]
		}
		if strings.HasPrefix(line, "cluster: ") || strings.HasPrefix(line, "fleet: ") {
			l.v.detail(line)
		}
	}
	return len(p), nil
}

// waiting says, if the cluster has logged nothing yet, that it is waiting
// for the machine's cluster lock: one cluster at a time (a test's, say).
func (l *stepLog) waiting() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) == 0 {
		l.v.detail("waiting for another cluster on this machine to go down (one at a time: a test may hold it for a few minutes)")
	}
}

// tail is the log's last lines.
func (l *stepLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.last, "\n")
}
