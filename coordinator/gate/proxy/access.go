package proxy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Access is one thing the CCM's identity must be allowed before it starts,
// as a SelfSubjectAccessReview asks it. Its flag form (ParseAccess, String)
// is a comma-separated list of key=value: verb and resource are required,
// group, subresource, namespace and name optional, e.g.
// "verb=get,resource=configmaps,namespace=kube-system,name=extension-apiserver-authentication".
type Access struct {
	Verb, Group, Resource, Subresource, Namespace, Name string
}

// accessKeys are the keys of the flag form, in the order String writes them.
var accessKeys = []string{"verb", "group", "resource", "subresource", "namespace", "name"}

// ParseAccess reads the flag form of an Access.
func ParseAccess(s string) (Access, error) {
	var a Access
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || !slices.Contains(accessKeys, k) || seen[k] || strings.ContainsAny(v, " \t\r\n") {
			return Access{}, fmt.Errorf("access %q: %q is not one of %s=value (each once, no whitespace)", s, part, strings.Join(accessKeys, "|"))
		}
		seen[k] = true
		switch k {
		case "verb":
			a.Verb = v
		case "group":
			a.Group = v
		case "resource":
			a.Resource = v
		case "subresource":
			a.Subresource = v
		case "namespace":
			a.Namespace = v
		case "name":
			a.Name = v
		}
	}
	if a.Verb == "" || a.Resource == "" {
		return Access{}, fmt.Errorf("access %q: verb and resource are required", s)
	}
	return a, nil
}

// String is the flag form.
func (a Access) String() string {
	parts := []string{"verb=" + a.Verb}
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("group", a.Group)
	parts = append(parts, "resource="+a.Resource)
	add("subresource", a.Subresource)
	add("namespace", a.Namespace)
	add("name", a.Name)
	return strings.Join(parts, ",")
}

// describe is how logs name it: "get configmaps kube-system/extension-apiserver-authentication".
func (a Access) describe() string {
	r := a.Resource
	if a.Group != "" {
		r += "." + a.Group
	}
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	obj := a.Name
	if a.Namespace != "" {
		obj = a.Namespace + "/" + a.Name
	}
	return strings.TrimSpace(a.Verb + " " + r + " " + obj)
}

// accessGate is the startup gate: ready once every Access has been allowed
// for the gate's own identity, which is the CCM's (OwnCredentials); it never
// checks again. A CCM started before the RBAC of its release is in effect
// exits (e.g. "configmaps extension-apiserver-authentication is forbidden")
// and the kubelet restarts it with a growing back-off; the gate's startup
// probe holds the CCM container back until then.
type accessGate struct {
	want  []Access
	cs    kubernetes.Interface
	ready atomic.Bool
}

func newAccessGate(upstream *rest.Config, want []Access) (*accessGate, error) {
	g := &accessGate{want: slices.Clone(want)}
	if len(want) == 0 {
		g.ready.Store(true)
		return g, nil
	}
	cs, err := kubernetes.NewForConfig(upstream)
	if err != nil {
		return nil, err
	}
	g.cs = cs
	return g, nil
}

// accessInterval is how often the gate asks again while something is denied.
const accessInterval = time.Second

// run asks until everything is allowed or ctx ends.
func (g *accessGate) run(ctx context.Context, p *Proxy) {
	if g.ready.Load() {
		return
	}
	last := ""
	_ = wait.PollUntilContextCancel(ctx, accessInterval, true, func(ctx context.Context) (bool, error) {
		denied, err := g.denied(ctx)
		msg := strings.Join(denied, "; ")
		if err != nil {
			msg = err.Error()
		}
		if msg != "" {
			if msg != last {
				p.log.Info("waiting for the CCM's permissions before it starts", "missing", msg)
				last = msg
			}
			return false, nil
		}
		g.ready.Store(true)
		p.log.Info("the CCM's identity may do what it needs at start", "checked", len(g.want))
		return true, nil
	})
}

// denied asks a SelfSubjectAccessReview for each Access and returns those not allowed.
func (g *accessGate) denied(ctx context.Context) ([]string, error) {
	var denied []string
	for _, a := range g.want {
		r, err := g.cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource, Namespace: a.Namespace, Name: a.Name,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("SelfSubjectAccessReview of %s: %w", a.describe(), err)
		}
		if !r.Status.Allowed {
			denied = append(denied, a.describe())
		}
	}
	return denied, nil
}
