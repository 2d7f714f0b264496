package helm

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
)

// hcloudRequest is the request of the built-in hcloud profile with values
// merged over what the profile renders (as spec.overrides.values does).
func hcloudRequest(t testing.TB, values map[string]any) release.Request {
	t.Helper()
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	req, err := release.FromProfile(p, release.Instance{ReleaseName: "native-ccm-hcloud", Namespace: "kube-system", Platform: "hcloud", Values: values})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestOverrideValuesCannotInjectYAML: the reported exploit, a
// priorityClassName with newlines that added hostPID, a privileged init
// container and a hostPath volume, is refused by name; values are data.
func TestOverrideValuesCannotInjectYAML(t *testing.T) {
	const inject = "system-cluster-critical\n      hostPID: true\n      initContainers:\n        - name: x\n          image: busybox\n          securityContext: {privileged: true}\n      volumes:\n        - name: root\n          hostPath: {path: /}"
	for _, tc := range []struct {
		name   string
		values map[string]any
		// want is a part of the error message naming the field.
		want string
	}{
		{"priorityClassName", map[string]any{"priorityClassName": inject}, "priorityClassName"},
		{"cloudConfig.path", map[string]any{"cloudConfig": map[string]any{"key": "cloud.conf", "path": "/etc/x\n      hostPID: true"}}, "cloudConfig"},
		{"cloudConfig.flag", map[string]any{"cloudConfig": map[string]any{"key": "cloud.conf", "path": "/etc/c/cloud.conf", "flag": "--cloud-config\n  hostIPC: true"}}, "cloudConfig"},
		{"credentials.env[].key", map[string]any{"credentials": map[string]any{"secretName": "hcloud", "env": []any{map[string]any{"name": "HCLOUD_TOKEN", "key": "token\n      hostPID: true"}}}}, "credentials"},
		{"image.tag", map[string]any{"image": map[string]any{"repository": "r", "tag": "v1\n      hostPID: true"}}, "image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewEngine(nil, Options{}).Render(context.Background(), hcloudRequest(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render with %s injected: err = %v, want an error naming %s", tc.name, err, tc.want)
			}
		})
	}
}

// TestUnsafePodIsRefused: whatever a chart renders, the post-renderer refuses
// a native CCM pod with host namespaces, privileged containers or host paths
// the profile does not declare, naming the field.
func TestUnsafePodIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		// values go to the built-in chart (spec.overrides.values); the chart
		// renders most of them; extraPod is added to the rendered pod spec.
		values   map[string]any
		extraPod map[string]any
		// hostNetwork is what the profile declares.
		hostNetwork bool
		// field is the refused field; empty: allowed.
		field string
	}{
		{name: "hostNetwork undeclared", values: map[string]any{"hostNetwork": true}, field: "spec.template.spec.hostNetwork"},
		{name: "hostNetwork declared", values: map[string]any{"hostNetwork": true}, hostNetwork: true},
		{name: "hostPID", extraPod: map[string]any{"hostPID": true}, field: "spec.template.spec.hostPID"},
		{name: "hostIPC", extraPod: map[string]any{"hostIPC": true}, field: "spec.template.spec.hostIPC"},
		{name: "hostPath", extraPod: map[string]any{"volumes": []any{map[string]any{"name": "root", "hostPath": map[string]any{"path": "/"}}}}, field: "spec.template.spec.volumes[0].hostPath"},
		{name: "privileged init container", extraPod: map[string]any{"initContainers": []any{map[string]any{"name": "x", "image": "i", "securityContext": map[string]any{"privileged": true}}}}, field: "spec.template.spec.initContainers[0].securityContext.privileged"},
		{name: "capabilities", extraPod: map[string]any{"initContainers": []any{map[string]any{"name": "x", "image": "i", "securityContext": map[string]any{"capabilities": map[string]any{"add": []any{"SYS_ADMIN"}}}}}}, field: "spec.template.spec.initContainers[0].securityContext.capabilities.add"},
		{name: "hostPort", extraPod: map[string]any{"initContainers": []any{map[string]any{"name": "x", "image": "i", "ports": []any{map[string]any{"containerPort": int64(80), "hostPort": int64(80)}}}}}, field: "spec.template.spec.initContainers[0].ports[0].hostPort"},
		{name: "root pod", extraPod: map[string]any{"securityContext": map[string]any{"runAsUser": int64(0)}}, field: "spec.template.spec.securityContext.runAsUser"},
		{name: "pod that may run as root", extraPod: map[string]any{"securityContext": map[string]any{"runAsNonRoot": false}}, field: "spec.template.spec.securityContext.runAsNonRoot"},
		{name: "root init container", extraPod: map[string]any{"initContainers": []any{map[string]any{"name": "x", "image": "i", "securityContext": map[string]any{"runAsUser": int64(0)}}}}, field: "spec.template.spec.initContainers[0].securityContext.runAsUser"},
		{name: "unconfined init container", extraPod: map[string]any{"initContainers": []any{map[string]any{"name": "x", "image": "i", "securityContext": map[string]any{"seccompProfile": map[string]any{"type": "Unconfined"}}}}}, field: "spec.template.spec.initContainers[0].securityContext.seccompProfile.type"},
		{name: "plain", extraPod: map[string]any{"volumes": []any{map[string]any{"name": "tmp", "emptyDir": map[string]any{}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := hcloudRequest(t, tc.values)
			req.Lifecycle.HostNetwork = tc.hostNetwork
			rendered, err := renderWith(req) // the chart and the whole post-renderer
			if tc.extraPod == nil {
				if tc.field == "" && err != nil {
					t.Fatalf("refused: %v", err)
				}
				if tc.field != "" {
					checkRefused(t, err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// What another chart could render: added to the pod, then the
			// post-renderer's lifecycle mutator again.
			m, err := release.ParseManifests([]byte(rendered))
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range m.Find("Deployment") {
				spec := d.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
				for k, v := range tc.extraPod {
					spec[k] = v
				}
			}
			err = req.Lifecycle.Mutate(m)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			checkRefused(t, err, tc.field)
		})
	}
}

// TestRenderedPodsAreHardened: what a chart leaves unset, the post-renderer
// sets: the pod of every built-in profile, and a chart's init container,
// has nothing the coordinator's admission policy refuses (a non-root user,
// no privilege escalation, no capabilities), and a user the chart names
// stays.
func TestRenderedPodsAreHardened(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range set.Names() {
		p, _ := set.Get(name)
		req, err := release.FromProfile(p, release.Instance{ReleaseName: "native-ccm-" + name, Namespace: "hybrid-ccm-system", Platform: p.Platforms[0]})
		if err != nil {
			t.Fatal(err)
		}
		out, err := renderWith(req)
		if err != nil {
			t.Fatalf("profile %s: %v", name, err)
		}
		d := releasetest.Decode(t, out)
		for _, dep := range d.Deployments {
			if problems := release.PodSecurityProblems(&dep.Spec.Template.Spec, p.CCM.HostNetwork); len(problems) > 0 {
				t.Errorf("profile %s: %v", name, problems)
			}
		}
	}
	// a chart's own init container, and its own user
	req := hcloudRequest(t, nil)
	rendered, err := renderWith(req)
	if err != nil {
		t.Fatal(err)
	}
	m, err := release.ParseManifests([]byte(rendered))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Find("Deployment") {
		spec := d.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		spec["initContainers"] = []any{map[string]any{"name": "x", "image": "i"}}
		spec["securityContext"] = map[string]any{"runAsUser": int64(1000)}
	}
	if err := req.Lifecycle.Mutate(m); err != nil {
		t.Fatal(err)
	}
	out, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	d := releasetest.Decode(t, string(out))
	spec := d.Deployments[0].Spec.Template.Spec
	if problems := release.PodSecurityProblems(&spec, false); len(problems) > 0 {
		t.Errorf("after the post-renderer: %v", problems)
	}
	if u := spec.SecurityContext.RunAsUser; u == nil || *u != 1000 {
		t.Errorf("the chart's user became %v", u)
	}
}

func renderWith(req release.Request) (string, error) {
	return NewEngine(nil, Options{}).Render(context.Background(), req)
}

func checkRefused(t *testing.T, err error, field string) {
	t.Helper()
	var refused *release.RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("err = %v, want a release.RefusedError for %s", err, field)
	}
	if refused.Field != field || !strings.Contains(err.Error(), field) {
		t.Errorf("refused field %q (%v), want %q", refused.Field, err, field)
	}
}

// awsMemberRequest is the request of a split aws NativeCCM's member for
// region (the builtin aws profile, its cloud-config file of its own).
func awsMemberRequest(t testing.TB, region string, values map[string]any) (release.Request, error) {
	t.Helper()
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("aws")
	return release.FromProfile(p, release.Instance{
		ReleaseName: "native-ccm-aws--" + region, Namespace: "kube-system", Platform: "aws", Values: values,
		CloudConfig: &release.CloudConfigFile{Base: "[Global]\nRegion = us-west-2\nVPC = vpc-1\n",
			Set: []release.CloudConfigSetting{release.SettingOf(p.Domain.CloudConfigRegion, region)}},
	})
}

// TestMemberCloudConfig: a split member's cloud-config file is a Secret of
// its release, the credentials' file followed by its region, mounted where
// the profile says instead of the credentials Secret; a setting that is no
// plain word (an attempt to add lines to the file or to the YAML) is refused
// by the chart's schema.
func TestMemberCloudConfig(t *testing.T) {
	req, err := awsMemberRequest(t, "eu-west-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	out, conf := renderMemberCloudConfig(t, req, "native-ccm-aws--eu-west-1-cloud-config")
	want := "[Global]\nRegion = us-west-2\nVPC = vpc-1\n\n\n[Global]\nRegion = \"eu-west-1\"\n"
	if conf != want {
		t.Fatalf("cloud.conf %q, want %q", conf, want)
	}
	if !strings.Contains(out, "secretName: native-ccm-aws--eu-west-1-cloud-config") || strings.Contains(out, "secretName: aws-ccm\n") {
		t.Errorf("the member does not mount its own cloud config:\n%s", out)
	}
	if !strings.Contains(out, "hybridccm.io/cloud-config-sha256:") {
		t.Errorf("no checksum of the cloud config on the pod (a changed file would not restart it)")
	}

	for _, bad := range []map[string]any{
		{"cloudConfig": map[string]any{"file": map[string]any{"set": []any{map[string]any{"section": "Global", "name": "Region", "value": "x\"\n[Global]\nRoleARN = \"arn"}}}}},
		{"cloudConfig": map[string]any{"file": map[string]any{"set": []any{map[string]any{"section": "Global]\n[x", "name": "Region", "value": "x"}}}}},
	} {
		req, err := awsMemberRequest(t, "eu-west-1", bad)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := NewEngine(nil, Options{}).Render(context.Background(), req); err == nil || !strings.Contains(err.Error(), "cloudConfig") {
			t.Errorf("values %v: err = %v, want the schema to refuse it naming cloudConfig", bad, err)
		}
	}
}

// renderMemberCloudConfig renders req and returns the manifests and the
// cloud.conf of the member's own cloud-config Secret.
func renderMemberCloudConfig(t *testing.T, req release.Request, secret string) (string, string) {
	t.Helper()
	out, err := NewEngine(nil, Options{}).Render(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	m, err := release.ParseManifests([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range m.Find("Secret") {
		if o.GetName() == secret {
			data, _, _ := unstructured.NestedString(o.Object, "data", "cloud.conf")
			b, err := base64.StdEncoding.DecodeString(data)
			if err != nil {
				t.Fatal(err)
			}
			return out, string(b)
		}
	}
	t.Fatalf("no Secret %s in the release", secret)
	return "", ""
}
