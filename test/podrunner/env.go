package podrunner

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// configError keeps a container from being created (the kubelet's
// CreateContainerConfigError): a missing Secret, ConfigMap or key, or
// something the runner does not support.
type configError struct{ error }

// serviceEnv is what the kubelet adds for the "kubernetes" Service.
func (r *Runner) serviceEnv() map[string]string {
	h, p := r.apiHost, r.apiPort
	return map[string]string{
		"KUBERNETES_SERVICE_HOST":       h,
		"KUBERNETES_SERVICE_PORT":       p,
		"KUBERNETES_SERVICE_PORT_HTTPS": p,
		"KUBERNETES_PORT":               "tcp://" + h + ":" + p,
		"KUBERNETES_PORT_443_TCP":       "tcp://" + h + ":" + p,
		"KUBERNETES_PORT_443_TCP_PROTO": "tcp",
		"KUBERNETES_PORT_443_TCP_PORT":  p,
		"KUBERNETES_PORT_443_TCP_ADDR":  h,
	}
}

// containerEnv is the container's environment like the kubelet makes it:
// envFrom, then env (values expanded against what came before and the
// service variables), then the service variables not already set.
func (p *Pod) containerEnv(ctx context.Context, c *corev1.Container) ([]corev1.EnvVar, error) {
	var out []corev1.EnvVar
	vals := map[string]string{}
	set := func(name, value string) {
		if _, ok := vals[name]; !ok {
			out = append(out, corev1.EnvVar{Name: name})
		}
		vals[name] = value
		for i := range out {
			if out[i].Name == name {
				out[i].Value = value
			}
		}
	}
	svc := p.r.serviceEnv()
	lookup := func(n string) (string, bool) {
		if v, ok := vals[n]; ok {
			return v, true
		}
		v, ok := svc[n]
		return v, ok
	}
	for _, from := range c.EnvFrom {
		data, err := p.envFromSource(ctx, from)
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			set(from.Prefix+k, data[k])
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, lookup))
			continue
		}
		v, ok, err := p.envValueFrom(ctx, c, e.ValueFrom)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	keys := make([]string, 0, len(svc))
	for k := range svc {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if _, ok := vals[k]; !ok {
			set(k, svc[k])
		}
	}
	return out, nil
}

func (p *Pod) envFromSource(ctx context.Context, from corev1.EnvFromSource) (map[string]string, error) {
	switch {
	case from.SecretRef != nil:
		s, err := p.r.client.CoreV1().Secrets(p.ns).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && from.SecretRef.Optional != nil && *from.SecretRef.Optional {
			return nil, nil
		}
		if err != nil {
			return nil, configError{fmt.Errorf("envFrom secret %q: %w", from.SecretRef.Name, err)}
		}
		data := map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
		return data, nil
	case from.ConfigMapRef != nil:
		cm, err := p.r.client.CoreV1().ConfigMaps(p.ns).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
			return nil, nil
		}
		if err != nil {
			return nil, configError{fmt.Errorf("envFrom configmap %q: %w", from.ConfigMapRef.Name, err)}
		}
		return cm.Data, nil
	}
	return nil, configError{fmt.Errorf("envFrom: unsupported source")}
}

// envValueFrom resolves one valueFrom; ok is false for a missing optional.
func (p *Pod) envValueFrom(ctx context.Context, c *corev1.Container, from *corev1.EnvVarSource) (string, bool, error) {
	switch {
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := p.r.client.CoreV1().Secrets(p.ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional {
			return "", false, nil
		}
		if err != nil {
			return "", false, configError{fmt.Errorf("secret %q: %w", ref.Name, err)}
		}
		v, ok := s.Data[ref.Key]
		if !ok && !optional {
			return "", false, configError{fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, p.ns, ref.Name)}
		}
		return string(v), ok, nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := p.r.client.CoreV1().ConfigMaps(p.ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional {
			return "", false, nil
		}
		if err != nil {
			return "", false, configError{fmt.Errorf("configmap %q: %w", ref.Name, err)}
		}
		v, ok := cm.Data[ref.Key]
		if !ok && !optional {
			return "", false, configError{fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, p.ns, ref.Name)}
		}
		return v, ok, nil
	case from.FieldRef != nil:
		v, err := p.fieldValue(from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		v, err := resourceValue(p.obj, c, from.ResourceFieldRef)
		return v, err == nil, err
	}
	return "", false, configError{fmt.Errorf("unsupported valueFrom")}
}

// fieldValue is a downward API field of the pod.
func (p *Pod) fieldValue(path string) (string, error) {
	pod := p.obj
	if key, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(key, "']")], nil
	}
	if key, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
		return pod.Annotations[strings.TrimSuffix(key, "']")], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.hostIP", "status.podIPs", "status.hostIPs":
		return podIP, nil
	}
	return "", configError{fmt.Errorf("unsupported fieldRef %q", path)}
}

// formatMap is the downward API's key="value" lines.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s=%q", k, m[k])
	}
	return b.String()
}

// resourceValue is a resourceFieldRef: the container's limit (the node's
// capacity, this machine's CPUs or 8Gi, when there is none) or request.
func resourceValue(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	if ref.ContainerName != "" {
		c = nil
		for _, cc := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
			if cc.Name == ref.ContainerName {
				c = &cc
				break
			}
		}
		if c == nil {
			return "", configError{fmt.Errorf("resourceFieldRef: no container %q", ref.ContainerName)}
		}
	}
	kind, res, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", configError{fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)}
	}
	var list corev1.ResourceList
	if kind == "limits" {
		list = c.Resources.Limits
	} else {
		list = c.Resources.Requests
	}
	q, ok := list[corev1.ResourceName(res)]
	if !ok {
		switch {
		case kind == "limits" && res == "cpu":
			q = *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI)
		case kind == "limits":
			q = resource.MustParse("8Gi")
		default:
			q = resource.MustParse("0")
		}
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	if res == "cpu" {
		return fmt.Sprint(int64(math.Ceil(float64(q.MilliValue()) / float64(div.MilliValue())))), nil
	}
	return fmt.Sprint(int64(math.Ceil(float64(q.Value()) / float64(div.Value())))), nil
}
