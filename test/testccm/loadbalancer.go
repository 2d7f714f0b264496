package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	corev1 "k8s.io/api/core/v1"
	cloudprovider "k8s.io/cloud-provider"

	"github.com/hybrid-ccm/hybrid-ccm/test/fakelb"
)

// loadBalancers builds one load balancer per Service in the fake cloud's
// load-balancer API (test/fakelb), targeting the nodes the service controller
// hands it: the nodes the CCM sees.
type loadBalancers struct{ c *cloud }

var _ cloudprovider.LoadBalancer = loadBalancers{}

type lbState struct {
	IP    string   `json:"ip"`
	Nodes []string `json:"nodes"`
}

func (l loadBalancers) endpoint(svc *corev1.Service) string {
	return l.c.url + fakelb.Prefix + url.PathEscape(l.c.name) + "/" + url.PathEscape(svc.Namespace) + "/" + url.PathEscape(svc.Name)
}

func (l loadBalancers) do(ctx context.Context, method string, svc *corev1.Service, body any) (*lbState, error) {
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequestWithContext(ctx, method, l.endpoint(svc), rd)
	if err != nil {
		return nil, err
	}
	resp, err := l.c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, errNoLoadBalancer
	case resp.StatusCode == http.StatusNoContent:
		return nil, nil
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("fake cloud %s %s: %s", method, l.endpoint(svc), resp.Status)
	}
	var st lbState
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("fake cloud: %w", err)
	}
	return &st, nil
}

var errNoLoadBalancer = errors.New("no load balancer")

func status(st *lbState) *corev1.LoadBalancerStatus {
	return &corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: st.IP}}}
}

func (l loadBalancers) GetLoadBalancer(ctx context.Context, _ string, svc *corev1.Service) (*corev1.LoadBalancerStatus, bool, error) {
	st, err := l.do(ctx, http.MethodGet, svc, nil)
	switch {
	case errors.Is(err, errNoLoadBalancer):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return status(st), true, nil
}

func (l loadBalancers) GetLoadBalancerName(_ context.Context, _ string, svc *corev1.Service) string {
	return l.c.name + "-" + svc.Namespace + "-" + svc.Name
}

func (l loadBalancers) put(ctx context.Context, svc *corev1.Service, nodes []*corev1.Node) (*lbState, error) {
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	ports := make([]int32, 0, len(svc.Spec.Ports))
	for _, p := range svc.Spec.Ports {
		ports = append(ports, p.Port)
	}
	return l.do(ctx, http.MethodPut, svc, map[string]any{"nodes": names, "ports": ports})
}

func (l loadBalancers) EnsureLoadBalancer(ctx context.Context, _ string, svc *corev1.Service, nodes []*corev1.Node) (*corev1.LoadBalancerStatus, error) {
	st, err := l.put(ctx, svc, nodes)
	if err != nil {
		return nil, err
	}
	return status(st), nil
}

func (l loadBalancers) UpdateLoadBalancer(ctx context.Context, _ string, svc *corev1.Service, nodes []*corev1.Node) error {
	_, err := l.put(ctx, svc, nodes)
	return err
}

func (l loadBalancers) EnsureLoadBalancerDeleted(ctx context.Context, _ string, svc *corev1.Service) error {
	_, err := l.do(ctx, http.MethodDelete, svc, nil)
	if errors.Is(err, errNoLoadBalancer) {
		return nil
	}
	return err
}
