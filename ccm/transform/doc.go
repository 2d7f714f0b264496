// Package transform owns talos-ccm's node transformation rules: the
// configuration file (compatible with the upstream Talos CCM format), its
// validation, the evaluation of rules against a node's platform metadata into
// labels, annotations, taints, metadata overrides and feature flags, and the
// planning of enforce mode (keeping rule output reconciled on a node).
//
// It is pure: no I/O besides reading the file in Load, no Kubernetes or Talos
// clients. The facts source (ccm/facts) reads the metadata and ccm/cloud calls Apply;
// the cloud-node controller (ccm/cloudnode) writes the result and, in enforce
// mode, the change Plan computes. The reference is docs/transformations.md.
//
// Guarantees the callers rely on:
//
//   - Parse rejects every mistake it can see (unknown fields, keys and
//     operators, invalid regexps, templates, label/annotation/taint keys and
//     literal values, duplicate rule names), all at once, each *Error naming
//     the file, line, rule and field. It never panics on any input.
//   - Apply never panics and cannot run unbounded: templates may not loop
//     except once over .Tags, rendered values are capped at MaxValueBytes and
//     the node's metadata at MaxMetadataBytes. Template failures and rendered
//     values Kubernetes would reject are *Error naming the rule and the key.
//   - Keys are literal; only values are templates. So the keys a configuration
//     can produce are known up front (Result.Producible).
//
// Usage:
//
//	cfg, err := transform.Load("/etc/talos-ccm/config.yaml")
//	...
//	res, err := cfg.Apply(transform.Metadata{Platform: "hcloud", Hostname: "web-1"})
//	...
//	change := transform.Plan(node, res) // enforce mode
//	if !change.Empty() {
//		change.Apply(node) // then update the node
//	}
package transform
