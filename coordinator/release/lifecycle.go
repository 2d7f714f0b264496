package release

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Labels the coordinator puts on every object of a native CCM release. Conflict
// detection uses them to tell our CCMs from foreign ones.
const (
	ManagedByLabel = "hybridccm.io/managed-by"
	ManagedByValue = "ccm-coordinator"
	NativeCCMLabel = "hybridccm.io/native-ccm"
	PlatformLabel  = "hybridccm.io/platform"

	// LifecycleController is the only controller a native CCM runs.
	LifecycleController = "cloud-node-lifecycle"

	controlPlaneLabel = "node-role.kubernetes.io/control-plane"

	// defaultSecurePort is what a CCM listens on without --secure-port.
	defaultSecurePort = 10258
)

// Lifecycle is the enforcement every native CCM release gets, whatever its chart
// renders: lifecycle-only controllers, its own ServiceAccount and identity, its
// own lease, a unique port, control-plane scheduling and least-privilege RBAC.
type Lifecycle struct {
	// Release is the release name; it names the ServiceAccount and RBAC objects.
	Release string `json:"release"`
	// Namespace of the release (ServiceAccount, lease).
	Namespace string `json:"namespace"`
	// Platform routed to this CCM.
	Platform string `json:"platform"`
	// DomainSelector narrows the platform's nodes to the CCM's domain
	// (ccm-gate --domain-selector); empty (omitted, so a release without a
	// domain keeps its fingerprint): every node of the platform.
	DomainSelector string `json:"domainSelector,omitempty"`
	// LeaseName is the unique --leader-elect-resource-name.
	LeaseName string `json:"leaseName"`
	// SecurePort is the unique --secure-port.
	SecurePort int32 `json:"securePort"`
	// Image, when set, replaces the CCM container's image.
	Image string `json:"image,omitempty"`
	// Args must be present on the CCM container (same flag name is replaced).
	Args []string `json:"args,omitempty"`
	// Env must be present on the CCM container (same name is replaced).
	Env []corev1.EnvVar `json:"env,omitempty"`
	// Workload selects the CCM Deployment/DaemonSet and container.
	Workload *profile.Workload `json:"workload,omitempty"`
	// Drop removes objects (e.g. a node-manager DaemonSet of an upstream chart).
	Drop []profile.ObjectMatch `json:"drop,omitempty"`
	// HostNetwork is what the profile declares (ccm.hostNetwork): the only
	// host access a native CCM pod may have (see checkPodSecurity).
	HostNetwork bool `json:"hostNetwork,omitempty"`
	// LoadBalancers, when set, also runs the CCM's service controller and
	// grants it LoadBalancerRules.
	LoadBalancers *LoadBalancerSettings `json:"loadBalancers,omitempty"`
	// TokenAudiences are the profile's ccm.tokenAudiences: the only
	// ServiceAccount token projections the gate mutator lets into the pod.
	TokenAudiences []string `json:"tokenAudiences,omitempty"`
	// ImagePullSecrets name Secrets in Namespace the pod pulls its images
	// with (every container's: the CCM's, and the gate's the gate mutator
	// adds); added to those the chart renders. Empty (omitted: the
	// fingerprint of a release without them stays what it was): none added.
	ImagePullSecrets []string `json:"imagePullSecrets,omitempty"`
}

// LoadBalancerSettings say which Services a native CCM serves.
type LoadBalancerSettings struct {
	// Controller is the service controller's name in --controllers.
	Controller string `json:"controller"`
	// Class of the Services it serves (spec.loadBalancerClass).
	Class string `json:"class"`
	// Default: it also serves Services without a class.
	Default bool `json:"default,omitempty"`
}

var _ Mutator = Lifecycle{}

// Name implements Mutator.
func (l Lifecycle) Name() string { return "lifecycle" }

// Fingerprint implements Mutator.
func (l Lifecycle) Fingerprint() string {
	// V versions what the enforcement renders beyond l itself; raising it
	// upgrades every release once (2: nodes update no longer granted; 3: the
	// delegated-authentication bindings, the CCM container's termination
	// message falls back to its log, flags compared as the CCM parses them;
	// 4: no lease create, the Lease is created ahead; 5: bound to the
	// static LifecycleClusterRole; 6: the leader-election timings; 7: the
	// pod hardened (hardenPod), Services dropped; 8: the enforced flags
	// first in the args).
	b, _ := json.Marshal(struct {
		V int
		L Lifecycle
	}{V: 8, L: l})
	return fmt.Sprintf("%x", sha256.Sum256(b))[:16]
}

// ServiceAccountName is the identity the CCM runs as (and the admission policy keys on).
func (l Lifecycle) ServiceAccountName() string { return l.Release }

// Username is the API server user name of that ServiceAccount.
func (l Lifecycle) Username() string {
	return "system:serviceaccount:" + l.Namespace + ":" + l.ServiceAccountName()
}

// The leader election of every native CCM. Upstream CCMs exit when they
// cannot renew their lease within the renew deadline, and the kubelet
// restarts them with a growing back-off (10 s, 20 s, 40 s, ...): with the
// Kubernetes defaults (15 s / 10 s / 2 s) an API server restart or upgrade
// costs each native CCM two or three restarts and about 40 s before it leads
// again (measured on the real cluster, test/oncluster). A renew deadline of
// 90 s rides out an API server outage of a minute and more without an exit;
// the leader renews within a retry period of its return. The price is a
// slower takeover by a standby when a leader dies without releasing its
// lease (at most the lease duration); node lifecycle is not in a hurry.
const (
	LeaseDuration = "100s"
	RenewDeadline = "90s"
	RetryPeriod   = "5s"
)

// EnforcedArgs are the flags every native CCM runs with; the post-renderer
// replaces any other spelling of them wherever they appear (args or command).
func (l Lifecycle) EnforcedArgs() []string {
	controllers := LifecycleController
	if l.LoadBalancers != nil {
		controllers += "," + l.LoadBalancers.Controller
	}
	return []string{
		"--controllers=" + controllers,
		"--use-service-account-credentials=false",
		"--leader-elect=true",
		"--leader-elect-resource-name=" + l.LeaseName,
		"--leader-elect-resource-namespace=" + l.Namespace,
		"--leader-elect-lease-duration=" + LeaseDuration,
		"--leader-elect-renew-deadline=" + RenewDeadline,
		"--leader-elect-retry-period=" + RetryPeriod,
		"--secure-port=" + strconv.Itoa(int(l.SecurePort)),
	}
}

// ErrEnforcedFlag marks args that would override a flag the coordinator
// enforces, or could swallow one (not one --name=value argument).
var ErrEnforcedFlag = errors.New("an arg overrides an enforced flag or is not one --name=value argument")

// boolFlags never take their value as a separate argument.
var boolFlags = map[string]bool{"--leader-elect": true, "--use-service-account-credentials": true}

// Mutate implements Mutator.
func (l Lifecycle) Mutate(m *Manifests) error {
	if l.Release == "" || l.Namespace == "" || l.LeaseName == "" || l.SecurePort == 0 {
		return fmt.Errorf("incomplete lifecycle settings %+v", l)
	}
	if lb := l.LoadBalancers; lb != nil && (lb.Controller == "" || lb.Class == "" || strings.ContainsAny(lb.Controller, ",= ")) {
		return fmt.Errorf("incomplete load balancer settings %+v", *lb)
	}
	if errs := ValidateImagePullSecrets(field.NewPath("imagePullSecrets"), l.ImagePullSecrets); len(errs) > 0 {
		return errs.ToAggregate()
	}
	// Profile and override args come after the enforced ones, and the last
	// occurrence of a flag wins: one that names an enforced flag in any
	// spelling would override it (FromProfile and profile validation refuse
	// them first, naming the field).
	if errs := profile.ValidateArgs(field.NewPath("args"), l.Args); len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrEnforcedFlag, errs.ToAggregate())
	}
	drops := make([]*regexp.Regexp, len(l.Drop))
	for i, d := range l.Drop {
		re, err := regexp.Compile("^(?:" + d.Name + ")$")
		if err != nil {
			return fmt.Errorf("drop[%d].name: %w", i, err)
		}
		drops[i] = re
	}
	m.Remove(func(o *unstructured.Unstructured) bool {
		switch o.GetKind() {
		// Identity and permissions come only from us.
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			return true
		// A lifecycle-only CCM serves nothing anyone reaches through a
		// Service (its metrics and health are on its secure port, read by
		// the kubelet), and the coordinator may write no Services: a chart's
		// Service could publish external IPs, a node port or a load balancer
		// (docs/security.md).
		case "Service":
			return true
		}
		for i, d := range l.Drop {
			if o.GetKind() == d.Kind && drops[i].MatchString(o.GetName()) {
				return true
			}
		}
		return false
	})

	workload, err := l.findWorkload(m)
	if err != nil {
		return err
	}
	if err := l.enforceWorkload(workload); err != nil {
		return fmt.Errorf("%s %s: %w", workload.GetKind(), workload.GetName(), err)
	}
	for _, o := range m.Objects {
		l.label(o)
	}
	objs, err := l.identity()
	if err != nil {
		return err
	}
	m.Add(objs...)
	return nil
}

func (l Lifecycle) label(o *unstructured.Unstructured) {
	labels := o.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[ManagedByLabel] = ManagedByValue
	labels[NativeCCMLabel] = l.Release
	labels[PlatformLabel] = l.Platform
	o.SetLabels(labels)
}

func (l Lifecycle) findWorkload(m *Manifests) (*unstructured.Unstructured, error) {
	var nameRE *regexp.Regexp
	if l.Workload != nil && l.Workload.Name != "" {
		re, err := regexp.Compile("^(?:" + l.Workload.Name + ")$")
		if err != nil {
			return nil, err
		}
		nameRE = re
	}
	var found []*unstructured.Unstructured
	for _, o := range m.Objects {
		if o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet" {
			continue
		}
		if l.Workload != nil && l.Workload.Kind != "" && o.GetKind() != l.Workload.Kind {
			continue
		}
		if nameRE != nil && !nameRE.MatchString(o.GetName()) {
			continue
		}
		found = append(found, o)
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return nil, fmt.Errorf("no CCM Deployment or DaemonSet in the rendered chart (set chart.workload in the profile)")
	default:
		names := make([]string, len(found))
		for i, o := range found {
			names[i] = o.GetKind() + "/" + o.GetName()
		}
		return nil, fmt.Errorf("several workloads could be the CCM (%s): set chart.workload in the profile", strings.Join(names, ", "))
	}
}

func (l Lifecycle) enforceWorkload(w *unstructured.Unstructured) error {
	raw, found, err := unstructured.NestedMap(w.Object, "spec", "template")
	if err != nil || !found {
		return fmt.Errorf("no spec.template: %v", err)
	}
	var tpl corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &tpl); err != nil {
		return fmt.Errorf("decode pod template: %w", err)
	}
	spec := &tpl.Spec
	if err := l.checkPodSecurity(spec); err != nil {
		return err
	}
	hardenPod(spec)

	if tpl.Labels == nil {
		tpl.Labels = map[string]string{}
	}
	tpl.Labels[ManagedByLabel] = ManagedByValue
	tpl.Labels[NativeCCMLabel] = l.Release
	tpl.Labels[PlatformLabel] = l.Platform

	spec.ServiceAccountName = l.ServiceAccountName()
	spec.DeprecatedServiceAccount = ""
	for _, name := range l.ImagePullSecrets {
		if !slices.ContainsFunc(spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == name }) {
			spec.ImagePullSecrets = append(spec.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
		}
	}
	// The gate mutator (coordinator/gate.Sidecar, run after this one) turns
	// automounting off again and projects the token into the gate alone.
	automount := true
	spec.AutomountServiceAccountToken = &automount

	if spec.NodeSelector == nil {
		spec.NodeSelector = map[string]string{}
	}
	spec.NodeSelector[controlPlaneLabel] = ""
	for _, t := range []corev1.Toleration{
		{Key: controlPlaneLabel, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: names.UninitializedTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	} {
		if !slices.ContainsFunc(spec.Tolerations, func(x corev1.Toleration) bool {
			return x.Key == t.Key && x.Effect == t.Effect && x.Operator == corev1.TolerationOpExists
		}) {
			spec.Tolerations = append(spec.Tolerations, t)
		}
	}

	idx := 0
	if l.Workload != nil && l.Workload.Container != "" {
		idx = slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == l.Workload.Container })
		if idx < 0 {
			return fmt.Errorf("no container %q", l.Workload.Container)
		}
	}
	if len(spec.Containers) == 0 {
		return fmt.Errorf("no containers")
	}
	c := &spec.Containers[idx]
	if l.Image != "" {
		c.Image = l.Image
	}

	oldPort := int32(defaultSecurePort)
	var p int32
	if len(c.Command) > 1 {
		c.Command, p = stripEnforced(c.Command[:1], c.Command[1:])
		if p != 0 {
			oldPort = p
		}
	}
	c.Args, p = stripEnforced(nil, c.Args)
	if p != 0 {
		oldPort = p
	}
	// The enforced flags come first, right after the command: a flag before
	// them that takes the next argument as its value ("--cluster-name"
	// without "=") would swallow the first of them. What follows cannot
	// change them: every other spelling of them is gone, and the CCM's
	// parser reads a flag after them as a flag.
	if err := CheckCommand(c.Command); err != nil {
		return fmt.Errorf("container %s: %w", c.Name, err)
	}
	c.Args = append(l.EnforcedArgs(), c.Args...)
	for _, a := range l.Args {
		c.Args = setFlag(c.Args, a)
	}
	for _, e := range l.Env {
		c.Env = setEnv(c.Env, e)
	}
	l.movePort(c, oldPort)
	// A CCM that exits at start says why on stderr, not in a termination-log
	// file: let the kubelet put the end of its log into
	// lastState.terminated.message, where the NativeCCM's Healthy condition
	// (and kubectl describe) quote it.
	c.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError

	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&tpl)
	if err != nil {
		return err
	}
	// The converter writes "creationTimestamp: null" for the empty template metadata.
	unstructured.RemoveNestedField(out, "metadata", "creationTimestamp")
	return unstructured.SetNestedMap(w.Object, out, "spec", "template")
}

// stripEnforced returns head + tail without enforced flags (in every form the
// CCM's flag parser accepts: "_" for "-", one or two dashes, "--flag=value"
// and "--flag value") and the --secure-port value it removed, if any.
func stripEnforced(head, tail []string) ([]string, int32) {
	out := append([]string{}, head...)
	var port int32
	for i := 0; i < len(tail); i++ {
		a := tail[i]
		name := profile.FlagName(a)
		if !slices.Contains(enforcedFlagNames, name) {
			out = append(out, a)
			continue
		}
		_, value, hasValue := strings.Cut(a, "=")
		if !hasValue && !boolFlags[name] && i+1 < len(tail) {
			value = tail[i+1]
			i++
		}
		if name == "--secure-port" {
			if n, err := strconv.Atoi(value); err == nil {
				port = int32(n)
			}
		}
	}
	return out, port
}

// ErrSwallowingCommand marks a CCM container whose command would take the
// first of the args (an enforced flag) as a value, or stop reading flags.
var ErrSwallowingCommand = errors.New("the CCM's command would swallow the enforced flags")

// CheckCommand refuses a container command (binary and flags) after which the
// CCM's flag parser would not read the first arg as a flag: the terminator
// "--" in it, or a last flag without "=" (a flag that is not a boolean takes
// the next argument as its value, and which flags are booleans only the CCM
// knows). The mutators put the flags they enforce first in the args, right
// after the command.
func CheckCommand(command []string) error {
	if len(command) < 2 {
		return nil
	}
	tail := command[1:]
	if i := slices.Index(tail, "--"); i >= 0 {
		return fmt.Errorf("%w: command[%d] is \"--\": the CCM would read no flag after it; remove it", ErrSwallowingCommand, i+1)
	}
	last := tail[len(tail)-1]
	if strings.HasPrefix(last, "-") && last != "-" && !strings.Contains(last, "=") {
		return fmt.Errorf("%w: command[%d] %q has no value in the same argument: the CCM may take the next argument, an enforced flag, as its value; render it as %s=value (a boolean as %s=true)",
			ErrSwallowingCommand, len(command)-1, last, last, last)
	}
	return nil
}

var enforcedFlagNames = []string{
	"--controllers", "--use-service-account-credentials", "--leader-elect",
	"--leader-elect-resource-name", "--leader-elect-resource-namespace",
	"--leader-elect-lease-duration", "--leader-elect-renew-deadline", "--leader-elect-retry-period", "--secure-port",
}

// setFlag replaces every occurrence of arg's flag in args (compared as the
// CCM's flag parser compares names; "--name value" takes its value along) by
// arg, at the place of the first, or appends it.
func setFlag(args []string, arg string) []string {
	name := profile.FlagName(arg)
	out := make([]string, 0, len(args)+1)
	placed := false
	for i := 0; i < len(args); i++ {
		if profile.FlagName(args[i]) != name {
			out = append(out, args[i])
			continue
		}
		if !strings.Contains(args[i], "=") && i+1 < len(args) && profile.FlagName(args[i+1]) == "" {
			i++ // its value; a CCM takes no positional arguments
		}
		if !placed {
			out = append(out, arg)
			placed = true
		}
	}
	if !placed {
		out = append(out, arg)
	}
	return out
}

func setEnv(env []corev1.EnvVar, e corev1.EnvVar) []corev1.EnvVar {
	for i := range env {
		if env[i].Name == e.Name {
			env[i] = e
			return env
		}
	}
	return append(env, e)
}

// movePort points container ports and probes that used the old secure port at
// the enforced one, so hostNetwork CCMs never clash and probes keep working.
func (l Lifecycle) movePort(c *corev1.Container, old int32) {
	for i := range c.Ports {
		if c.Ports[i].ContainerPort == old {
			c.Ports[i].ContainerPort = l.SecurePort
			if c.Ports[i].HostPort != 0 {
				c.Ports[i].HostPort = l.SecurePort
			}
		}
	}
	for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if pr == nil {
			continue
		}
		if g := pr.HTTPGet; g != nil && g.Port.IntValue() == int(old) {
			g.Port.IntVal = l.SecurePort
		}
		if t := pr.TCPSocket; t != nil && t.Port.IntValue() == int(old) {
			t.Port.IntVal = l.SecurePort
		}
	}
}

// The roles every cluster has for delegated authentication of a secure port,
// bound to each native CCM (see identity), and the suffixes of those bindings'
// names (release name + suffix).
const (
	AuthDelegatorClusterRole      = "system:auth-delegator"
	AuthDelegatorSuffix           = ":auth-delegator"
	AuthenticationReaderRole      = "extension-apiserver-authentication-reader"
	AuthenticationReaderNamespace = "kube-system"
	AuthenticationReaderSuffix    = ":extension-apiserver-authentication-reader"
)

// LoadBalancerClusterRole is the ClusterRole with LoadBalancerRules that the
// ccm-coordinator chart ships; native CCMs with spec.loadBalancers on are
// bound to it.
const LoadBalancerClusterRole = "hybrid-ccm:native-ccm-load-balancer"

// LoadBalancerSuffix ends the name of a release's binding to
// LoadBalancerClusterRole.
const LoadBalancerSuffix = ":load-balancer"

// LoadBalancerRules are what the service controller of k8s.io/cloud-provider
// needs besides LifecycleRules (it lists and watches nodes too): it lists and
// watches Services through an informer and changes them only with a
// strategic-merge PATCH of services/status (servicehelper.PatchService), which
// carries the status and the finalizer service.kubernetes.io/load-balancer-cleanup.
// The fence limits those patches to the CCM's own class.
func LoadBalancerRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"services/status"}, Verbs: []string{"patch", "update"}},
	}
}

// LifecycleClusterRole is the ClusterRole with LifecycleRules that the
// ccm-coordinator chart ships and every native CCM is bound to.
const LifecycleClusterRole = "hybrid-ccm:native-ccm-lifecycle"

// LifecycleRules are the least privilege cloud-node-lifecycle needs
// cluster-wide. The controller of k8s.io/cloud-provider (v0.37) lists and
// watches nodes through an informer, reads one with GET before changing its
// taints, changes the shutdown taint with a strategic-merge PATCH and DELETEs
// nodes whose instance is gone; it never sends an UPDATE (PUT) of a node or
// touches nodes/status, so neither is granted. test/chaos runs that controller
// with exactly these rules.
func LifecycleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch", "delete"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
	}
}

// Lease is the leader-election Lease of the release as the coordinator creates
// it before installing (no holder): the CCM may only get and update it.
func (l Lifecycle) Lease() *coordinationv1.Lease {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: l.LeaseName, Namespace: l.Namespace}}
	lease.Labels = map[string]string{ManagedByLabel: ManagedByValue, NativeCCMLabel: l.Release, PlatformLabel: l.Platform}
	return lease
}

// leaseRules are the rules of the release's Role: its own Lease, which the
// coordinator creates before the release (EnsureLease); no create, which RBAC
// cannot limit by name and would let it squat any lease of the namespace.
func (l Lifecycle) leaseRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{l.LeaseName}, Verbs: []string{"get", "update"}},
	}
}

// AuthenticationReaderRules are what the CCM uses of the Role
// AuthenticationReaderRole every cluster has: at start it reads (and then
// watches) the client CA in kube-system/extension-apiserver-authentication,
// and exits when it may not.
func AuthenticationReaderRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
		ResourceNames: []string{"extension-apiserver-authentication"}, Verbs: []string{"get", "list", "watch"}}}
}

// AuthDelegatorRules are what the CCM uses of the ClusterRole
// AuthDelegatorClusterRole every cluster has: it checks requests to its
// secure port with TokenReviews and SubjectAccessReviews.
func AuthDelegatorRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}
}

// StartupAccess is everything the release binds its ServiceAccount to, as
// SelfSubjectAccessReview attributes: the rules of LifecycleRules (and
// LoadBalancerRules) cluster-wide, its lease Role in its namespace and the
// two authentication roles. The gate answers its startup probe only once all
// are allowed, so the CCM container never starts before the release's
// bindings are in effect (an upstream CCM that may not read
// extension-apiserver-authentication exits, and each exit costs a growing
// crash-loop back-off).
func (l Lifecycle) StartupAccess() []authorizationv1.ResourceAttributes {
	var out []authorizationv1.ResourceAttributes
	add := func(namespace string, rules []rbacv1.PolicyRule) {
		for _, r := range rules {
			names := r.ResourceNames
			if len(names) == 0 {
				names = []string{""}
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					res, sub, _ := strings.Cut(res, "/")
					for _, v := range r.Verbs {
						for _, n := range names {
							out = append(out, authorizationv1.ResourceAttributes{Verb: v, Group: g, Resource: res, Subresource: sub, Namespace: namespace, Name: n})
						}
					}
				}
			}
		}
	}
	add("", LifecycleRules())
	if l.LoadBalancers != nil {
		add("", LoadBalancerRules())
	}
	add(l.Namespace, l.leaseRules())
	add(AuthenticationReaderNamespace, AuthenticationReaderRules())
	add("", AuthDelegatorRules())
	return out
}

// identity renders the ServiceAccount and RBAC of the release.
func (l Lifecycle) identity() ([]*unstructured.Unstructured, error) {
	sa := l.ServiceAccountName()
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: l.Namespace}}
	meta := func(name, ns string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns}
	}
	automount := true
	objs := []runtime.Object{
		&corev1.ServiceAccount{
			TypeMeta:                     metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
			ObjectMeta:                   meta(sa, l.Namespace),
			AutomountServiceAccountToken: &automount,
		},
		// The ClusterRole is the static one the ccm-coordinator chart ships
		// (LifecycleClusterRole): the coordinator may bind it, and need not
		// hold its node rights itself.
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: meta(l.Release, ""),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: LifecycleClusterRole},
			Subjects:   subject,
		},
		&rbacv1.Role{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
			ObjectMeta: meta(l.Release, l.Namespace),
			Rules:      l.leaseRules(),
		},
		&rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: meta(l.Release, l.Namespace),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: l.Release},
			Subjects:   subject,
		},
		// Every CCM built on k8s.io/cloud-provider/app serves --secure-port with
		// delegated authentication and authorization: at start it reads the
		// client CA from kube-system/extension-apiserver-authentication and
		// exits when it may not; requests are checked with TokenReviews and
		// SubjectAccessReviews. The two roles every cluster has for that.
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: meta(l.Release+AuthDelegatorSuffix, ""),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: AuthDelegatorClusterRole},
			Subjects:   subject,
		},
		&rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: meta(l.Release+AuthenticationReaderSuffix, AuthenticationReaderNamespace),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: AuthenticationReaderRole},
			Subjects:   subject,
		},
	}
	if l.LoadBalancers != nil {
		objs = append(objs, &rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: meta(l.Release+LoadBalancerSuffix, ""),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: LoadBalancerClusterRole},
			Subjects:   subject,
		})
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil, err
		}
		unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
		u := &unstructured.Unstructured{Object: m}
		l.label(u)
		out = append(out, u)
	}
	return out, nil
}
