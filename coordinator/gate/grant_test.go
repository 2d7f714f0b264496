package gate_test

import (
	"errors"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

func TestGrantObjects(t *testing.T) {
	lb := &v1.NativeCCM{Spec: v1.NativeCCMSpec{Platform: "aws", LoadBalancers: &v1.LoadBalancers{Enabled: true, Default: true}}}
	lb.Name = "aws"
	role, binding, err := gate.GrantFor(lb, "hybrid-ccm-system").Objects()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range role.Rules {
		if len(r.APIGroups) != 1 || r.APIGroups[0] != gate.GrantGroup || len(r.Verbs) != 1 || r.Verbs[0] != gate.GrantVerb {
			t.Errorf("rule %+v is not a grant rule", r)
		}
		got = append(got, r.Resources[0]+"/"+strings.Join(r.ResourceNames, ","))
	}
	if want := "nativeccms/aws platforms/aws loadbalancers/ loadbalancerclasses/hybridccm.io/aws defaultloadbalancers/"; strings.Join(got, " ") != want {
		t.Errorf("rules %s, want %s", got, want)
	}
	if role.Name != "hybrid-ccm:fence:aws" || binding.Name != role.Name || binding.RoleRef.Name != role.Name ||
		len(binding.Subjects) != 1 || binding.Subjects[0] != (rbacv1.Subject{Kind: "ServiceAccount", Name: "native-ccm-aws", Namespace: "hybrid-ccm-system"}) {
		t.Errorf("binding %+v of role %s", binding, role.Name)
	}
	// Nothing the coordinator may change: it changes only what it labelled.
	for _, l := range []map[string]string{role.Labels, binding.Labels} {
		if _, ok := l[release.ManagedByLabel]; ok || l[gate.GrantLabel] != "aws" {
			t.Errorf("labels %v", l)
		}
	}
	// Load balancers off: nodes only.
	lb.Spec.LoadBalancers.Enabled = false
	role, _, err = gate.GrantFor(lb, "hybrid-ccm-system").Objects()
	if err != nil || len(role.Rules) != 2 {
		t.Errorf("without load balancers: %+v %v", role, err)
	}
	for _, bad := range []gate.Grant{
		{NativeCCM: "", Namespace: "n", Platform: "p"},
		{NativeCCM: "a", Namespace: "N S", Platform: "p"},
		{NativeCCM: "a", Namespace: "n", Platform: "(any)"},
		{NativeCCM: "a", Namespace: "n", Platform: "p", LoadBalancers: &v1.GateLoadBalancers{Class: "no-prefix"}},
	} {
		if _, _, err := bad.Objects(); !errors.Is(err, gate.ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", bad, err)
		}
	}
}

// TestGrantExampleInDocs: the grant docs/gate.md shows for kubectl users is
// the one the coordinator checks for.
func TestGrantExampleInDocs(t *testing.T) {
	doc, err := testenv.DocsYAML("gate.md", "<!-- grant-example")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := chartstest.Parse(doc)
	if err != nil || len(objs) != 2 {
		t.Fatalf("%d objects, %v", len(objs), err)
	}
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	for i, into := range []any{&role, &binding} {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(objs[i].Object, into, true); err != nil {
			t.Fatal(err)
		}
	}
	wantRole, wantBinding, err := gate.Grant{NativeCCM: "hcloud", Namespace: "hybrid-ccm-system", Platform: "hcloud"}.Objects()
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(role.Rules, wantRole.Rules) || role.Name != wantRole.Name || !equality.Semantic.DeepEqual(role.Labels, wantRole.Labels) {
		t.Errorf("ClusterRole in the docs %+v, want %+v", role, wantRole)
	}
	if !equality.Semantic.DeepEqual(binding.Subjects, wantBinding.Subjects) || binding.RoleRef != wantBinding.RoleRef || binding.Name != wantBinding.Name {
		t.Errorf("ClusterRoleBinding in the docs %+v, want %+v", binding, wantBinding)
	}
}
