package podrunner

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// checkProbes refuses probes the runner cannot run, before the container is
// created.
func (c *container) checkProbes() error {
	for _, pr := range []*corev1.Probe{c.spec.StartupProbe, c.spec.ReadinessProbe, c.spec.LivenessProbe} {
		if pr != nil && pr.Exec != nil {
			return configError{fmt.Errorf("exec probes are not supported by the pod runner")}
		}
	}
	return nil
}

// probe runs the startup probe until it succeeds (restarting the container
// when it fails), then the readiness and liveness probes until ctx ends.
func (c *container) probe(ctx context.Context, kill chan<- string) {
	if pr := c.spec.StartupProbe; pr != nil {
		startedOK := false
		if !c.probeLoop(ctx, pr, func(ok bool, _ string, failures int) bool {
			if ok {
				startedOK = true
				return false
			}
			if failures >= threshold(pr.FailureThreshold, 3) {
				kill <- "Container " + c.spec.Name + " failed startup probe"
				return false
			}
			return true
		}) {
			return
		}
		if !startedOK {
			return
		}
	}
	c.set(func() { c.started = true })
	done := make(chan struct{})
	go func() {
		defer close(done)
		pr := c.spec.ReadinessProbe
		if pr == nil {
			c.set(func() { c.ready = true })
			return
		}
		c.probeLoop(ctx, pr, func(ok bool, _ string, failures int) bool {
			if ok {
				c.setReady(true)
			} else if failures >= threshold(pr.FailureThreshold, 3) {
				c.setReady(false)
			}
			return true
		})
	}()
	if pr := c.spec.LivenessProbe; pr != nil {
		c.probeLoop(ctx, pr, func(ok bool, msg string, failures int) bool {
			if !ok && failures >= threshold(pr.FailureThreshold, 3) {
				kill <- fmt.Sprintf("Container %s failed liveness probe (%s)", c.spec.Name, msg)
				return false
			}
			return true
		})
	}
	<-done
}

func (c *container) setReady(ready bool) {
	c.mu.Lock()
	changed := c.ready != ready
	c.ready = ready
	c.mu.Unlock()
	if changed {
		c.pod.notify()
	}
}

func threshold(v, def int32) int {
	if v <= 0 {
		return int(def)
	}
	return int(v)
}

// probeLoop probes every period after the initial delay and calls next with
// each result and the count of consecutive failures (successes needed by
// successThreshold count as one success); it stops when next returns false
// (reported as true) or ctx ends (false).
func (c *container) probeLoop(ctx context.Context, pr *corev1.Probe, next func(ok bool, msg string, failures int) bool) bool {
	period := time.Duration(threshold(pr.PeriodSeconds, 10)) * time.Second
	delay := time.Duration(pr.InitialDelaySeconds) * time.Second
	if m := c.pod.r.opts.MaxProbePeriod; m > 0 {
		period, delay = min(period, m), min(delay, m)
	}
	timeout := time.Duration(threshold(pr.TimeoutSeconds, 1)) * time.Second
	if delay > 0 && !sleep(ctx, delay) {
		return false
	}
	failures, successes := 0, 0
	for {
		err := c.probeOnce(ctx, pr, timeout)
		if ctx.Err() != nil {
			return false
		}
		ok := err == nil
		msg := ""
		if ok {
			failures = 0
			successes++
			ok = successes >= threshold(pr.SuccessThreshold, 1)
		} else {
			successes = 0
			failures++
			msg = err.Error()
		}
		if !next(ok, msg, failures) {
			return true
		}
		if !sleep(ctx, period) {
			return false
		}
	}
}

// probeOnce runs one HTTP, TCP or gRPC probe against the pod's IP.
func (c *container) probeOnce(ctx context.Context, pr *corev1.Probe, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case pr.HTTPGet != nil:
		g := pr.HTTPGet
		port, err := c.port(g.Port)
		if err != nil {
			return err
		}
		host := g.Host
		if host == "" {
			host = podIP
		}
		scheme := "http"
		if g.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port))}
		ref, err := url.Parse(g.Path)
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.ResolveReference(ref).String(), nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "kube-probe/podrunner")
		for _, h := range g.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true} //nolint:gosec // the kubelet does not verify probe targets either
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return nil
	case pr.TCPSocket != nil:
		port, err := c.port(pr.TCPSocket.Port)
		if err != nil {
			return err
		}
		host := pr.TCPSocket.Host
		if host == "" {
			host = podIP
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case pr.GRPC != nil:
		conn, err := grpc.NewClient(net.JoinHostPort(podIP, strconv.Itoa(int(pr.GRPC.Port))), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		service := ""
		if pr.GRPC.Service != nil {
			service = *pr.GRPC.Service
		}
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			return err
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("gRPC probe: status %s", resp.GetStatus())
		}
		return nil
	}
	return fmt.Errorf("probe has no handler")
}

// port resolves a probe port, by number or by the container's port name.
func (c *container) port(p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.spec.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.spec.Name, p.StrVal)
}
