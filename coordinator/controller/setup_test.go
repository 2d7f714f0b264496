package controller

import (
	"context"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// TestPagedNodes: the node store lists Nodes as a consistent read in pages
// of nodePageSize and keeps of each page only the facts of the Nodes with a
// platform label, whatever the reflector asks for.
func TestPagedNodes(t *testing.T) {
	whole := corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: "n1", UID: "u1", ResourceVersion: "7",
			Labels:        map[string]string{names.PlatformLabel: "hcloud", "kubernetes.io/hostname": "n1"},
			Annotations:   map[string]string{"talos.dev/owned-labels": "[]"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		},
		Spec:   corev1.NodeSpec{ProviderID: "hcloud://1", PodCIDR: "10.0.0.0/24"},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"x"}, SizeBytes: 1}}},
	}
	unlabelled := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2", Labels: map[string]string{"kubernetes.io/hostname": "n2"}}}
	noID := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3", Labels: map[string]string{names.PlatformLabel: "aws"}}}
	want := []nodeFacts{{Name: "n1", Platform: "hcloud", HasProviderID: true}, {Name: "n3", Platform: "aws"}}
	for _, tc := range []struct {
		// asked is what the informer's reflector asks for.
		asked metav1.ListOptions
		// sent is what must reach the API server.
		sent metav1.ListOptions
	}{
		{asked: metav1.ListOptions{ResourceVersion: "0", Limit: 500}, sent: metav1.ListOptions{Limit: nodePageSize}},
		{asked: metav1.ListOptions{ResourceVersion: "0"}, sent: metav1.ListOptions{Limit: nodePageSize}},
		{asked: metav1.ListOptions{ResourceVersion: "12", ResourceVersionMatch: metav1.ResourceVersionMatchExact}, sent: metav1.ListOptions{Limit: nodePageSize}},
		{asked: metav1.ListOptions{Limit: 100, Continue: "c"}, sent: metav1.ListOptions{Limit: 100, Continue: "c"}},
	} {
		var got metav1.ListOptions
		lw := &toolscache.ListWatch{ListWithContextFunc: func(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
			got = o
			return &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: "9", Continue: "next"}, Items: []corev1.Node{*whole.DeepCopy(), unlabelled, noID}}, nil
		}}
		out, err := pagedNodes{lw: lw}.ListWithContext(context.Background(), tc.asked)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.sent) {
			t.Errorf("asked %+v: sent %+v, want %+v", tc.asked, got, tc.sent)
		}
		l, ok := out.(*nodeFactsList)
		if !ok {
			t.Fatalf("asked %+v: got a %T, want a *nodeFactsList", tc.asked, out)
		}
		if !reflect.DeepEqual(l.Items, want) {
			t.Errorf("asked %+v: kept %+v, want %+v", tc.asked, l.Items, want)
		}
		if l.ResourceVersion != "9" || l.Continue != "next" {
			t.Errorf("asked %+v: list meta %+v, want resourceVersion 9 and the continue token", tc.asked, l.ListMeta)
		}
	}
}
