package release

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// RefusedError is a native CCM pod the post-renderer will not install: the
// chart, its values or the overrides asked for a host namespace, a privileged
// container or a host path the profile does not declare. Retrying cannot
// help; the NativeCCM stalls with the field named.
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

// checkPodSecurity refuses what a lifecycle-only CCM never needs: the host's
// PID or IPC namespace, the host network unless the profile declares it, host
// ports without it, privileged containers, privilege escalation, added
// capabilities and hostPath volumes. A CCM talks to its cloud's API and to
// the API server; nothing of the node is its business.
func (l Lifecycle) checkPodSecurity(spec *corev1.PodSpec) error {
	refuse := func(field, format string, args ...any) error {
		return &RefusedError{Field: "spec.template.spec." + field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case spec.HostPID:
		return refuse("hostPID", "a native CCM never shares the host's process namespace")
	case spec.HostIPC:
		return refuse("hostIPC", "a native CCM never shares the host's IPC namespace")
	case spec.HostNetwork && !l.HostNetwork:
		return refuse("hostNetwork", "the profile does not declare ccm.hostNetwork")
	}
	for i, v := range spec.Volumes {
		if v.HostPath != nil {
			return refuse(fmt.Sprintf("volumes[%d].hostPath", i), "volume %q mounts host path %q; a native CCM needs no host path", v.Name, v.HostPath.Path)
		}
	}
	check := func(kind string, cs []corev1.Container) error {
		for i, c := range cs {
			field := fmt.Sprintf("%s[%d]", kind, i)
			for j, p := range c.Ports {
				if p.HostPort != 0 && !l.HostNetwork {
					return refuse(fmt.Sprintf("%s.ports[%d].hostPort", field, j), "container %q asks for host port %d and the profile does not declare ccm.hostNetwork", c.Name, p.HostPort)
				}
			}
			sc := c.SecurityContext
			if sc == nil {
				continue
			}
			if sc.Privileged != nil && *sc.Privileged {
				return refuse(field+".securityContext.privileged", "container %q would run privileged", c.Name)
			}
			if sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation {
				return refuse(field+".securityContext.allowPrivilegeEscalation", "container %q would allow privilege escalation", c.Name)
			}
			if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
				return refuse(field+".securityContext.capabilities.add", "container %q would add capabilities %v", c.Name, sc.Capabilities.Add)
			}
			if sc.ProcMount != nil && *sc.ProcMount == corev1.UnmaskedProcMount {
				return refuse(field+".securityContext.procMount", "container %q would see an unmasked /proc", c.Name)
			}
		}
		return nil
	}
	if err := check("initContainers", spec.InitContainers); err != nil {
		return err
	}
	if err := check("containers", spec.Containers); err != nil {
		return err
	}
	for i, c := range spec.EphemeralContainers {
		if sc := c.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
			return refuse(fmt.Sprintf("ephemeralContainers[%d].securityContext.privileged", i), "container %q would run privileged", c.Name)
		}
	}
	return nil
}
