// Package chaos proves the gate with real upstream code: the unmodified
// cloud-node-lifecycle controller of k8s.io/cloud-provider, driven by a cloud
// that claims no instance exists, against a real API server with nodes of
// several platforms. Only its tests hold code; it must not be imported.
package chaos
