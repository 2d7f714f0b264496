package podrunner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Where the kubelet mounts the automatic API access volume.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// apiAccessVolume is the projected volume the ServiceAccount admission plugin
// adds to a pod (envtest disables that plugin; the runner adds it instead).
func apiAccessVolume(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o644),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
			}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}},
			}}},
		},
	}}}
}

// file is one file of a volume: a path relative to the volume and its mode.
type file struct {
	path string
	data []byte
	mode int32
}

// prepareVolumes writes every volume of the pod under its directory and
// returns the host directory of each.
func (p *Pod) prepareVolumes(ctx context.Context) (map[string]string, error) {
	dirs := map[string]string{}
	for _, v := range p.obj.Spec.Volumes {
		dir := filepath.Join(p.dir, "volumes", v.Name)
		if v.HostPath != nil {
			dirs[v.Name] = v.HostPath.Path
			if t := v.HostPath.Type; t != nil && (*t == corev1.HostPathDirectoryOrCreate) {
				if err := os.MkdirAll(v.HostPath.Path, 0o755); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		dirs[v.Name] = dir
		if v.EmptyDir != nil {
			if err := os.Chmod(dir, 0o777|os.ModeSetgid); err != nil {
				return nil, err
			}
			if err := os.Lchown(dir, -1, p.fsGroup()); err != nil {
				return nil, err
			}
			continue
		}
		files, err := p.volumeFiles(ctx, v)
		if err != nil {
			return nil, fmt.Errorf("volume %q: %w", v.Name, err)
		}
		for _, f := range files {
			if err := writeFile(dir, f, p.fsGroup()); err != nil {
				return nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
		}
	}
	return dirs, nil
}

// fsGroup is the pod's securityContext.fsGroup, or -1.
func (p *Pod) fsGroup() int {
	if sc := p.obj.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		return int(*sc.FSGroup)
	}
	return -1
}

// writeFile writes one file of a volume; with an fsGroup the file belongs to
// that group and the group may read it, as the kubelet does.
func writeFile(dir string, f file, fsGroup int) error {
	if fsGroup >= 0 {
		f.mode |= 0o440
	}
	p := filepath.Join(dir, filepath.Clean("/"+f.path))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".podrunner-tmp"
	if err := os.WriteFile(tmp, f.data, os.FileMode(f.mode)); err != nil {
		return err
	}
	if err := os.Lchown(tmp, -1, fsGroup); err != nil {
		return err
	}
	if err := os.Chmod(tmp, os.FileMode(f.mode)); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// volumeFiles are the files of a Secret, ConfigMap, downwardAPI or projected
// volume.
func (p *Pod) volumeFiles(ctx context.Context, v corev1.Volume) ([]file, error) {
	switch {
	case v.Secret != nil:
		return p.secretFiles(ctx, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, mode(v.Secret.DefaultMode))
	case v.ConfigMap != nil:
		return p.configMapFiles(ctx, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, mode(v.ConfigMap.DefaultMode))
	case v.DownwardAPI != nil:
		return p.downwardFiles(v.DownwardAPI.Items, mode(v.DownwardAPI.DefaultMode))
	case v.Projected != nil:
		def := mode(v.Projected.DefaultMode)
		var out []file
		for _, s := range v.Projected.Sources {
			var fs []file
			var err error
			switch {
			case s.Secret != nil:
				fs, err = p.secretFiles(ctx, s.Secret.Name, s.Secret.Items, s.Secret.Optional, def)
			case s.ConfigMap != nil:
				fs, err = p.configMapFiles(ctx, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional, def)
			case s.DownwardAPI != nil:
				fs, err = p.downwardFiles(s.DownwardAPI.Items, def)
			case s.ServiceAccountToken != nil:
				var tok string
				tok, err = p.token(ctx, s.ServiceAccountToken)
				fs = []file{{path: s.ServiceAccountToken.Path, data: []byte(tok), mode: def}}
			default:
				err = fmt.Errorf("unsupported projected source (the pod runner supports secret, configMap, downwardAPI, serviceAccountToken)")
			}
			if err != nil {
				return nil, err
			}
			out = append(out, fs...)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported volume type (the pod runner supports secret, configMap, emptyDir, downwardAPI, projected, hostPath)")
}

func mode(m *int32) int32 {
	if m == nil {
		return 0o644
	}
	return *m
}

func itemFiles(data map[string][]byte, items []corev1.KeyToPath, def int32, what string) ([]file, error) {
	var out []file
	if len(items) == 0 {
		for k, v := range data {
			out = append(out, file{path: k, data: v, mode: def})
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		m := def
		if it.Mode != nil {
			m = *it.Mode
		}
		out = append(out, file{path: it.Path, data: v, mode: m})
	}
	return out, nil
}

func (p *Pod) secretFiles(ctx context.Context, name string, items []corev1.KeyToPath, optional *bool, def int32) ([]file, error) {
	s, err := p.r.client.CoreV1().Secrets(p.ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && optional != nil && *optional {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}
	return itemFiles(s.Data, items, def, "secret "+name)
}

func (p *Pod) configMapFiles(ctx context.Context, name string, items []corev1.KeyToPath, optional *bool, def int32) ([]file, error) {
	cm, err := p.r.client.CoreV1().ConfigMaps(p.ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && optional != nil && *optional {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("configmap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return itemFiles(data, items, def, "configmap "+name)
}

func (p *Pod) downwardFiles(items []corev1.DownwardAPIVolumeFile, def int32) ([]file, error) {
	var out []file
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = p.fieldValue(it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			v, err = resourceValue(p.obj, nil, it.ResourceFieldRef)
		}
		if err != nil {
			return nil, err
		}
		m := def
		if it.Mode != nil {
			m = *it.Mode
		}
		out = append(out, file{path: it.Path, data: []byte(v), mode: m})
	}
	return out, nil
}

// token asks the API server for a token of the pod's ServiceAccount bound to
// the Pod object, as the kubelet does.
func (p *Pod) token(ctx context.Context, src *corev1.ServiceAccountTokenProjection) (string, error) {
	sa := p.obj.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.obj.Name, UID: p.obj.UID},
	}}
	if src.Audience != "" {
		tr.Spec.Audiences = []string{src.Audience}
	}
	out, err := p.r.client.CoreV1().ServiceAccounts(p.ns).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for serviceaccount %s/%s: %w", p.ns, sa, err)
	}
	return out.Status.Token, nil
}

// containerMounts are the sandbox mounts of one container's volumeMounts.
func (p *Pod) containerMounts(c *corev1.Container, env map[string]string) ([]sandboxMount, error) {
	var out []sandboxMount
	for _, vm := range c.VolumeMounts {
		src, ok := p.volumes[vm.Name]
		if !ok {
			return nil, configError{fmt.Errorf("volumeMount %q: no such volume", vm.Name)}
		}
		vol := p.volume(vm.Name)
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			sub = expand(vm.SubPathExpr, func(n string) (string, bool) { v, ok := env[n]; return v, ok })
		}
		if sub != "" {
			if strings.Contains(sub, "..") || filepath.IsAbs(sub) {
				return nil, configError{fmt.Errorf("volumeMount %q: bad subPath %q", vm.Name, sub)}
			}
			src = filepath.Join(src, sub)
			if _, err := os.Stat(src); os.IsNotExist(err) {
				if err := os.MkdirAll(src, 0o777); err != nil {
					return nil, err
				}
			}
		}
		ro := vm.ReadOnly || vol.Secret != nil || vol.ConfigMap != nil || vol.DownwardAPI != nil || vol.Projected != nil
		out = append(out, sandboxMount{Source: src, Target: vm.MountPath, ReadOnly: ro})
	}
	return out, nil
}

func (p *Pod) volume(name string) corev1.Volume {
	for _, v := range p.obj.Spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	return corev1.Volume{}
}
