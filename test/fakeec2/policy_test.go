package fakeec2

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// The IAM policies docs/credentials.md gives the AWS CCM. The fake answers
// exactly the actions test/aws saw the upstream CCM call (test/aws fails on
// any call the fake does not answer, and on any call but DescribeInstances
// when only the lifecycle controller runs), so these tests tie the documents
// to what the binary does.
var (
	lifecyclePolicy     = filepath.Join("..", "..", "docs", "examples", "aws-iam-lifecycle.json")
	loadBalancersPolicy = filepath.Join("..", "..", "docs", "examples", "aws-iam-load-balancers.json")
)

// policy is an IAM policy document, with the fields these files may use.
type policy struct {
	Version   string
	Statement []struct {
		Sid       string
		Effect    string
		Action    []string
		Resource  string
		Condition map[string]map[string]string
	}
}

// iamAction is service:Action, as IAM spells the services the AWS CCM calls.
var iamAction = regexp.MustCompile(`^(ec2|elasticloadbalancing|iam):[A-Z][A-Za-z0-9]+$`)

// readPolicy decodes path strictly (no unknown field) and checks what every
// such document must hold: the current policy language, named Allow
// statements on every resource, well-formed actions, none twice.
func readPolicy(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p policy
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if p.Version != "2012-10-17" {
		t.Errorf("%s: Version %q, want 2012-10-17", path, p.Version)
	}
	if len(p.Statement) == 0 {
		t.Fatalf("%s: no statement", path)
	}
	var actions, sids []string
	for i, s := range p.Statement {
		if s.Sid == "" || slices.Contains(sids, s.Sid) {
			t.Errorf("%s: statement %d: Sid %q missing or not unique", path, i, s.Sid)
		}
		sids = append(sids, s.Sid)
		if s.Effect != "Allow" || s.Resource != "*" || len(s.Action) == 0 {
			t.Errorf("%s: statement %s: Effect %q, Resource %q, %d actions; want Allow on \"*\" with actions", path, s.Sid, s.Effect, s.Resource, len(s.Action))
		}
		for _, a := range s.Action {
			if !iamAction.MatchString(a) {
				t.Errorf("%s: statement %s: action %q is not service:Action", path, s.Sid, a)
			}
			if slices.Contains(actions, a) {
				t.Errorf("%s: action %q twice", path, a)
			}
			actions = append(actions, a)
		}
		// The one conditional grant: the ELB service-linked role, which only
		// ELB may be the service of.
		if slices.Contains(s.Action, "iam:CreateServiceLinkedRole") {
			if got := s.Condition["StringEquals"]["iam:AWSServiceName"]; got != "elasticloadbalancing.amazonaws.com" || len(s.Action) != 1 {
				t.Errorf("%s: statement %s: iam:CreateServiceLinkedRole must stand alone, limited to iam:AWSServiceName elasticloadbalancing.amazonaws.com (got %q)", path, s.Sid, got)
			}
		} else if s.Condition != nil {
			t.Errorf("%s: statement %s: unexpected Condition", path, s.Sid)
		}
	}
	return actions
}

// TestLifecyclePolicy: lifecycle-only, the CCM calls DescribeInstances and
// nothing else (test/aws TestAWSCCMGated), so that is all the policy grants.
func TestLifecyclePolicy(t *testing.T) {
	if got := readPolicy(t, lifecyclePolicy); !slices.Equal(got, []string{"ec2:DescribeInstances"}) {
		t.Errorf("%s grants %q, want only ec2:DescribeInstances", lifecyclePolicy, got)
	}
}

// TestLoadBalancersPolicy: the load-balancer policy, added to the lifecycle
// one, allows every action the CCM was seen calling for a Classic ELB (the
// actions the fake answers), and repeats none of the lifecycle policy.
func TestLoadBalancersPolicy(t *testing.T) {
	lifecycle := readPolicy(t, lifecyclePolicy)
	lb := readPolicy(t, loadBalancersPolicy)
	for _, a := range lb {
		if slices.Contains(lifecycle, a) {
			t.Errorf("%s repeats %s of %s: it is the extra for load balancers", loadBalancersPolicy, a, lifecyclePolicy)
		}
	}
	granted := append(slices.Clone(lifecycle), lb...)
	for service, answered := range actions {
		for name := range answered {
			if a := service + ":" + name; !slices.Contains(granted, a) {
				t.Errorf("the AWS CCM calls %s (the fake answers it for test/aws), which neither %s nor %s allows", a, lifecyclePolicy, loadBalancersPolicy)
			}
		}
	}
}
