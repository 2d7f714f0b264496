package release

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// RefusedError is a native CCM pod the post-renderer will not install: the
// chart, its values or the overrides asked for a host namespace, a privileged
// container, a root user or a host path the profile does not declare.
// Retrying cannot help; the NativeCCM stalls with the field named.
type RefusedError struct {
	// Field is the path in the rendered pod template, e.g.
	// spec.template.spec.initContainers[0].securityContext.privileged.
	Field string
	// Reason says why it is refused.
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refused: %s: %s", e.Field, e.Reason)
}

// NonRootUID is the user a native CCM pod runs as when its chart names none
// (the ccm-gate sidecar's too): an unprivileged user no image needs to know.
const NonRootUID int64 = 65532

// checkPodSecurity refuses what a lifecycle-only CCM never needs: the host's
// PID or IPC namespace, the host network unless the profile declares it, host
// ports without it, privileged containers, privilege escalation, added
// capabilities, root users, an unmasked /proc, Windows host processes and
// hostPath volumes. A CCM talks to its cloud's API and to the API server;
// nothing of the node is its business. What the chart leaves unset,
// hardenPod then sets.
func (l Lifecycle) checkPodSecurity(spec *corev1.PodSpec) error {
	if p := unsafePod(spec, l.HostNetwork); len(p) > 0 {
		return p[0]
	}
	return nil
}

// PodSecurityProblems lists every field of a native CCM's pod spec that the
// ccm-coordinator chart's admission policy refuses in a workload the
// coordinator writes (hostNetwork and host ports unless hostNetwork, what a
// profile declares, is true), with Field paths under spec.template.spec:
// what checkPodSecurity refuses in a chart's output, and what hardenPod
// sets when the chart does not (a non-root user, no privilege escalation).
// hybridctl doctor reports them for the workloads of the coordinator's
// namespace.
func PodSecurityProblems(spec *corev1.PodSpec, hostNetwork bool) []*RefusedError {
	out := unsafePod(spec, hostNetwork)
	refuse := refuser(&out)
	podNonRoot := false
	if sc := spec.SecurityContext; sc != nil && sc.RunAsNonRoot != nil {
		podNonRoot = *sc.RunAsNonRoot
	}
	eachContainer(spec, func(field string, c *corev1.Container) {
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		if !ptr.Deref(sc.RunAsNonRoot, podNonRoot) {
			refuse(field+".securityContext.runAsNonRoot", "container %q may run as root: neither it nor the pod sets runAsNonRoot: true", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			refuse(field+".securityContext.allowPrivilegeEscalation", "container %q does not set allowPrivilegeEscalation: false", c.Name)
		}
	})
	return out
}

func refuser(out *[]*RefusedError) func(field, format string, args ...any) {
	return func(field, format string, args ...any) {
		*out = append(*out, &RefusedError{Field: "spec.template.spec." + field, Reason: fmt.Sprintf(format, args...)})
	}
}

// eachContainer calls f for the init containers and the containers of spec,
// with their field paths.
func eachContainer(spec *corev1.PodSpec, f func(field string, c *corev1.Container)) {
	for i := range spec.InitContainers {
		f(fmt.Sprintf("initContainers[%d]", i), &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		f(fmt.Sprintf("containers[%d]", i), &spec.Containers[i])
	}
}

// unsafePod lists what a native CCM pod may never ask for, whatever else
// it sets.
func unsafePod(spec *corev1.PodSpec, hostNetwork bool) []*RefusedError {
	var out []*RefusedError
	refuse := refuser(&out)
	if spec.HostPID {
		refuse("hostPID", "a native CCM never shares the host's process namespace")
	}
	if spec.HostIPC {
		refuse("hostIPC", "a native CCM never shares the host's IPC namespace")
	}
	if spec.HostNetwork && !hostNetwork {
		refuse("hostNetwork", "the profile does not declare ccm.hostNetwork")
	}
	for i, v := range spec.Volumes {
		if v.HostPath != nil {
			refuse(fmt.Sprintf("volumes[%d].hostPath", i), "volume %q mounts host path %q; a native CCM needs no host path", v.Name, v.HostPath.Path)
		}
	}
	if sc := spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			refuse("securityContext.runAsUser", "the pod would run as root (user 0)")
		}
		if sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
			refuse("securityContext.runAsNonRoot", "the pod says it may run as root")
		}
		if sc.WindowsOptions != nil && ptr.Deref(sc.WindowsOptions.HostProcess, false) {
			refuse("securityContext.windowsOptions.hostProcess", "the pod would run as a Windows host process")
		}
		if sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined {
			refuse("securityContext.seccompProfile.type", "the pod would run without seccomp (Unconfined)")
		}
	}
	check := func(field string, c *corev1.Container) {
		for j, p := range c.Ports {
			if p.HostPort != 0 && !hostNetwork {
				refuse(fmt.Sprintf("%s.ports[%d].hostPort", field, j), "container %q asks for host port %d and the profile does not declare ccm.hostNetwork", c.Name, p.HostPort)
			}
		}
		sc := c.SecurityContext
		if sc == nil {
			return
		}
		if ptr.Deref(sc.Privileged, false) {
			refuse(field+".securityContext.privileged", "container %q would run privileged", c.Name)
		}
		if ptr.Deref(sc.AllowPrivilegeEscalation, false) {
			refuse(field+".securityContext.allowPrivilegeEscalation", "container %q would allow privilege escalation", c.Name)
		}
		if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
			refuse(field+".securityContext.capabilities.add", "container %q would add capabilities %v", c.Name, sc.Capabilities.Add)
		}
		if sc.ProcMount != nil && *sc.ProcMount == corev1.UnmaskedProcMount {
			refuse(field+".securityContext.procMount", "container %q would see an unmasked /proc", c.Name)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			refuse(field+".securityContext.runAsUser", "container %q would run as root (user 0)", c.Name)
		}
		if sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
			refuse(field+".securityContext.runAsNonRoot", "container %q says it may run as root", c.Name)
		}
		if sc.WindowsOptions != nil && ptr.Deref(sc.WindowsOptions.HostProcess, false) {
			refuse(field+".securityContext.windowsOptions.hostProcess", "container %q would run as a Windows host process", c.Name)
		}
		if sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined {
			refuse(field+".securityContext.seccompProfile.type", "container %q would run without seccomp (Unconfined)", c.Name)
		}
	}
	eachContainer(spec, check)
	for i, c := range spec.EphemeralContainers {
		if sc := c.SecurityContext; sc != nil && ptr.Deref(sc.Privileged, false) {
			refuse(fmt.Sprintf("ephemeralContainers[%d].securityContext.privileged", i), "container %q would run privileged", c.Name)
		}
	}
	return out
}

// hardenPod makes a pod that passed checkPodSecurity comply with the Pod
// Security Standard "restricted" and with the coordinator's admission policy,
// whatever its chart left unset: a non-root user (NonRootUID unless the
// chart names one), the runtime's default seccomp profile, and in every
// container no privilege escalation and no capabilities. The gate sidecar
// (added later) sets the same for itself.
func hardenPod(spec *corev1.PodSpec) {
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	psc := spec.SecurityContext
	psc.RunAsNonRoot = ptr.To(true)
	if psc.RunAsUser == nil {
		psc.RunAsUser = ptr.To(NonRootUID)
	}
	if psc.SeccompProfile == nil {
		psc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	eachContainer(spec, func(_ string, c *corev1.Container) {
		if c.SecurityContext == nil {
			c.SecurityContext = &corev1.SecurityContext{}
		}
		sc := c.SecurityContext
		sc.AllowPrivilegeEscalation = ptr.To(false)
		if sc.Capabilities == nil {
			sc.Capabilities = &corev1.Capabilities{}
		}
		if !slices.Contains(sc.Capabilities.Drop, "ALL") {
			sc.Capabilities.Drop = append(sc.Capabilities.Drop, "ALL")
		}
	})
}
