// Package podrunner runs the pods of Deployments that a real API server
// holds as local processes, the way a kubelet (and the deployment and replica
// set controllers) would, so that tests prove that what the charts and the
// coordinator render actually starts — with the image's binary, the flags,
// env, volumes, ServiceAccount token and RBAC it ships with.
//
// What it owns:
//   - resolving image references to an OCI image layout's linux/GOARCH image
//     (`make images`) or to a binary a test built (Images);
//   - per container: the image's file system unpacked into a root directory,
//     and a sandbox helper (this package's init, re-exec'ed through the
//     running binary) that enters a private mount namespace, bind-mounts the
//     pod's volumes, /proc, a few /dev nodes, /tmp, /etc/hosts and the
//     termination log, chroots, drops to the image's or the pod's user and
//     execs the program; each container has its own UTS namespace with the
//     pod's name as host name; the network is the host's (loopback);
//   - the kubelet's part: env (with $(VAR) expansion, valueFrom, envFrom and the
//     in-cluster KUBERNETES_SERVICE_* variables), volumes (Secret, ConfigMap,
//     emptyDir, downwardAPI, projected incl. bound ServiceAccount tokens from
//     TokenRequest, hostPath), init containers, native sidecars, restarts with
//     back-off, probes, termination messages, and the Pod's status;
//   - a look at what a container was given (Pod.View: its mounts' host
//     sources, env and user), for tests that ask what a process there could
//     read; there is no exec;
//   - the controllers' part: Pod objects, a ReplicaSet per template, rollouts,
//     Deployment and ReplicaSet status, the default ServiceAccount,
//     kube-root-ca.crt and the API access volume (the ServiceAccount admission
//     plugin is off in envtest).
//
// What it must not do: fake API behaviour (every object goes through the real
// API server and its validation), create Node objects (tests own the nodes),
// leave processes or mounts behind (Stop, registered with t.Cleanup by New,
// stops everything; mounts live only in the containers' namespaces), or
// pretend to support what it does not: exec probes, lifecycle hooks, resource
// limits, network/PID/user namespaces and image pulls are not there, and an
// unsupported volume or probe is an error in the container's status.
//
// It needs root (mount namespaces, chroot, setuid). A binary that starts pods
// must import this package (the sandbox helper is its init). `hybridctl demo`
// runs the native CCM pods with it, so it must not import testing (the test
// in cmd/hybridctl checks); New takes the few testing.TB methods it uses.
package podrunner
