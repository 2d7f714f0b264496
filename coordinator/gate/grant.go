package gate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// What the fence confines each native CCM to comes from RBAC: a grant.
//
// The fence has no parameters. A ValidatingAdmissionPolicy with a paramKind
// refuses every request its rules match, of every identity (kubelets, talos-ccm,
// admins), while the API server cannot resolve or has not synced the param
// kind: about 30 s after each API server start, about 28 s after the CRD is
// created, and for as long as it is missing. That is decided before
// matchConditions, so no condition on the user helps. Instead the fence asks
// the API server's own authorizer (CEL's authorizer library), which is always
// there, whether the requester holds a grant; an authorizer that cannot answer
// (RBAC not yet synced, no rule) answers no, which refuses the confined
// identity alone.
//
// A grant is a ClusterRole and a ClusterRoleBinding, both named
// hybrid-ccm:fence:<NativeCCM>, with rules of the API group fence.hybridccm.io
// (which no API server serves, so the rules allow no request), bound to the
// NativeCCM's ServiceAccount, verb "fence":
//
//	nativeccms/<name>             the ServiceAccount is NativeCCM <name>'s
//	platforms/<platform>          nodes labelled with that platform
//	loadbalancers                 it serves load balancers
//	loadbalancerclasses/<class>   Services of type LoadBalancer of that class
//	defaultloadbalancers          and those without a class
//
// Whoever creates a NativeCCM creates its grant: the hybrid-ccm chart renders
// both from the same clouds values (kubectl users apply both). The coordinator
// cannot: it may bind only the native CCMs' lifecycle roles (RBAC bind by
// name, and its admission policy), it holds none of these rights (RBAC refuses
// to let it hand them out), and it may not write ClusterRoles at all.
const (
	// GrantGroup is the API group of the grants' rules.
	GrantGroup = "fence.hybridccm.io"
	// GrantVerb is the verb of the grants' rules.
	GrantVerb = "fence"
	// GrantPrefix starts the name of a grant's ClusterRole and binding.
	GrantPrefix = "hybrid-ccm:fence:"
	// GrantLabel marks a grant's ClusterRole and binding with the NativeCCM's
	// name (hybridctl doctor finds grants whose NativeCCM is gone by it).
	GrantLabel = "hybridccm.io/fence-grant"
)

// Resources of GrantGroup.
const (
	grantNativeCCMs    = "nativeccms"
	grantPlatforms     = "platforms"
	grantLoadBalancers = "loadbalancers"
	grantClasses       = "loadbalancerclasses"
	grantDefault       = "defaultloadbalancers"
	// wildcardProbe is a name no grant lists (it is neither a platform nor a
	// load balancer class). A requester the authorizer lets "fence" it holds a
	// rule without resourceNames or with wildcards (cluster-admin, for
	// example), which would grant every platform and class: the fence then
	// refuses it everything.
	wildcardProbe = "(any)"
)

// ErrFenceNotGranted means the native CCM's ServiceAccount does not hold the
// grant its NativeCCM needs (or holds a wildcard): the fence would refuse its
// writes. Whoever creates the NativeCCM creates the grant; nothing is
// installed until it is there.
var ErrFenceNotGranted = errors.New("fence grant missing")

// GrantError is what CheckGrant found missing; it wraps ErrFenceNotGranted.
type GrantError struct {
	// Grant is the grant checked.
	Grant Grant
	// Missing names what the ServiceAccount is not granted ("platform aws").
	Missing []string
	// Wildcard names the resource RBAC grants it for any name, if any.
	Wildcard string
}

// Problem says what is wrong, without what to do.
func (e *GrantError) Problem() string {
	sa := e.Grant.Namespace + "/" + e.Grant.ServiceAccount()
	if e.Wildcard != "" {
		return fmt.Sprintf("ServiceAccount %s holds %s %s for any name (an RBAC rule without resourceNames, or a wildcard such as cluster-admin's), so the fence refuses all its writes",
			sa, GrantGroup, e.Wildcard)
	}
	return fmt.Sprintf("ServiceAccount %s is not granted %s (%s/%s), so the fence refuses its writes", sa, strings.Join(e.Missing, ", "), GrantGroup, GrantVerb)
}

// Fix says what to do.
func (e *GrantError) Fix() string {
	if e.Wildcard != "" {
		return fmt.Sprintf("bind it only to its grant %s and the roles the coordinator binds", GrantName(e.Grant.NativeCCM))
	}
	return fmt.Sprintf("create ClusterRole and ClusterRoleBinding %s with the NativeCCM (the hybrid-ccm chart does for its clouds; docs/gate.md, \"Grants\")", GrantName(e.Grant.NativeCCM))
}

func (e *GrantError) Error() string {
	return fmt.Sprintf("%s: %s: %s", ErrFenceNotGranted, e.Problem(), e.Fix())
}

func (e *GrantError) Unwrap() error { return ErrFenceNotGranted }

// Grant is what the fence lets the ServiceAccount of one NativeCCM change.
type Grant struct {
	// NativeCCM is the NativeCCM's name; its ServiceAccount is
	// native-ccm-<name> in Namespace.
	NativeCCM string
	// Namespace is the coordinator's namespace.
	Namespace string
	// Platform whose nodes it may change (with the platform's providerID
	// prefixes, which the fence itself knows).
	Platform string
	// LoadBalancers: the Services it may change; nil: none.
	LoadBalancers *v1.GateLoadBalancers
	// Domain narrows the platform's nodes it may change; zero: all of them.
	Domain DomainGrant
}

// ruleT is one rule of a grant's ClusterRole.
type ruleT = rbacv1.PolicyRule

// want is one thing CheckGrant asks the authorizer for.
type want struct {
	resource, name, what string
}

// GrantFor is the grant a NativeCCM needs in the coordinator's namespace:
// its platform and domain (spec.domain.selector), and with
// spec.loadBalancers on its class (and the Services without a class when it
// is the default). A split NativeCCM's grant also names the split label
// (spec.domain.splitBy: Grant.Domain.SplitBy), which admits each member's
// ServiceAccount for the nodes of its own value.
func GrantFor(obj *v1.NativeCCM, namespace string) Grant {
	g := Grant{NativeCCM: obj.Name, Namespace: namespace, Platform: obj.Spec.Platform}
	if obj.Spec.Domain != nil {
		// an invalid selector stalls the NativeCCM; its grant is the platform's
		if d, err := domain.FromSelector(obj.Spec.Platform, names.PlatformLabel, obj.Spec.Domain.Selector); err == nil && !d.Whole() {
			g.Domain.Require = d.Require
		}
		g.Domain.SplitBy = obj.Spec.Domain.SplitBy
	}
	if obj.LoadBalancersEnabled() {
		g.LoadBalancers = &v1.GateLoadBalancers{Class: obj.LoadBalancerClass(), Default: obj.Spec.LoadBalancers.Default}
	}
	return g
}

// GrantName is the name of the ClusterRole and ClusterRoleBinding of the
// grant of NativeCCM nativeCCM.
func GrantName(nativeCCM string) string { return GrantPrefix + nativeCCM }

// ServiceAccount is the name of the ServiceAccount the grant is bound to.
func (g Grant) ServiceAccount() string { return v1.ReleasePrefix + g.NativeCCM }

// Validate reports fields that make no grant.
func (g Grant) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(g.NativeCCM); len(msgs) > 0 || len(g.ServiceAccount()) > 253 {
		errs = append(errs, fmt.Errorf("NativeCCM name %q: %s", g.NativeCCM, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Label(g.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("namespace %q: %s", g.Namespace, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Label(g.Platform); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("platform %q: %s", g.Platform, strings.Join(msgs, "; ")))
	}
	if lb := g.LoadBalancers; lb != nil {
		if msgs := validation.IsQualifiedName(lb.Class); len(msgs) > 0 || !strings.Contains(lb.Class, "/") {
			errs = append(errs, fmt.Errorf("load balancer class %q: must be a prefixed name such as hybridccm.io/aws", lb.Class))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: fence grant: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

// Objects renders the grant's ClusterRole and ClusterRoleBinding (the
// hybrid-ccm chart renders the same for every cloud it enables).
func (g Grant) Objects() (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, error) {
	if err := g.Validate(); err != nil {
		return nil, nil, err
	}
	rule := func(resource string, names ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{GrantGroup}, Resources: []string{resource}, ResourceNames: names, Verbs: []string{GrantVerb}}
	}
	rules := []rbacv1.PolicyRule{rule(grantNativeCCMs, g.NativeCCM), rule(grantPlatforms, g.Platform)}
	rules = append(rules, g.Domain.rules(rule)...)
	if lb := g.LoadBalancers; lb != nil {
		rules = append(rules, rule(grantLoadBalancers), rule(grantClasses, lb.Class))
		if lb.Default {
			rules = append(rules, rule(grantDefault))
		}
	}
	name := GrantName(g.NativeCCM)
	labels := map[string]string{GrantLabel: g.NativeCCM}
	role := &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Rules:      rules,
	}
	binding := &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: g.ServiceAccount(), Namespace: g.Namespace}},
	}
	return role, binding, nil
}

// EnsureGrant creates or updates the grant (the ClusterRole first). In a
// cluster whoever creates the NativeCCM does (the hybrid-ccm chart); tests
// and the demo use this.
func EnsureGrant(ctx context.Context, c client.Client, g Grant) error {
	role, binding, err := g.Objects()
	if err != nil {
		return fmt.Errorf("gate.EnsureGrant: %w", err)
	}
	for _, o := range []client.Object{role, binding} {
		current := o.DeepCopyObject().(client.Object)
		err := c.Get(ctx, client.ObjectKeyFromObject(o), current)
		switch {
		case client.IgnoreNotFound(err) != nil:
			return fmt.Errorf("gate.EnsureGrant: %s: %w", o.GetName(), err)
		case err != nil:
			err = c.Create(ctx, o, client.FieldOwner(FieldOwner))
		default:
			o.SetResourceVersion(current.GetResourceVersion())
			if b, ok := o.(*rbacv1.ClusterRoleBinding); ok && current.(*rbacv1.ClusterRoleBinding).RoleRef != b.RoleRef {
				// roleRef is immutable
				if err = c.Delete(ctx, current); err == nil {
					o.SetResourceVersion("")
					err = c.Create(ctx, o, client.FieldOwner(FieldOwner))
				}
				break
			}
			err = c.Update(ctx, o, client.FieldOwner(FieldOwner))
		}
		if err != nil {
			return fmt.Errorf("gate.EnsureGrant: %s: %w", o.GetName(), err)
		}
	}
	return nil
}

// DeleteGrant removes the grant of NativeCCM nativeCCM (the binding first).
// Absent objects are not an error.
func DeleteGrant(ctx context.Context, c client.Client, nativeCCM string) error {
	name := GrantName(nativeCCM)
	for _, o := range []client.Object{
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}},
	} {
		if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("gate.DeleteGrant: %s: %w", name, err)
		}
	}
	return nil
}

// CheckGrant asks the API server's authorizer (SubjectAccessReviews, the same
// answers the fence gets) whether the grant's ServiceAccount holds it: its
// NativeCCM, its platform, and its load balancers; and that it holds no
// wildcard. It reports ErrFenceNotGranted naming what is missing, or an API
// error.
func CheckGrant(ctx context.Context, c client.Client, g Grant) error {
	const op = "gate.CheckGrant"
	if err := g.Validate(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	user := Fence{Namespace: g.Namespace}.Username(g.NativeCCM)
	allowed := func(resource, name string) (bool, error) {
		// The groups the fence's authorizer.serviceAccount asks with.
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + g.Namespace},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group: GrantGroup, Resource: resource, Name: name, Verb: GrantVerb,
			},
		}}
		if err := c.Create(ctx, sar); err != nil {
			return false, fmt.Errorf("%s: SubjectAccessReview for %s: %w", op, user, err)
		}
		return sar.Status.Allowed, nil
	}
	wants := []want{
		{grantNativeCCMs, g.NativeCCM, "NativeCCM " + g.NativeCCM},
		{grantPlatforms, g.Platform, "platform " + g.Platform},
	}
	wants = append(wants, g.Domain.wants()...)
	if lb := g.LoadBalancers; lb != nil {
		wants = append(wants, want{grantLoadBalancers, "", "load balancers"}, want{grantClasses, lb.Class, "load balancer class " + lb.Class})
		if lb.Default {
			wants = append(wants, want{grantDefault, "", "Services without a load balancer class"})
		}
	}
	var missing []string
	for _, w := range wants {
		ok, err := allowed(w.resource, w.name)
		if err != nil {
			return err
		}
		if !ok {
			missing = append(missing, w.what)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s: %w", op, &GrantError{Grant: g, Missing: missing})
	}
	for _, r := range []string{grantPlatforms, grantClasses, grantDomains, grantSplits} {
		ok, err := allowed(r, wildcardProbe)
		if err != nil {
			return err
		}
		if ok {
			return fmt.Errorf("%s: %w", op, &GrantError{Grant: g, Wildcard: r})
		}
	}
	return nil
}
