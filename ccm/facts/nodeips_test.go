package facts_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
)

func TestNodeIPs(t *testing.T) {
	many := make([]string, 50)
	for i := range many {
		many[i] = fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
	}
	tests := []struct {
		name string
		// annotation is provided-node-ip; nil means none
		annotation *string
		// internal are status InternalIPs
		internal   []string
		preferIPv6 bool
		// want is the dial order; wantErr the sentinel when refused
		want    []string
		wantErr error
	}{
		{name: "no address", wantErr: facts.ErrNoNodeIP},
		{name: "garbage annotation", annotation: ptr.To("not-an-ip"), wantErr: facts.ErrProvidedNodeIP},
		{name: "dual-stack preferIPv6", annotation: ptr.To("10.0.0.1,fd00::1"), preferIPv6: true, want: []string{"fd00::1", "10.0.0.1"}},
		{name: "dual-stack", annotation: ptr.To("fd00::1, 10.0.0.1"), want: []string{"10.0.0.1", "fd00::1"}},
		{name: "two IPv4", annotation: ptr.To("10.0.0.1,10.0.0.2"), wantErr: facts.ErrProvidedNodeIP},
		{name: "two IPv6", annotation: ptr.To("fd00::1,fd00::2,10.0.0.1"), wantErr: facts.ErrProvidedNodeIP},
		{name: "many", annotation: ptr.To(strings.Join(many, ",")), wantErr: facts.ErrProvidedNodeIP},
		{name: "empty annotation, InternalIP", annotation: ptr.To(""), internal: []string{"10.0.0.1"}, want: []string{"10.0.0.1"}},
		{name: "InternalIPs dual-stack", internal: []string{"fd00::1", "10.0.0.1"}, want: []string{"10.0.0.1", "fd00::1"}},
		{name: "many InternalIPs", internal: many, wantErr: facts.ErrProvidedNodeIP},
		{name: "garbage InternalIP", internal: []string{"10.0.0.1", "nope"}, wantErr: facts.ErrProvidedNodeIP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &corev1.Node{}
			if tt.annotation != nil {
				n.Annotations = map[string]string{"alpha.kubernetes.io/provided-node-ip": *tt.annotation}
			}
			for _, ip := range tt.internal {
				n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
			}
			got, err := facts.NodeIPs(n, tt.preferIPv6)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("want %v, got %v %v", tt.wantErr, got, err)
				}
				if len(err.Error()) > 400 {
					t.Fatalf("error (it goes into events) is %d bytes long", len(err.Error()))
				}
				return
			}
			var gotS []string
			for _, ip := range got {
				gotS = append(gotS, ip.String())
			}
			if err != nil || !slices.Equal(gotS, tt.want) {
				t.Fatalf("got %v %v, want %v", gotS, err, tt.want)
			}
		})
	}
}
