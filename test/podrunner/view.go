package podrunner

import (
	"fmt"
	"slices"
)

// ContainerView is what one container's latest run was given: its
// environment and where each path it sees beyond its image comes from on the
// host. There is no exec into a container; tests read its files through
// Mounts (and the image's through Root) to learn what the process could read.
type ContainerView struct {
	// Root is the image's unpacked file system on the host.
	Root string
	// Mounts are the container's bind mounts, in order: volumes, the image's
	// binary, /tmp, /etc/hosts and the termination log.
	Mounts []Mount
	// Env is the process environment, NAME=value.
	Env []string
	// UID and GID the process runs as.
	UID, GID uint32
}

// Mount is one bind mount of a container.
type Mount struct {
	// Source on the host (a directory or a file), Target inside the container.
	Source, Target string
	ReadOnly       bool
}

// View returns what the named container's latest run was given; an error if
// the container does not exist or has not been started yet.
func (p *Pod) View(container string) (ContainerView, error) {
	for _, c := range p.all() {
		if c.spec.Name != container {
			continue
		}
		c.mu.Lock()
		spec := c.last
		c.mu.Unlock()
		if spec == nil {
			return ContainerView{}, fmt.Errorf("podrunner: pod %s/%s container %s has not run", p.ns, p.name, container)
		}
		v := ContainerView{Root: spec.Root, Env: slices.Clone(spec.Env), UID: spec.UID, GID: spec.GID}
		for _, m := range spec.Mounts {
			v.Mounts = append(v.Mounts, Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
		}
		return v, nil
	}
	return ContainerView{}, fmt.Errorf("podrunner: pod %s/%s has no container %s", p.ns, p.name, container)
}
